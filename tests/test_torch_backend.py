"""The torch backend's token rules (precomputed masks) and its CPU precision choice."""

from __future__ import annotations

import numpy as np
import torch

from whisper_engine.backends.base import TokenRules, WindowRequest
from whisper_engine.backends.torch_backend import Precision, pick_precision
from whisper_engine.backends.torch_rules import RuleMasks, TimestampState, apply_rules

VOCAB = 40
RULES = TokenRules(
    eot=20,
    sot=21,
    no_speech=22,
    no_timestamps=23,
    timestamp_begin=25,
    suppress_ids=(3, 21, 22, 24),
    begin_suppress_ids=(5, 20),
    max_initial_timestamp_index=4,
)


def _request(timestamps: bool) -> WindowRequest:
    return WindowRequest(
        audio=np.zeros(16_000, np.float32),
        prompt_ids=(21,),
        temperature=0.0,
        max_new_tokens=10,
        timestamps=timestamps,
        rules=RULES,
    )


def _setup(timestamps: list[bool]) -> tuple[TimestampState, RuleMasks]:
    batch = [_request(t) for t in timestamps]
    return TimestampState.start(batch, "cpu"), RuleMasks.build(RULES, VOCAB, "cpu")


def _allowed(row: torch.Tensor) -> set[int]:
    return {int(i) for i in torch.nonzero(row > float("-inf"))[:, 0]}


def test_first_step_allows_only_early_timestamps_and_leaves_input_alone() -> None:
    state, masks = _setup([True, True])
    logits = torch.zeros(2, VOCAB)
    filtered = apply_rules(logits, RULES, state, 0, masks)
    begin = RULES.timestamp_begin
    assert _allowed(filtered[0]) == set(range(begin, begin + 5))
    assert bool((logits == 0).all())  # the caller's logits are not modified


def test_text_mode_rows_get_suppression_but_no_timestamp_rules() -> None:
    state, masks = _setup([False, True])
    logits = torch.zeros(2, VOCAB)
    filtered = apply_rules(logits, RULES, state, 0, masks)
    blocked = {3, 21, 22, 24, 23, 5, 20}  # suppress list, <|notimestamps|>, begin-suppress list
    assert _allowed(filtered[0]) == set(range(VOCAB)) - blocked
    assert max(_allowed(filtered[1])) < RULES.timestamp_begin + 5
    later = apply_rules(logits, RULES, state, 1, masks)
    assert {5, 20} <= _allowed(later[0])  # begin-suppressed tokens come back after step 0


def test_timestamps_pair_up_and_never_go_backwards() -> None:
    state, masks = _setup([True])
    begin = RULES.timestamp_begin
    done = torch.tensor([False])
    text_preferred = torch.zeros(1, VOCAB)
    text_preferred[0, :begin] = 10.0  # so that no timestamp is forced by probability
    state.advance(torch.tensor([7]), done)  # text first: a single token counts as after a pair
    state.advance(torch.tensor([begin + 3]), done)  # a lone timestamp: a second one or eot
    after_one = _allowed(apply_rules(text_preferred, RULES, state, 2, masks)[0])
    assert after_one == {RULES.eot, *range(begin + 3, VOCAB)}
    state.advance(torch.tensor([begin + 6]), done)  # a closed pair: text must follow
    after_pair = _allowed(apply_rules(text_preferred, RULES, state, 3, masks)[0])
    assert after_pair and max(after_pair) < begin


def test_timestamp_forced_when_timestamps_together_outweigh_text() -> None:
    state, masks = _setup([True])
    state.advance(torch.tensor([7]), torch.tensor([False]))
    logits = torch.zeros(1, VOCAB)
    logits[0, RULES.timestamp_begin :] = 2.0  # every timestamp beats the best text token
    assert min(_allowed(apply_rules(logits, RULES, state, 1, masks)[0])) >= RULES.timestamp_begin


def test_precision_defaults_and_explicit_dtype() -> None:
    # a named dtype is used everywhere
    assert pick_precision("cpu", "bfloat16") == Precision.uniform(torch.bfloat16)
    assert pick_precision("cuda", "float32") == Precision.uniform(torch.float32)
    assert pick_precision("cuda", None) == Precision.uniform(torch.float16)
    # on a CPU the decoder's layers stay float32, whatever else runs narrower
    assert pick_precision("cpu", None).weights == torch.float32
