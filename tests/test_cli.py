"""``python -m whisper_engine transcribe`` run as a user runs it: a subprocess, real speech, the
embedded model. Each run that transcribes loads the model, so each is shared by the tests of
the facets it shows (module-scoped fixtures)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile
import srt
import webvtt
from whisper_normalizer.english import EnglishTextNormalizer

SPEECH = Path(__file__).parent / "data" / "speech"
JFK_PHRASE = "ask not what your country can do for you"
SEGMENT_FIELDS = {
    "id": int,
    "seek": int,
    "start": float,
    "end": float,
    "text": str,
    "tokens": list,
    "temperature": float,
    "avg_logprob": float,
    "compression_ratio": float,
    "no_speech_prob": float,
}
normalize = EnglishTextNormalizer()


@dataclass(frozen=True)
class Run:
    returncode: int
    stdout: str
    stderr: str

    def error_lines(self) -> list[str]:
        # splitlines also splits at the carriage returns a progress bar writes
        return [line for line in self.stderr.splitlines() if "error:" in line]


def transcribe(*args: str | Path) -> Run:
    done = subprocess.run(
        [sys.executable, "-m", "whisper_engine", "transcribe", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return Run(done.returncode, done.stdout, done.stderr)


def sections(stdout: str) -> dict[str, str]:
    """The outputs of several files, by the name in each ``==> FILE <==`` header."""
    parts = re.split(r"^==> (.+) <==\n", stdout, flags=re.MULTILINE)
    assert parts[0] == "", "output must start with a header"
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def write_mp3(samples: np.ndarray, path: Path) -> Path:
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mp3", rate=16_000, layout="mono")
        frame = av.AudioFrame.from_ndarray(samples[None, :], format="flt", layout="mono")
        frame.sample_rate = 16_000
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    return path


@pytest.fixture(scope="module")
def long_jfk_mp3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """jfk.wav and 21 s of silence as an mp3: 32 s, two windows."""
    speech, rate = soundfile.read(SPEECH / "jfk.wav", dtype="float32")
    assert rate == 16_000
    samples = np.concatenate([speech, np.zeros(21 * rate, np.float32)])
    return write_mp3(samples, tmp_path_factory.mktemp("audio") / "jfk_long.mp3")


@pytest.fixture(scope="module")
def garbage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("audio") / "garbage.mp3"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 5000, np.uint8).tobytes())
    return path


# --- several files as text, one of them long, one of them not audio --------------------------


@pytest.fixture(scope="module")
def text_run(long_jfk_mp3: Path, garbage: Path) -> Run:
    return transcribe(long_jfk_mp3, garbage, SPEECH / "jfk.wav")


def test_text_of_each_good_file_under_its_header(
    text_run: Run, long_jfk_mp3: Path, garbage: Path
) -> None:
    outputs = sections(text_run.stdout)
    assert list(outputs) == [str(long_jfk_mp3), str(SPEECH / "jfk.wav")]
    for text in outputs.values():
        assert JFK_PHRASE in normalize(text)


def test_bad_file_among_good_ones_is_one_error_line_and_a_failing_status(
    text_run: Run, garbage: Path
) -> None:
    assert text_run.returncode == 1
    assert len(text_run.error_lines()) == 1
    assert str(garbage) in text_run.error_lines()[0]
    assert "Traceback" not in text_run.stderr


def test_progress_bar_for_the_long_file_only(text_run: Run) -> None:
    assert "jfk_long.mp3: 100%|" in text_run.stderr
    assert "jfk.wav" not in text_run.stderr


# --- translation as verbose_json with words, two files: JSON Lines --------------------------


@pytest.fixture(scope="module")
def translated() -> list[dict]:
    """Spanish synthetic speech and English speech, translated: one document per line."""
    run = transcribe(
        SPEECH / "espeak-es.wav",
        SPEECH / "jfk.wav",
        "--task",
        "translate",
        "--format",
        "verbose_json",
        "--word-timestamps",
    )
    assert run.returncode == 0, run.stderr
    documents = [json.loads(line) for line in run.stdout.splitlines()]
    assert len(documents) == 2
    return documents


def test_translate_gives_english(translated: list[dict]) -> None:
    spanish = translated[0]
    assert spanish["task"] == "translate"
    assert spanish["language"] == "spanish"
    assert {"music", "coffee"} & set(normalize(spanish["text"]).split()), spanish["text"]
    assert "música" not in spanish["text"].lower()


def test_verbose_json_fields_are_typed_and_real(translated: list[dict]) -> None:
    verbose = translated[1]
    assert verbose["task"] == "translate"
    assert verbose["language"] == "english"
    assert isinstance(verbose["duration"], float)
    assert verbose["duration"] == pytest.approx(11.0, abs=0.05)
    assert JFK_PHRASE in normalize(verbose["text"])
    assert verbose["segments"]
    for segment in verbose["segments"]:
        for field, kind in SEGMENT_FIELDS.items():
            assert isinstance(segment[field], kind), field
        assert 0 <= segment["start"] <= segment["end"] <= verbose["duration"] + 0.5
        assert segment["tokens"] and all(isinstance(t, int) for t in segment["tokens"])
        assert segment["avg_logprob"] < 0
        assert segment["compression_ratio"] > 0
        assert 0 <= segment["no_speech_prob"] <= 1
    assert [s["id"] for s in verbose["segments"]] == list(range(len(verbose["segments"])))
    assert "".join(s["text"] for s in verbose["segments"]).strip() == verbose["text"]
    assert verbose["usage"] == {"type": "duration", "seconds": 11}


def test_word_timestamps_increase_and_spell_the_text(translated: list[dict]) -> None:
    verbose = translated[1]
    words = verbose["words"]
    assert len(words) >= 20
    assert JFK_PHRASE in normalize("".join(w["word"] for w in words))
    starts = [w["start"] for w in words]
    assert starts == sorted(starts)
    assert starts[-1] > starts[0] + 5  # spread over the speech, not piled up at one time
    for word in words:
        assert 0 <= word["start"] <= word["end"] <= verbose["duration"] + 0.5


# --- subtitles ------------------------------------------------------------------------------


def test_srt_parses_with_real_cues() -> None:
    run = transcribe(SPEECH / "librivox-0930.wav", "--format", "srt", "--language", "en")
    assert run.returncode == 0, run.stderr
    cues = list(srt.parse(run.stdout))
    assert cues
    assert [c.index for c in cues] == list(range(1, len(cues) + 1))
    assert all(c.start < c.end for c in cues)
    assert 1 < cues[-1].end.total_seconds() < 4
    assert "amiable himself" in normalize(" ".join(c.content for c in cues))


def test_vtt_parses_with_real_cues() -> None:
    run = transcribe(SPEECH / "librivox-0880.wav", "--format", "vtt", "--language", "en")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("WEBVTT\n")
    captions = webvtt.from_string(run.stdout).captions
    assert captions
    assert all(c.start_in_seconds <= c.end_in_seconds < 4 for c in captions)
    assert captions[-1].end_in_seconds > 1
    assert "ill disposed young man" in normalize(" ".join(c.text for c in captions))


# --- bad input: one line, no traceback, no model needed --------------------------------------


def assert_one_error_line(run: Run, status: int, *mentions: str) -> None:
    assert run.returncode == status
    assert run.stdout == ""
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.stderr
    for mention in mentions:
        assert mention in lines[0]
    assert "Traceback" not in run.stderr


def test_undecodable_file(garbage: Path) -> None:
    assert_one_error_line(transcribe(garbage), 1, str(garbage), "Invalid file format")


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.wav"
    assert_one_error_line(transcribe(missing), 1, str(missing), "cannot be read")


def test_unknown_language() -> None:
    run = transcribe(SPEECH / "jfk.wav", "--language", "xx")
    assert_one_error_line(run, 2, "--language", "'xx'")


@pytest.mark.parametrize(
    ("option", "value", "mention"),
    [
        ("--format", "xml", "--format"),
        ("--task", "summarize", "--task"),
        ("--temperature", "1.5", "--temperature"),
        ("--temperature", "warm", "--temperature"),
        ("--backend", "onnx", "--backend"),
    ],
)
def test_bad_option(option: str, value: str, mention: str) -> None:
    assert_one_error_line(transcribe(SPEECH / "jfk.wav", option, value), 2, mention, value)


def test_no_file_is_a_usage_error() -> None:
    assert_one_error_line(transcribe(), 2, "FILE")


def test_model_that_cannot_load(tmp_path: Path) -> None:
    run = transcribe(SPEECH / "jfk.wav", "--model", tmp_path / "no-model")
    assert_one_error_line(run, 1, "cannot load model", "no-model")


def test_help_documents_the_output_of_several_files() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "whisper_engine", "transcribe", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "==> FILE <==" in done.stdout
    assert "JSON Lines" in done.stdout
