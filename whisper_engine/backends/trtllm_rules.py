"""Whisper's logit rules as TensorRT-LLM per-request logits processors (torch).

TensorRT-LLM's Whisper model applies no timestamp or suppression rules of its own. Its
``SamplingParams.logits_processor`` takes any callable with the signature
``(req_id, logits, token_ids, stream_ptr, client_id)`` that edits ``logits`` in place, where
``token_ids`` holds each beam's tokens so far, the decoder prompt included. These classes are
plain picklable callables (the library may run them in its worker process).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch

from whisper_engine.backends.base import TokenRules
from whisper_engine.backends.torch_rules import RuleMasks, TimestampState, apply_rules

NEG_INF = float("-inf")


class LogitsProcessor:
    """The library's calling convention: edit ``logits`` in place, on the CUDA stream it
    passes in. Subclasses implement ``apply`` over rows of [beams, V]."""

    def __call__(
        self,
        req_id: int,
        logits: torch.Tensor,
        token_ids: list[list[int]],
        stream_ptr: Any,
        client_id: Any,
    ) -> None:
        stream = torch.cuda.ExternalStream(stream_ptr) if stream_ptr is not None else None
        with torch.cuda.stream(stream) if stream is not None else nullcontext():
            self.apply(logits.view(-1, logits.shape[-1]), token_ids)

    def apply(self, rows: torch.Tensor, token_ids: list[list[int]]) -> None:
        raise NotImplementedError


class WhisperTokenRules(LogitsProcessor):
    """Suppressed tokens, blank suppression at the start, and (in timestamp mode)
    openai-whisper's timestamp rules, for one request whose prompt has ``prompt_len`` tokens.
    The rules are the torch backend's own (``torch_rules``), fed the tokens so far."""

    def __init__(self, rules: TokenRules, prompt_len: int, timestamps: bool) -> None:
        self.rules = rules
        self.prompt_len = prompt_len
        self.timestamps = timestamps
        self._masks: RuleMasks | None = None  # built on the first call, on the logits' device

    def apply(self, rows: torch.Tensor, token_ids: list[list[int]]) -> None:
        """Edit ``rows`` [beams, V] in place, given each beam's tokens (prompt included)."""
        generated = [list(tokens[self.prompt_len :]) for tokens in token_ids[: rows.shape[0]]]
        if self._masks is None:
            self._masks = RuleMasks.build(self.rules, rows.shape[-1], rows.device)
        state = TimestampState.of_tokens(
            generated, self.timestamps, self.rules.timestamp_begin, rows.device
        )
        step = len(generated[0]) if generated else 0
        rows.copy_(apply_rules(rows, self.rules, state, step, self._masks))


class KeepOnly(LogitsProcessor):
    """Masks every token but ``candidates`` (a language-detection probe)."""

    def __init__(self, candidates: tuple[int, ...]) -> None:
        self.candidates = candidates

    def apply(self, rows: torch.Tensor, token_ids: list[list[int]]) -> None:
        keep = rows[:, list(self.candidates)].clone()
        rows.fill_(NEG_INF)
        rows[:, list(self.candidates)] = keep
