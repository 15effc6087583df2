"""Response bodies of the audio routes: OpenAI's five formats with their media types, and the
server-sent events of a streamed transcription.

The documents themselves are written by ``whisper_engine.output_formats`` (the command line
writes the same files); this module adds what only HTTP needs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from whisper_engine.output_formats import FORMATS, JSON_FORMATS, usage
from whisper_engine.output_formats import render as render_document
from whisper_engine.results import Transcription

RESPONSE_FORMATS = FORMATS
JSON_MEDIA_TYPE = "application/json"
TEXT_MEDIA_TYPE = "text/plain; charset=utf-8"  # text, srt and vtt, as OpenAI sends them


@dataclass(frozen=True)
class RenderedBody:
    content: str
    media_type: str


def render(
    transcription: Transcription,
    response_format: str,
    *,
    words: bool = False,
    logprobs: bool = False,
) -> RenderedBody:
    """The response body and its media type for one of ``RESPONSE_FORMATS``."""
    content = render_document(transcription, response_format, words=words, logprobs=logprobs)
    media_type = JSON_MEDIA_TYPE if response_format in JSON_FORMATS else TEXT_MEDIA_TYPE
    return RenderedBody(content, media_type)


def sse_event(payload: dict[str, Any]) -> str:
    """One server-sent event carrying a JSON payload."""
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def text_delta_event(delta: str) -> str:
    return sse_event({"type": "transcript.text.delta", "delta": delta})


def text_done_event(transcription: Transcription) -> str:
    return sse_event(
        {"type": "transcript.text.done", "text": transcription.text, "usage": usage(transcription)}
    )
