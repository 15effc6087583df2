"""Stand-in of ``tensorrt_llm.executor.result`` (test package, not NVIDIA's library)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, NamedTuple


class Logprob(NamedTuple):
    """Log-probability of one token, and its rank among all tokens (1 = most likely)."""

    logprob: float
    rank: int | None = None


# One dict per generated token: token id -> Logprob (the top-k, plus the sampled token).
TokenLogprobs = list[dict[int, Logprob]]


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None
    logprobs: TokenLogprobs | list[float] | None = field(default_factory=list)
    prompt_logprobs: TokenLogprobs | None = field(default_factory=list)
    finish_reason: Literal["stop", "length", "timeout", "cancelled"] | None = None
    stop_reason: int | str | None = None

    @property
    def length(self) -> int:
        return len(self.token_ids)
