"""Typed, immutable results of a transcription."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Word:
    word: str
    start: float
    end: float
    probability: float


@dataclass(frozen=True)
class Segment:
    """One stretch of text with absolute times in seconds, as Whisper's verbose output has it."""

    id: int
    seek: int  # the window's start, in 10 ms mel frames (Whisper's unit)
    start: float
    end: float
    text: str
    tokens: tuple[int, ...]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: tuple[Word, ...] = ()


@dataclass(frozen=True)
class TokenLogprob:
    token: str
    logprob: float
    bytes: tuple[int, ...]


@dataclass(frozen=True)
class Transcription:
    text: str
    language: str  # Whisper language code
    language_probability: float | None  # None when the caller named the language
    duration: float  # seconds of input audio
    task: str
    segments: tuple[Segment, ...]
    logprobs: tuple[TokenLogprob, ...] = field(default=())

    @property
    def words(self) -> tuple[Word, ...]:
        return tuple(w for s in self.segments for w in s.words)
