"""Options of one transcription, validated once, at construction."""

from __future__ import annotations

from dataclasses import dataclass

from whisper_engine.errors import InvalidOption
from whisper_engine.languages import language_code

TASKS = ("transcribe", "translate")
FALLBACK_STEP = 0.2


@dataclass(frozen=True)
class TranscribeOptions:
    """What a caller may choose. A field holding an invalid value raises ``InvalidOption``."""

    language: str | None = None  # code or English name; None: detect
    task: str = "transcribe"
    prompt: str | None = None  # previous text / style hint (Whisper's <|startofprev|> prompt)
    temperature: float = 0.0  # 0: greedy with fallback; > 0: sample at that temperature only
    word_timestamps: bool = False
    with_timestamps: bool = True  # segment timestamps from timestamp tokens
    token_logprobs: bool = False  # keep per-token logprobs (OpenAI include[]=logprobs)
    compression_ratio_threshold: float | None = 2.4
    logprob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6
    max_new_tokens: int | None = None  # per window; None: as many as the model allows

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise InvalidOption("task", f"task must be one of {list(TASKS)}, got {self.task!r}")
        if self.language is not None:
            code = language_code(self.language)
            if code is None:
                raise InvalidOption("language", f"Unsupported language: {self.language!r}")
            object.__setattr__(self, "language", code)
        if not 0.0 <= self.temperature <= 1.0:
            raise InvalidOption("temperature", "temperature must be between 0 and 1")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise InvalidOption("max_new_tokens", "max_new_tokens must be positive")

    @property
    def temperatures(self) -> tuple[float, ...]:
        """The fallback ladder: 0.0, 0.2, ... 1.0 from temperature 0; a fixed one otherwise."""
        if self.temperature > 0:
            return (self.temperature,)
        return tuple(round(i * FALLBACK_STEP, 1) for i in range(int(1 / FALLBACK_STEP) + 1))
