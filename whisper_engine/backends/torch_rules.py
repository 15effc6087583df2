"""Whisper's token rules (see ``TokenRules``) as batched tensor operations.

Everything stays on the device: per-row timestamp state is kept in tensors, so a step costs a
handful of kernels whatever the batch size, instead of a Python loop over rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from whisper_engine.backends.base import TokenRules, WindowRequest

NEG_INF = float("-inf")


@dataclass
class TimestampState:
    """What the timestamp rules need to know about each row's sampled tokens."""

    enabled: torch.Tensor  # [B] bool: the row decodes in timestamp mode
    last_was_timestamp: torch.Tensor  # [B] bool
    penultimate_was_timestamp: torch.Tensor  # [B] bool (True while fewer than 2 tokens)
    last_timestamp: torch.Tensor  # [B] long: last timestamp token id, -1 if none yet
    timestamp_begin: int
    sampled: int = 0  # tokens sampled so far (every row advances together)
    # whether every / any row is in timestamp mode, kept on the host: asking the device at
    # every step would make each step wait for it
    all_enabled: bool = True
    any_enabled: bool = True

    def _count_enabled(self) -> None:
        flags = self.enabled.tolist()
        self.all_enabled, self.any_enabled = all(flags), any(flags)

    @classmethod
    def start(cls, batch: list[WindowRequest], device: str) -> TimestampState:
        size = len(batch)
        return cls(
            enabled=torch.tensor([r.timestamps for r in batch], device=device),
            all_enabled=all(r.timestamps for r in batch),
            any_enabled=any(r.timestamps for r in batch),
            last_was_timestamp=torch.zeros(size, dtype=torch.bool, device=device),
            penultimate_was_timestamp=torch.ones(size, dtype=torch.bool, device=device),
            last_timestamp=torch.full((size,), -1, dtype=torch.long, device=device),
            timestamp_begin=batch[0].rules.timestamp_begin,
        )

    @classmethod
    def of_tokens(
        cls, generated: Sequence[Sequence[int]], timestamps: bool, timestamp_begin: int, device
    ) -> TimestampState:
        """The state after ``generated`` (one token list per row, all of one length): for
        engines that hand each step the tokens so far instead of keeping state."""

        def is_ts(token: int) -> bool:
            return token >= timestamp_begin

        return cls(
            enabled=torch.tensor([timestamps] * len(generated), device=device),
            all_enabled=timestamps,
            any_enabled=timestamps,
            last_was_timestamp=torch.tensor(
                [bool(g) and is_ts(g[-1]) for g in generated], device=device
            ),
            penultimate_was_timestamp=torch.tensor(
                [len(g) < 2 or is_ts(g[-2]) for g in generated], device=device
            ),
            last_timestamp=torch.tensor(
                [next((t for t in reversed(g) if is_ts(t)), -1) for g in generated],
                dtype=torch.long,
                device=device,
            ),
            timestamp_begin=timestamp_begin,
            sampled=min((len(g) for g in generated), default=0),
        )

    def select(self, keep: torch.Tensor) -> None:
        """Keep only the rows ``keep`` (finished rows leave the batch)."""
        self.enabled = self.enabled[keep]
        self.last_was_timestamp = self.last_was_timestamp[keep]
        self.penultimate_was_timestamp = self.penultimate_was_timestamp[keep]
        self.last_timestamp = self.last_timestamp[keep]
        self._count_enabled()

    def advance(self, chosen: torch.Tensor, done: torch.Tensor) -> None:
        is_timestamp = chosen >= self.timestamp_begin
        self.sampled += 1
        if self.sampled >= 2:  # with fewer than two tokens, the "penultimate" counts as one
            self.penultimate_was_timestamp = torch.where(
                done, self.penultimate_was_timestamp, self.last_was_timestamp
            )
        self.last_was_timestamp = torch.where(done, self.last_was_timestamp, is_timestamp)
        self.last_timestamp = torch.where(is_timestamp & ~done, chosen, self.last_timestamp)


