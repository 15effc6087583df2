"""Long audio -> windows of at most 30 s, cut at the quietest moment near each window's end.

Cutting blindly every 30 s splits words, and a window that starts mid-word decodes badly;
cutting where the signal is quietest (a pause between words or sentences) keeps words whole.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from whisper_engine.backends.base import SAMPLE_RATE, WINDOW_SAMPLES

FRAME = SAMPLE_RATE // 50  # 20 ms energy frames
SMOOTHING_FRAMES = 5  # a quiet moment must last ~100 ms, not one lucky frame
SEARCH_SECONDS = 10.0  # the cut is looked for in the last 10 s of a full window


@dataclass(frozen=True)
class Window:
    start: int  # first sample
    end: int  # one past the last sample

    @property
    def start_seconds(self) -> float:
        return self.start / SAMPLE_RATE

    @property
    def seconds(self) -> float:
        return (self.end - self.start) / SAMPLE_RATE


def plan_windows(
    audio: np.ndarray, max_samples: int = WINDOW_SAMPLES, energy: np.ndarray | None = None
) -> list[Window]:
    """Consecutive windows covering the whole audio, each at most ``max_samples`` long.
    ``energy``: the audio's smoothed frame energy, when the caller has it already."""
    total = len(audio)
    if total == 0:
        return []
    if energy is None:
        energy = _smoothed_frame_energy(audio)
    search = int(SEARCH_SECONDS * SAMPLE_RATE)
    windows = []
    start = 0
    while total - start > max_samples:
        end = _quietest_cut(energy, start + max_samples - search, start + max_samples)
        windows.append(Window(start, end))
        start = end
    windows.append(Window(start, total))
    return windows


def _smoothed_frame_energy(audio: np.ndarray) -> np.ndarray:
    frames = len(audio) // FRAME
    power = np.square(audio[: frames * FRAME].astype(np.float64)).reshape(frames, FRAME).mean(1)
    kernel = np.ones(SMOOTHING_FRAMES) / SMOOTHING_FRAMES
    return np.convolve(power, kernel, mode="same")


def _quietest_cut(energy: np.ndarray, lo: int, hi: int) -> int:
    """A sample index in [lo, hi] at the centre of the quietest frame; the latest on ties."""
    first, last = lo // FRAME + 1, hi // FRAME - 1
    if last <= first:
        return hi
    region = energy[first:last]
    quietest = len(region) - 1 - int(np.argmin(region[::-1]))
    return min((first + quietest) * FRAME + FRAME // 2, hi)


# A stretch whose loudest 100 ms is 30 dB below the recording's loud parts holds no speech.
SILENCE_RATIO = 1e-3


@dataclass(frozen=True)
class SpeechMap:
    """Where the recording is loud enough to hold speech, by 20 ms frame."""

    energy: np.ndarray
    loud: float  # the power of the recording's loud frames (99th percentile)

    @classmethod
    def of(cls, audio: np.ndarray) -> SpeechMap:
        energy = _smoothed_frame_energy(audio)
        loud = float(np.percentile(energy, 99)) if len(energy) else 0.0
        return cls(energy, loud)

    def _loud_frames(self, start: int, end: int) -> np.ndarray:
        region = self.energy[start // FRAME : max(start // FRAME + 1, end // FRAME)]
        return region > self.loud * SILENCE_RATIO if self.loud > 0 else region[:0] > 0

    def has_speech(self, start: int, end: int) -> bool:
        return bool(self._loud_frames(start, end).any())

    def speech_seconds(self, start: int, end: int) -> float:
        """How long, in [start, end), the recording is loud enough to hold speech."""
        if end <= start:
            return 0.0
        return float(self._loud_frames(start, end).sum()) * FRAME / SAMPLE_RATE
