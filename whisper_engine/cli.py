"""The command line: ``python -m whisper_engine transcribe FILE [FILE ...]``.

Transcripts go to stdout, a progress bar for long files to stderr. Bad input ends in one line
on stderr and a non-zero exit status, never a traceback: the caller can act on the line.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn, TextIO

import numpy as np
from huggingface_hub.utils import disable_progress_bars
from tqdm import tqdm

from whisper_engine.audio import SUPPORTED_FORMATS, decode_audio
from whisper_engine.backends.base import SAMPLE_RATE
from whisper_engine.checkpoints import resolve_checkpoint
from whisper_engine.errors import InvalidOption, WhisperEngineError
from whisper_engine.model import BACKENDS, WhisperModel, load_model
from whisper_engine.options import TASKS, TranscribeOptions
from whisper_engine.output_formats import FORMATS, JSON_FORMATS, render
from whisper_engine.results import Transcription
from whisper_engine.transcribe import Transcriber

NAME = "whisper_engine"
PROG = f"python -m {NAME}"
STDIN = "-"
WINDOW_SECONDS = 30.0  # files longer than one window get a progress bar
PROGRESS_BAR = "{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s [{elapsed}<{remaining}]"

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

TRANSCRIBE_EPILOG = f"""\
output:
  text, srt and vtt: with several files, each file's output follows a '==> FILE <==' header
  (as tail prints them). json and verbose_json: one JSON document per line (JSON Lines), in
  the order of the files; each document has OpenAI's shape. A file that fails prints no
  output: its error is one line on stderr naming it, and the other files are still done.
  Files longer than 30 s show a progress bar on stderr.

input:
  {", ".join(SUPPORTED_FORMATS)}, detected from the bytes;
  '-' reads standard input.

exit status:
  0 all files transcribed; 1 a file could not be read or transcribed, or the model could
  not be loaded; 2 a bad option; 130 interrupted.
