"""Whisper's vocabulary: special token ids, prompts, text <-> ids.

Every id is read from the checkpoint's ``tokenizer.json``: English-only and multilingual
vocabularies number their special tokens differently.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from tokenizers import Tokenizer

from whisper_engine.errors import InvalidOption, ModelLoadError
from whisper_engine.languages import LANGUAGES

TIME_PRECISION = 0.02  # seconds per timestamp token step
MAX_PROMPT_TOKENS = 223  # Whisper keeps at most n_text_ctx // 2 - 1 tokens of previous text
# Languages written without spaces: words are split at unicode boundaries instead.
UNSPACED_LANGUAGES = frozenset({"zh", "ja", "th", "lo", "my", "yue"})


@dataclass(frozen=True)
class SpecialTokens:
    eot: int
    sot: int
    sot_prev: int
    transcribe: int
    translate: int
    no_timestamps: int
    no_speech: int
    timestamp_begin: int
    languages: dict[str, int]  # code -> <|code|> id, for the languages this model knows


class WhisperTokenizer:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self.special = self._read_special_tokens()

    @classmethod
    def from_file(cls, path: str | Path) -> WhisperTokenizer:
        try:
            return cls(Tokenizer.from_file(str(path)))
        except Exception as exc:
            raise ModelLoadError(f"Cannot read tokenizer {path}: {exc}") from exc

    def _id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def _require(self, *names: str) -> int:
        for name in names:
            token_id = self._id(name)
            if token_id is not None:
                return token_id
        raise ModelLoadError(f"The tokenizer has none of the special tokens {list(names)}")

    def _read_special_tokens(self) -> SpecialTokens:
        no_timestamps = self._require("<|notimestamps|>")
        first_timestamp = self._id("<|0.00|>")
        return SpecialTokens(
            eot=self._require("<|endoftext|>"),
            sot=self._require("<|startoftranscript|>"),
            sot_prev=self._require("<|startofprev|>"),
            transcribe=self._require("<|transcribe|>"),
            translate=self._require("<|translate|>"),
            no_timestamps=no_timestamps,
            no_speech=self._require("<|nospeech|>", "<|nocaptions|>"),
            # Older tokenizer.json files omit the 1501 timestamp tokens; in the model's
            # vocabulary they directly follow <|notimestamps|>.
            timestamp_begin=first_timestamp if first_timestamp is not None else no_timestamps + 1,
            languages={
                code: tid for code in LANGUAGES if (tid := self._id(f"<|{code}|>")) is not None
            },
        )

    @property
    def is_multilingual(self) -> bool:
        return len(self.special.languages) > 1

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int] | tuple[int, ...]) -> str:
        """Text of the ids, leaving out every special and timestamp token."""
        return self._tok.decode([i for i in ids if i < self.special.eot], skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> bytes:
        return self.decode([token_id]).encode("utf-8")

    def timestamp_token(self, seconds: float) -> int:
        return self.special.timestamp_begin + round(seconds / TIME_PRECISION)

    def decoder_prompt(
        self,
        language: str | None,
        task: str,
        timestamps: bool,
        previous_text: str | None = None,
    ) -> tuple[int, ...]:
        """``[<|startofprev|> text] <|startoftranscript|> <|lang|> <|task|> [<|notimestamps|>]``."""
        sp = self.special
        prompt: list[int] = []
        if previous_text and previous_text.strip():
            text_ids = self.encode(" " + previous_text.strip())
            prompt = [sp.sot_prev, *text_ids[-MAX_PROMPT_TOKENS:]]
        prompt.append(sp.sot)
        if self.is_multilingual:
            if language is not None:
                if language not in sp.languages:
                    raise InvalidOption(
                        "language", f"This model does not know language {language!r}"
                    )
                prompt.append(sp.languages[language])
            prompt.append(sp.translate if task == "translate" else sp.transcribe)
        elif task == "translate":
            raise InvalidOption("task", "This English-only model cannot translate")
        if not timestamps:
            prompt.append(sp.no_timestamps)
        return tuple(prompt)

    def prompt_text(self, prompt_ids: tuple[int, ...]) -> str:
        """The prompt as text with its special tokens, as engines that take text prompts need."""
        return self._tok.decode(list(prompt_ids), skip_special_tokens=False)

    @cached_property
    def non_speech_tokens(self) -> tuple[int, ...]:
        """Ids of symbols that are never spoken (openai-whisper's list), for suppression."""
        symbols = list('"#()*+/:;<=>@[\\]^_`{|}~「」『』')
        symbols += [
            "<<",
            ">>",
            "<<<",
            ">>>",
            "--",
            "---",
            "-(",
            "-[",
            "('",
            '("',
            "((",
            "))",
            "(((",
            ")))",
            "[[",
            "]]",
            "{{",
            "}}",
            "♪♪",
            "♪♪♪",
        ]
        miscellaneous = set("♩♪♫♬♭♮♯")
        ids = {self.encode(" -")[0], self.encode(" '")[0]}
        for symbol in symbols + sorted(miscellaneous):
            for variant in (self.encode(symbol), self.encode(" " + symbol)):
                if len(variant) == 1 or (symbol in miscellaneous and variant):
                    ids.add(variant[0])
        return tuple(sorted(ids))

    def split_to_words(
        self, token_ids: list[int], language: str
    ) -> tuple[list[str], list[list[int]]]:
        """Group text tokens into words: at spaces and punctuation, or unicode points."""
        if language in UNSPACED_LANGUAGES:
            return self._split_unicode(token_ids)
        return self._split_spaces(token_ids)

    def _split_unicode(self, token_ids: list[int]) -> tuple[list[str], list[list[int]]]:
        words: list[str] = []
        groups: list[list[int]] = []
        current: list[int] = []
        offset = 0
        full = self.decode(token_ids)
        for token in token_ids:
            current.append(token)
            text = self.decode(current)
            if "\ufffd" not in text or full[offset + text.index("\ufffd")] == "\ufffd":
                words.append(text)
                groups.append(current)
                current = []
                offset += len(text)
        return words, groups

    def _split_spaces(self, token_ids: list[int]) -> tuple[list[str], list[list[int]]]:
        sub_words, sub_groups = self._split_unicode(token_ids)
        words: list[str] = []
        groups: list[list[int]] = []
        for sub, group in zip(sub_words, sub_groups, strict=True):
            special = group[0] >= self.special.eot
            with_space = sub.startswith(" ")
            punctuation = sub.strip() in string.punctuation
            if special or with_space or punctuation or not words:
                words.append(sub)
                groups.append(list(group))
            else:
                words[-1] += sub
                groups[-1].extend(group)
        return words, groups
