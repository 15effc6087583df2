"""The backend seam: the only thing a model library has to provide.

Everything Whisper-specific that is not the neural network (prompts, timestamp parsing,
segments, fallback, long-form, word alignment) lives above this seam and is shared by every
backend. A backend only answers: for these <= 30 s windows of 16 kHz audio and these decoder
prompts, with these sampling settings and token rules, which tokens come next and with what
log-probabilities.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

SAMPLE_RATE = 16_000
WINDOW_SECONDS = 30
WINDOW_SAMPLES = SAMPLE_RATE * WINDOW_SECONDS


@dataclass(frozen=True)
class TokenRules:
    """Whisper's logit rules, by token id. Built above the seam; each backend enforces them.

    - ``suppress_ids`` can never be sampled;
    - ``begin_suppress_ids`` cannot be the first sampled token (a blank, or end of text);
    - in timestamp mode, timestamps come in pairs, never go backwards, the first one is at
      most ``max_initial_timestamp_index`` steps, and a timestamp is forced when the total
      probability of timestamps beats every text token (openai-whisper's ApplyTimestampRules).
    """

    eot: int
    sot: int
    no_speech: int
    no_timestamps: int
    timestamp_begin: int
    suppress_ids: tuple[int, ...]
    begin_suppress_ids: tuple[int, ...]
    max_initial_timestamp_index: int = 50


@dataclass(frozen=True)
class WindowRequest:
    audio: np.ndarray  # float32 mono 16 kHz, at most WINDOW_SAMPLES long
    prompt_ids: tuple[int, ...]  # the whole decoder prompt, ending where generation starts
    temperature: float  # 0: greedy; > 0: sample
    max_new_tokens: int
    timestamps: bool  # apply the timestamp rules (the prompt has no <|notimestamps|>)
    rules: TokenRules
    seed: int | None = None  # for sampling: the same seed gives the same tokens


@dataclass(frozen=True)
class WindowOutput:
    token_ids: tuple[int, ...]  # generated tokens, without the prompt and the final eot
    logprobs: tuple[float, ...]  # log-probability of each of token_ids, after the rules
    sum_logprob: float  # of token_ids plus the final eot when there was one
    finished: bool  # ended with eot (False: stopped at max_new_tokens)
    no_speech_prob: float  # P(<|nospeech|>) right after <|startoftranscript|>


@dataclass(frozen=True)
class AlignmentRequest:
    audio: np.ndarray
    token_ids: tuple[int, ...]  # the prompt, then text and timestamp tokens, then eot


@runtime_checkable
class Backend(Protocol):
    """A loaded Whisper model that decodes batches of windows.

    Optional attribute: ``supports_previous_text`` (default True), False when prompts may not
    start with ``<|startofprev|>``; callers then refuse a previous-text prompt up front.
    """

    name: str
    device: str
    max_target_positions: int  # the decoder's context (448)

    def generate(self, requests: Sequence[WindowRequest]) -> list[WindowOutput]:
        """Decode every request; batch them as the hardware likes. Order is preserved."""
        ...

    def next_token_logprobs(
        self, audios: Sequence[np.ndarray], prompt_ids: tuple[int, ...], candidates: Sequence[int]
    ) -> np.ndarray:
        """Log-probabilities over ``candidates`` (renormalised among them) of the token after
        ``prompt_ids``, one row per audio: language detection asks this after
        <|startoftranscript|> with the language tokens as candidates."""
        ...

    def alignment_weights(self, requests: Sequence[AlignmentRequest]) -> list[np.ndarray] | None:
        """Cross-attention of the model's alignment heads, teacher-forced over
        ``token_ids``: one ``[heads, len(token_ids), 1500]`` array per request, or None when
        the backend cannot give them."""
        ...

    def close(self) -> None:
        """Release the model and its device memory."""
        ...