@dataclass(frozen=True)
class RuleMasks:
    """The vocabulary masks of one batch, built once instead of at every decoding step."""

    always: torch.Tensor  # [V] bool: never sampled (suppress list, <|notimestamps|>)
    first: torch.Tensor  # [V] bool: never the first token (adds the begin-suppress list)
    vocab: torch.Tensor  # [V] long: token ids
    is_timestamp: torch.Tensor  # [V] bool
    below_eot: torch.Tensor  # [V] bool: text tokens
    first_timestamp: torch.Tensor  # [V] bool: not a timestamp allowed as the first token

    @classmethod
    def build(cls, rules: TokenRules, vocab_size: int, device: str | torch.device) -> RuleMasks:
        vocab = torch.arange(vocab_size, device=device)
        always = torch.zeros(vocab_size, dtype=torch.bool, device=device)
        always[list(rules.suppress_ids)] = True
        # <|notimestamps|> is only ever part of a prompt
        always[rules.no_timestamps] = True
        first = always.clone()
        first[list(rules.begin_suppress_ids)] = True
        is_timestamp = vocab >= rules.timestamp_begin
        # the first token is a timestamp, no later than max_initial_timestamp_index
        first_timestamp = ~is_timestamp
        if rules.max_initial_timestamp_index is not None:
            first_timestamp |= vocab > rules.timestamp_begin + rules.max_initial_timestamp_index
        return cls(always, first, vocab, is_timestamp, vocab < rules.eot, first_timestamp)


def apply_rules(
    logits: torch.Tensor, rules: TokenRules, state: TimestampState, step: int, masks: RuleMasks
) -> torch.Tensor:
    """A copy of ``logits`` [B, V] with every forbidden token at -inf."""
    # masked_fill (not in place) is the copy: the caller's logits stay as they were
    logits = logits.masked_fill(masks.first if step == 0 else masks.always, NEG_INF)
    if state.all_enabled:
        # every row in timestamp mode (the usual case): no second copy to merge
        return _timestamp_rules(logits, rules, state, step, masks)
    if state.any_enabled:
        timestamped = _timestamp_rules(logits.clone(), rules, state, step, masks)
        logits = torch.where(state.enabled[:, None], timestamped, logits)
    return logits


def _timestamp_rules(
    out: torch.Tensor, rules: TokenRules, state: TimestampState, step: int, masks: RuleMasks
) -> torch.Tensor:
    """``out`` with the timestamp rules applied, in place."""
    begin = rules.timestamp_begin
    vocab, is_timestamp = masks.vocab, masks.is_timestamp

    # timestamps come in pairs: after a pair, text must follow; after a lone one, another
    # timestamp or the end
    pair_closed = state.last_was_timestamp & state.penultimate_was_timestamp
    pair_open = state.last_was_timestamp & ~state.penultimate_was_timestamp
    out.masked_fill_(pair_closed[:, None] & is_timestamp[None, :], NEG_INF)
    out.masked_fill_(pair_open[:, None] & masks.below_eot[None, :], NEG_INF)

    # timestamps never go backwards; a new pair must start strictly after the last one
    has_timestamp = state.last_timestamp >= 0
    lowest = torch.where(pair_open, state.last_timestamp, state.last_timestamp + 1)
    backwards = is_timestamp[None, :] & (vocab[None, :] < lowest[:, None])
    out.masked_fill_(has_timestamp[:, None] & backwards, NEG_INF)

    if step == 0:
        out.masked_fill_(masks.first_timestamp[None, :], NEG_INF)

    # when timestamps together are likelier than any single text token, take a timestamp
    logprobs = torch.log_softmax(out.float(), dim=-1)
    timestamp_mass = logprobs[:, begin:].logsumexp(dim=-1)
    best_text = logprobs[:, :begin].max(dim=-1).values
    force = timestamp_mass > best_text
    out.masked_fill_(force[:, None] & ~is_timestamp[None, :], NEG_INF)
    return out
