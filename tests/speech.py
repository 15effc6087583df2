"""Real speech for tests: the clips in tests/data/speech and their reference transcripts."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import jiwer
import numpy as np
from whisper_normalizer.basic import BasicTextNormalizer
from whisper_normalizer.english import EnglishTextNormalizer

from whisper_engine.audio import decode_audio

SPEECH_DIR = Path(__file__).parent / "data" / "speech"
_english = EnglishTextNormalizer()
_basic = BasicTextNormalizer()


@dataclass(frozen=True)
class Clip:
    name: str
    reference: str

    @property
    def path(self) -> Path:
        return SPEECH_DIR / self.name

    def audio(self) -> np.ndarray:
        return load_audio(self.name)


@cache
def load_audio(name: str) -> np.ndarray:
    return decode_audio(SPEECH_DIR / name)


def clips() -> list[Clip]:
    with open(SPEECH_DIR / "transcripts.tsv", encoding="utf-8") as table:
        return [Clip(r["file"], r["reference"]) for r in csv.DictReader(table, delimiter="\t")]


def normalize(text: str) -> str:
    """Whisper's English normaliser: case, punctuation, spelling variants, numbers."""
    return _english(text)


def normalize_basic(text: str) -> str:
    return _basic(text)


def wer(reference: str | list[str], hypothesis: str | list[str]) -> float:
    if isinstance(reference, str):
        return float(jiwer.wer(normalize(reference), normalize(hypothesis)))
    return float(jiwer.wer([normalize(r) for r in reference], [normalize(h) for h in hypothesis]))
