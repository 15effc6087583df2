"""Decoding windows through a backend: token rules, quality measures, temperature fallback."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from whisper_engine.backends.base import Backend, TokenRules, WindowOutput, WindowRequest
from whisper_engine.options import TranscribeOptions
from whisper_engine.tokenizer import WhisperTokenizer


def token_rules(tokenizer: WhisperTokenizer, model_suppress_ids: Sequence[int]) -> TokenRules:
    """Whisper's rules for this vocabulary: the model's suppress list plus the special tokens
    that must never be generated, a blank or end of text never first."""
    sp = tokenizer.special
    never = {sp.sot, sp.sot_prev, sp.transcribe, sp.translate, sp.no_speech}
    never.update(sp.languages.values())
    suppress = set(model_suppress_ids) | never
    suppress.discard(sp.eot)
    blank = tokenizer.encode(" ")
    return TokenRules(
        eot=sp.eot,
        sot=sp.sot,
        no_speech=sp.no_speech,
        no_timestamps=sp.no_timestamps,
        timestamp_begin=sp.timestamp_begin,
        suppress_ids=tuple(sorted(suppress)),
        begin_suppress_ids=(*blank, sp.eot),
    )


def compression_ratio(text: str) -> float:
    """How repetitive a text is: its size over its zlib-compressed size (Whisper's measure)."""
    data = text.encode("utf-8")
    if not data:
        return 0.0
    return len(data) / len(zlib.compress(data))


@dataclass(frozen=True)
class DecodedWindow:
    output: WindowOutput
    temperature: float
    avg_logprob: float
    compression_ratio: float

    @property
    def no_speech_prob(self) -> float:
        return self.output.no_speech_prob


@dataclass(frozen=True)
class WindowPlan:
    """One window to decode: its audio and its decoder prompt."""

    audio: np.ndarray
    prompt_ids: tuple[int, ...]
    seed: int


class WindowDecoder:
    """Decodes many windows as one batch, retrying weak ones at higher temperatures."""

    def __init__(self, backend: Backend, tokenizer: WhisperTokenizer, rules: TokenRules) -> None:
        self.backend = backend
        self.tokenizer = tokenizer
        self.rules = rules

    def decode(
        self, plans: Sequence[WindowPlan], options: TranscribeOptions
    ) -> list[DecodedWindow]:
        results: list[DecodedWindow | None] = [None] * len(plans)
        pending = list(range(len(plans)))
        temperatures = options.temperatures
        for attempt, temperature in enumerate(temperatures):
            requests = [self._request(plans[i], temperature, options) for i in pending]
            outputs = self.backend.generate(requests)
            retry = []
            for i, output in zip(pending, outputs, strict=True):
                decoded = self._measure(output, temperature)
                results[i] = decoded
                last_attempt = attempt == len(temperatures) - 1
                if not last_attempt and needs_fallback(decoded, options):
                    retry.append(i)
            pending = retry
            if not pending:
                break
        return [r for r in results if r is not None]

    def _request(
        self, plan: WindowPlan, temperature: float, options: TranscribeOptions
    ) -> WindowRequest:
        room = self.backend.max_target_positions - len(plan.prompt_ids)
        wanted = options.max_new_tokens or self.backend.max_target_positions // 2
        return WindowRequest(
            audio=plan.audio,
            prompt_ids=plan.prompt_ids,
            temperature=temperature,
            max_new_tokens=max(1, min(wanted, room)),
            timestamps=options.with_timestamps,
            rules=self.rules,
            seed=plan.seed,
        )

    def _measure(self, output: WindowOutput, temperature: float) -> DecodedWindow:
        text = self.tokenizer.decode(output.token_ids)
        count = len(output.token_ids) + (1 if output.finished else 0)
        return DecodedWindow(
            output=output,
            temperature=temperature,
            avg_logprob=output.sum_logprob / max(count, 1),
            compression_ratio=compression_ratio(text),
        )


def needs_fallback(window: DecodedWindow, options: TranscribeOptions) -> bool:
    """openai-whisper's rule: too repetitive or too unlikely, unless the window is silence."""
    too_repetitive = (
        options.compression_ratio_threshold is not None
        and window.compression_ratio > options.compression_ratio_threshold
    )
    too_unlikely = (
        options.logprob_threshold is not None and window.avg_logprob < options.logprob_threshold
    )
    return (too_repetitive or too_unlikely) and not is_silence(window, options)


def is_silence(window: DecodedWindow, options: TranscribeOptions) -> bool:
    """The model says there is no speech and its text is unlikely: drop the window's text."""
    return (
        options.no_speech_threshold is not None
        and window.no_speech_prob > options.no_speech_threshold
        and options.logprob_threshold is not None
        and window.avg_logprob < options.logprob_threshold
    )
