"""OpenAI's response formats, as pure functions of a ``Transcription``.

Nothing here knows HTTP: each function returns the body (a dict for the JSON formats, a str
for the text ones); ``render`` picks the function and the media type.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from whisper_engine.languages import language_name
from whisper_engine.results import Segment, Transcription

RESPONSE_FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
TIMESTAMP_GRANULARITIES = ("segment", "word")


def usage(transcription: Transcription) -> dict[str, Any]:
    """Billing-style usage: whole seconds of input audio, rounded up (as OpenAI counts)."""
    return {"type": "duration", "seconds": math.ceil(round(transcription.duration, 3))}


def format_text(transcription: Transcription) -> str:
    return transcription.text


def format_json(transcription: Transcription, *, logprobs: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"text": transcription.text}
    if logprobs:
        body["logprobs"] = [
            {"token": lp.token, "logprob": float(lp.logprob), "bytes": list(lp.bytes)}
            for lp in transcription.logprobs
        ]
    body["usage"] = usage(transcription)
    return body


def _segment(segment: Segment) -> dict[str, Any]:
    return {
        "id": segment.id,
        "seek": segment.seek,
        "start": float(segment.start),
        "end": float(segment.end),
        "text": segment.text,
        "tokens": list(segment.tokens),
        "temperature": float(segment.temperature),
        "avg_logprob": float(segment.avg_logprob),
        "compression_ratio": float(segment.compression_ratio),
        "no_speech_prob": float(segment.no_speech_prob),
    }


def format_verbose_json(transcription: Transcription, *, words: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {
        "task": transcription.task,
        "language": language_name(transcription.language),
        "duration": float(transcription.duration),
        "text": transcription.text,
        "segments": [_segment(s) for s in transcription.segments],
    }
    if words:
        body["words"] = [
            {"word": w.word, "start": float(w.start), "end": float(w.end)}
            for w in transcription.words
        ]
    body["usage"] = usage(transcription)
    return body


def _timestamp(seconds: float, decimal_marker: str) -> str:
    milliseconds = max(0, round(seconds * 1000))
    hours, milliseconds = divmod(milliseconds, 3_600_000)
    minutes, milliseconds = divmod(milliseconds, 60_000)
    secs, milliseconds = divmod(milliseconds, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal_marker}{milliseconds:03d}"


def _cues(segments: Iterable[Segment]) -> Iterable[tuple[float, float, str]]:
    """Subtitle cues: one per segment with text; a cue line never starts with a space."""
    for segment in segments:
        text = segment.text.strip().replace("-->", "->")
        if text:
            yield segment.start, segment.end, text


def format_srt(transcription: Transcription) -> str:
    """SubRip: numbered cues, ``HH:MM:SS,mmm --> HH:MM:SS,mmm``, a blank line after each."""
    blocks = [
        f"{index}\n{_timestamp(start, ',')} --> {_timestamp(end, ',')}\n{text}\n"
        for index, (start, end, text) in enumerate(_cues(transcription.segments), start=1)
    ]
    return "\n".join(blocks)


def format_vtt(transcription: Transcription) -> str:
    """WebVTT: a ``WEBVTT`` header, then ``HH:MM:SS.mmm --> HH:MM:SS.mmm`` cues."""
    blocks = [
        f"{_timestamp(start, '.')} --> {_timestamp(end, '.')}\n{text}\n"
        for start, end, text in _cues(transcription.segments)
    ]
    return "WEBVTT\n\n" + "\n".join(blocks)


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
    renderers: dict[str, Callable[[], RenderedBody]] = {
        "json": lambda: _json(format_json(transcription, logprobs=logprobs)),
        "verbose_json": lambda: _json(format_verbose_json(transcription, words=words)),
        "text": lambda: RenderedBody(format_text(transcription), "text/plain; charset=utf-8"),
        "srt": lambda: RenderedBody(format_srt(transcription), "text/plain; charset=utf-8"),
        "vtt": lambda: RenderedBody(format_vtt(transcription), "text/plain; charset=utf-8"),
    }
    return renderers[response_format]()


def _json(body: dict[str, Any]) -> RenderedBody:
    return RenderedBody(json.dumps(body, ensure_ascii=False), "application/json")


def sse_event(payload: dict[str, Any]) -> str:
    """One server-sent event carrying a JSON payload."""
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def text_delta_event(delta: str) -> str:
    return sse_event({"type": "transcript.text.delta", "delta": delta})


def text_done_event(transcription: Transcription) -> str:
    return sse_event(
        {"type": "transcript.text.done", "text": transcription.text, "usage": usage(transcription)}
    )
