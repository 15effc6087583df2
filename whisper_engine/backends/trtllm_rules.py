"""Whisper's logit rules as TensorRT-LLM per-request logits processors (torch).

TensorRT-LLM's Whisper model applies no timestamp or suppression rules of its own. Its
``SamplingParams.logits_processor`` takes any callable with the signature
``(req_id, logits, token_ids, stream_ptr, client_id)`` that edits ``logits`` in place, where
``token_ids`` holds each beam's tokens so far, the decoder prompt included. These classes are
plain picklable callables (the library may run them in its worker process).
"""

from __future__ import annotations

from typing import Any

import torch

from whisper_engine.backends.base import TokenRules

NEG_INF = float("-inf")


class WhisperTokenRules:
    """Suppressed tokens, blank suppression at the start, and (in timestamp mode)
    openai-whisper's timestamp rules, for one request whose prompt has ``prompt_len`` tokens."""

    def __init__(self, rules: TokenRules, prompt_len: int, timestamps: bool) -> None:
        self.rules = rules
        self.prompt_len = prompt_len
        self.timestamps = timestamps

    def __call__(
        self,
        req_id: int,
        logits: torch.Tensor,
        token_ids: list[list[int]],
        stream_ptr: Any,
        client_id: Any,
    ) -> None:
        rows = logits.view(-1, logits.shape[-1])
        for beam, tokens in enumerate(token_ids[: rows.shape[0]]):
            self.apply(rows[beam], list(tokens[self.prompt_len :]))

    def apply(self, row: torch.Tensor, generated: list[int]) -> None:
        rules = self.rules
        if rules.suppress_ids:
            row[list(rules.suppress_ids)] = NEG_INF
        if not generated and rules.begin_suppress_ids:
            row[list(rules.begin_suppress_ids)] = NEG_INF
        if self.timestamps:
            self._timestamp_rules(row, generated)

    def _timestamp_rules(self, row: torch.Tensor, generated: list[int]) -> None:
        begin = self.rules.timestamp_begin
        row[self.rules.no_timestamps] = NEG_INF
        last_was_timestamp = len(generated) >= 1 and generated[-1] >= begin
        penultimate_was_timestamp = len(generated) < 2 or generated[-2] >= begin
        if last_was_timestamp:
            if penultimate_was_timestamp:  # a pair is closed: text must follow
                row[begin:] = NEG_INF
            else:  # an open pair: the next is a timestamp or the end
                row[: self.rules.eot] = NEG_INF
        timestamps = [t for t in generated if t >= begin]
        if timestamps:  # never go backwards
            last = timestamps[-1]
            if not (last_was_timestamp and not penultimate_was_timestamp):
                last += 1
            row[begin:last] = NEG_INF
        if not generated:  # start with a timestamp, not too far in
            row[:begin] = NEG_INF
            row[begin + self.rules.max_initial_timestamp_index + 1 :] = NEG_INF
        logprobs = torch.log_softmax(row.float(), dim=-1)
        timestamp_logprob = torch.logsumexp(logprobs[begin:], dim=-1)
        if timestamp_logprob > logprobs[:begin].max():
            row[:begin] = NEG_INF


class KeepOnly:
    """Masks every token but ``candidates`` (a language-detection probe)."""

    def __init__(self, candidates: tuple[int, ...]) -> None:
        self.candidates = candidates

    def __call__(
        self,
        req_id: int,
        logits: torch.Tensor,
        token_ids: list[list[int]],
        stream_ptr: Any,
        client_id: Any,
    ) -> None:
        rows = logits.view(-1, logits.shape[-1])
        keep = rows[:, list(self.candidates)].clone()
        rows.fill_(NEG_INF)
        rows[:, list(self.candidates)] = keep
