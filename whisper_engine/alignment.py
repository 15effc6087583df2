"""Word timestamps: dynamic time warping over the alignment heads' cross-attention.

openai-whisper's method: certain decoder heads attend to the audio frame being spoken; the
monotonic path through their (normalised, smoothed) attention maps each text token to a
time. Pure numpy; a backend only supplies the attention weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TOKENS_PER_SECOND = 50  # encoder frames per second (20 ms each)
MEDIAN_FILTER_WIDTH = 7
PREPEND_PUNCTUATION = "\"'“¿([{-"
APPEND_PUNCTUATION = "\"'.。,，!！?？:：”)]}、"


@dataclass(frozen=True)
class TimedWord:
    word: str
    tokens: tuple[int, ...]
    start: float  # seconds from the window's start
    end: float
    probability: float


def dtw_path(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest monotonic path from (0, 0) to the far corner, moving right, down or both.

    Each row is filled at once: the within-row recurrence
    ``acc[j] = min(from_above[j], acc[j-1] + cost[j])`` is a running minimum over prefix sums.
    """
    rows, cols = cost.shape
    acc = np.full((rows + 1, cols + 1), np.inf)
    acc[0, 0] = 0.0
    from_left = np.zeros((rows + 1, cols + 1), dtype=bool)
    diagonal = np.zeros((rows + 1, cols + 1), dtype=bool)
    for i in range(1, rows + 1):
        diag, up = acc[i - 1, :-1], acc[i - 1, 1:]
        above = np.minimum(diag, up) + cost[i - 1]
        prefix = np.concatenate(([0.0], np.cumsum(cost[i - 1])))
        best = np.minimum.accumulate(above - prefix[1:]) + prefix[1:]
        acc[i, 1:] = best
        from_left[i, 1:] = best < above
        diagonal[i, 1:] = diag <= up
    return _backtrace(from_left, diagonal)


def _backtrace(from_left: np.ndarray, diagonal: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    i, j = from_left.shape[0] - 1, from_left.shape[1] - 1
    path = []
    while i > 0 and j > 0:
        path.append((i - 1, j - 1))
        if from_left[i, j]:
            j -= 1
        elif diagonal[i, j]:
            i, j = i - 1, j - 1
        else:
            i -= 1
    path.reverse()
    text_indices, time_indices = zip(*path, strict=True) if path else ((), ())
    return np.array(text_indices), np.array(time_indices)


def _median_filter(x: np.ndarray, width: int) -> np.ndarray:
    pad = width // 2
    if x.shape[-1] <= pad:
        return x
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad, pad)], mode="reflect")
    windows = np.lib.stride_tricks.sliding_window_view(padded, width, axis=-1)
    return np.median(windows, axis=-1)


def align_words(
    weights: np.ndarray,
    prompt_length: int,
    text_tokens: list[int],
    text_probs: list[float],
    words: list[str],
    word_tokens: list[list[int]],
    audio_frames: int,
) -> list[TimedWord]:
    """Time each word of ``words`` (groups of ``text_tokens``) in one window.

    ``weights`` is [heads, prompt + text + 1 (eot), 1500] cross-attention; ``audio_frames``
    the window's length in 20 ms frames.
    """
    if not text_tokens:
        return []
    frames = max(1, min(audio_frames, weights.shape[-1]))
    w = weights[:, :, :frames]
    w = (w - w.mean(axis=-2, keepdims=True)) / (w.std(axis=-2, keepdims=True) + 1e-8)
    w = _median_filter(w, MEDIAN_FILTER_WIDTH)
    matrix = w.mean(axis=0)[prompt_length : prompt_length + len(text_tokens) + 1]
    text_indices, time_indices = dtw_path(-matrix)
    jumps = np.pad(np.diff(text_indices), (1, 0), constant_values=1).astype(bool)
    jump_times = time_indices[jumps] / TOKENS_PER_SECOND
    boundaries = np.pad(np.cumsum([len(t) for t in word_tokens]), (1, 0))
    timed = []
    for index, (word, tokens) in enumerate(zip(words, word_tokens, strict=True)):
        lo, hi = boundaries[index], boundaries[index + 1]
        start = float(jump_times[min(lo, len(jump_times) - 1)])
        end = float(jump_times[min(hi, len(jump_times) - 1)])
        probability = float(np.mean(text_probs[lo:hi])) if hi > lo else 0.0
        timed.append(TimedWord(word, tuple(tokens), start, max(end, start), probability))
    return _trim_leading_silence(_merge_punctuation(timed))


def _trim_leading_silence(words: list[TimedWord]) -> list[TimedWord]:
    """The path starts at frame 0, so a window that opens with silence stretches its first
    word over it. As openai-whisper does, cap the first word at twice the median word length
    (at most 1.4 s) by moving its start."""
    durations = [w.end - w.start for w in words if w.end > w.start]
    if not durations:
        return words
    longest = 2 * min(0.7, float(np.median(durations)))
    first = words[0]
    if first.end - first.start <= longest:
        return words
    trimmed = TimedWord(first.word, first.tokens, first.end - longest, first.end, first.probability)
    return [trimmed, *words[1:]]


def _merge_punctuation(words: list[TimedWord]) -> list[TimedWord]:
    """Attach leading punctuation to the next word and trailing punctuation to the previous."""
    merged: list[TimedWord] = []
    carry: TimedWord | None = None
    for word in words:
        stripped = word.word.strip()
        if carry is not None:
            word = _join(carry, word, keep_times_of=word)
            carry = None
        if stripped and stripped in APPEND_PUNCTUATION and merged:
            merged[-1] = _join(merged[-1], word, keep_times_of=merged[-1])
        elif stripped and all(c in PREPEND_PUNCTUATION for c in stripped):
            carry = word
        else:
            merged.append(word)
    if carry is not None:
        merged.append(carry)
    return merged


def _join(first: TimedWord, second: TimedWord, keep_times_of: TimedWord) -> TimedWord:
    return TimedWord(
        word=first.word + second.word,
        tokens=first.tokens + second.tokens,
        start=keep_times_of.start,
        end=keep_times_of.end,
        probability=keep_times_of.probability,
    )
