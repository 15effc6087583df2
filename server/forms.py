"""The multipart form fields of the audio routes, with OpenAI's names, and the one place
where they become engine options (``to_options``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import Depends, File, Form, UploadFile

from server.errors import APIError
from whisper_engine.options import TranscribeOptions

ResponseFormat = Literal["json", "text", "srt", "verbose_json", "vtt"]
Granularity = Literal["segment", "word"]


@dataclass(frozen=True)
class AudioForm:
    """One transcription or translation request, as the client sent it."""

    file: UploadFile
    """The audio file (any supported container; the format is read from the bytes)."""
    model: str
    """A served model name; ``whisper-1`` always works."""
    task: Literal["transcribe", "translate"]
    """transcriptions: transcribe; translations: translate to English."""
    language: str | None = None
    """ISO-639-1 code (or English name) of the speech; None: detect it."""
    prompt: str | None = None
    """Previous text or a style hint, given to the decoder as Whisper's previous-text prompt."""
    response_format: ResponseFormat = "json"
    """json, text, srt, verbose_json or vtt."""
    temperature: float = 0.0
    """0: greedy decoding with temperature fallback; > 0: sample at that temperature."""
    timestamp_granularities: tuple[Granularity, ...] = ()
    """segment and/or word; only with verbose_json."""
    stream: bool = False
    """Answer with server-sent events as segments are decoded."""
    include: tuple[str, ...] = ()
    """Extra output: ``logprobs`` adds token log-probabilities to json."""

    @property
    def words(self) -> bool:
        return "word" in self.timestamp_granularities

    @property
    def logprobs(self) -> bool:
        return "logprobs" in self.include

    def check(self) -> None:
        """Rules between fields (each field alone was checked by FastAPI)."""
        if self.timestamp_granularities and self.response_format != "verbose_json":
            raise APIError(
                400,
                "timestamp_granularities is only supported with response_format verbose_json.",
                param="timestamp_granularities",
            )
        if self.logprobs and self.response_format != "json":
            raise APIError(
                400,
                "include[]=logprobs is only supported with response_format json.",
                param="include",
            )

    def to_options(self) -> TranscribeOptions:
        """The engine's options; raises ``InvalidOption`` (a 400 naming the field)."""
        self.check()
        return TranscribeOptions(
            language=self.language or None,
            task=self.task,
            prompt=self.prompt or None,
            temperature=self.temperature,
            word_timestamps=self.words,
            token_logprobs=self.logprobs,
        )


Temperature = Annotated[float, Form(ge=0.0, le=1.0)]


def transcription_form(
    file: Annotated[UploadFile, File()],
    model: Annotated[str, Form(min_length=1)],
    language: Annotated[str | None, Form()] = None,
    prompt: Annotated[str | None, Form()] = None,
    response_format: Annotated[ResponseFormat, Form()] = "json",
    temperature: Temperature = 0.0,
    granularities_list: Annotated[
        list[Granularity] | None, Form(alias="timestamp_granularities[]")
    ] = None,
    granularities: Annotated[
        list[Granularity] | None, Form(alias="timestamp_granularities")
    ] = None,
    stream: Annotated[bool, Form()] = False,
    include_list: Annotated[list[str] | None, Form(alias="include[]")] = None,
    include: Annotated[list[str] | None, Form(alias="include")] = None,
    chunking_strategy: Annotated[str | None, Form()] = None,  # accepted; windows are planned
) -> AudioForm:
    return AudioForm(
        file=file,
        model=model,
        task="transcribe",
        language=language,
        prompt=prompt,
        response_format=response_format,
        temperature=temperature,
        timestamp_granularities=tuple(
            dict.fromkeys([*(granularities_list or []), *(granularities or [])])
        ),
        stream=stream,
        include=tuple([*(include_list or []), *(include or [])]),
    )


def translation_form(
    file: Annotated[UploadFile, File()],
    model: Annotated[str, Form(min_length=1)],
    prompt: Annotated[str | None, Form()] = None,
    response_format: Annotated[ResponseFormat, Form()] = "json",
    temperature: Temperature = 0.0,
) -> AudioForm:
    """Translations take fewer fields; extras a client sends are ignored, not refused."""
    return AudioForm(
        file=file,
        model=model,
        task="translate",
        prompt=prompt,
        response_format=response_format,
        temperature=temperature,
    )


TranscriptionFormDependency = Annotated[AudioForm, Depends(transcription_form)]
TranslationFormDependency = Annotated[AudioForm, Depends(translation_form)]