"""


class UsageError(Exception):
    """A command line argparse rejected; its message is one line."""


class OneLineArgumentParser(argparse.ArgumentParser):
    """Reports a bad command line as one line, not argparse's usage block."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(prog=PROG, description="Whisper speech-to-text.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    transcribe = commands.add_parser(
        "transcribe",
        help="transcribe or translate audio files",
        description="Transcribe (or translate to English) audio files; output on stdout.",
        epilog=TRANSCRIBE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    transcribe.add_argument("files", nargs="+", metavar="FILE", help="audio files ('-': stdin)")
    transcribe.add_argument(
        "--model", help="hub id, local model directory, or whisper-base (default: embedded)"
    )
    transcribe.add_argument("--backend", choices=BACKENDS, default="auto")
    transcribe.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: best available)")
    transcribe.add_argument("--language", help="code or English name (default: detect)")
    transcribe.add_argument("--task", choices=TASKS, default="transcribe")
    transcribe.add_argument("--format", choices=FORMATS, default="text", dest="output_format")
    transcribe.add_argument(
        "--word-timestamps", action="store_true", help="word times (verbose_json 'words')"
    )
    transcribe.add_argument("--prompt", help="previous text or spelling hints")
    transcribe.add_argument(
        "--temperature", type=float, default=0.0, help="0 to 1; 0: greedy with fallback"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        options = transcribe_options(args)
    except UsageError as exc:
        return report(str(exc), EXIT_USAGE)
    try:
        return run_transcribe(args, options)
    except KeyboardInterrupt:
        return report("interrupted", EXIT_INTERRUPTED)
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly, and keep Python's exit-time
        # flush of stdout from failing again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED


def transcribe_options(args: argparse.Namespace) -> TranscribeOptions:
    try:
        return TranscribeOptions(
            language=args.language,
            task=args.task,
            prompt=args.prompt,
            temperature=args.temperature,
            word_timestamps=args.word_timestamps,
        )
    except InvalidOption as exc:
        message = str(exc)
        value = getattr(args, exc.param, None)
        if value is not None and str(value) not in message:
            message += f", got {value!r}"
        raise UsageError(f"--{exc.param.replace('_', '-')}: {message}") from exc


class ModelOnDemand:
    """Loads the model once, when the first file has decoded: a run whose files are all bad
    fails fast, without the seconds a model takes to load."""

    def __init__(self, args: argparse.Namespace) -> None:
        self._args = args
        self._model: WhisperModel | None = None
        self._transcriber: Transcriber | None = None

    def transcriber(self) -> Transcriber:
        if self._transcriber is None:
            self._model = self._load()
            self._transcriber = self._model.transcriber()
        return self._transcriber

    def _load(self) -> WhisperModel:
        args = self._args
        try:
            # A hub download keeps its progress bars; loading the weights into the backend
            # prints none, so that stderr carries only this program's own progress and errors.
            checkpoint = resolve_checkpoint(args.model)
            with disable_progress_bars():
                return load_model(str(checkpoint), backend=args.backend, device=args.device)
        except Exception as exc:  # any cause (checkpoint, device, library) is a load failure
            raise ModelUnavailable(
                f"cannot load model {args.model or 'whisper-base'!r}: {_reason(exc)}"
            ) from exc

    def close(self) -> None:
        if self._model is not None:
            self._model.close()


class ModelUnavailable(Exception):
    """The model could not be loaded; nothing can be transcribed."""


def run_transcribe(args: argparse.Namespace, options: TranscribeOptions) -> int:
    model = ModelOnDemand(args)
    output = OutputStream(sys.stdout, args.output_format, several=len(args.files) > 1)
    status = EXIT_OK
    try:
        for path in args.files:
            try:
                audio = decode_audio(sys.stdin.buffer if path == STDIN else path)
                transcription = transcribe_file(model.transcriber(), audio, options, path)
            except WhisperEngineError as exc:
                status = report(f"{path}: {_reason(exc)}", EXIT_FAILED)
                continue
            output.write(path, transcription, words=options.word_timestamps)
    except ModelUnavailable as exc:
        return report(str(exc), EXIT_FAILED)
    finally:
        model.close()
    return status


def transcribe_file(
    transcriber: Transcriber, audio: np.ndarray, options: TranscribeOptions, path: str
) -> Transcription:
    """One file's transcription, with a progress bar on stderr when it spans several windows."""
    seconds = len(audio) / SAMPLE_RATE
    if seconds <= WINDOW_SECONDS:
        return transcriber.transcribe(audio, options)
    total = round(seconds, 1)
    with tqdm(
        total=total,
        desc=os.path.basename(path),
        unit="s",
        bar_format=PROGRESS_BAR,
        file=sys.stderr,
        leave=False,
    ) as bar:

        def advance(seconds_done: float) -> None:
            bar.update(min(seconds_done, total) - bar.n)

        return transcriber.transcribe(audio, options, progress=advance)


class OutputStream:
    """Each file's document on stdout: under a ``==> FILE <==`` header when several files
    print text, srt or vtt; one document per line for the JSON formats (JSON Lines)."""

    def __init__(self, stream: TextIO, output_format: str, *, several: bool) -> None:
        self._stream = stream
        self._format = output_format
        self._headers = several and output_format not in JSON_FORMATS
        self._written = 0

    def write(self, path: str, transcription: Transcription, *, words: bool) -> None:
        document = render(transcription, self._format, words=words)
        if not document.endswith("\n"):
            document += "\n"
        if self._headers:
            name = "standard input" if path == STDIN else path
            separator = "\n" if self._written else ""
            document = f"{separator}==> {name} <==\n{document}"
        self._stream.write(document)
        self._stream.flush()
        self._written += 1


def report(message: str, status: int) -> int:
    """One line on stderr; returns ``status`` for the caller to exit with."""
    print(f"{NAME}: error: {message}", file=sys.stderr, flush=True)
    return status


def _reason(exc: BaseException) -> str:
    """The exception's message on one line (library messages may span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__
