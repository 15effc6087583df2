"""OpenAI's five transcript formats, written from a ``Transcription``.

Pure functions with no transport attached: the JSON formats give a dict, the others a str.
SubRip and WebVTT differ only in data (a header, the decimal marker, cue numbers), so they are
one writer over two ``SubtitleStyle`` values, as openai-whisper's writers are.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from whisper_engine.errors import InvalidOption
from whisper_engine.languages import language_name
from whisper_engine.results import Segment, Transcription

FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
JSON_FORMATS = ("json", "verbose_json")


def usage(transcription: Transcription) -> dict[str, Any]:
    """Billing-style usage: whole seconds of input audio, rounded up (as OpenAI counts)."""
    return {"type": "duration", "seconds": math.ceil(round(transcription.duration, 3))}


def to_text(transcription: Transcription) -> str:
    return transcription.text


def to_json(transcription: Transcription, *, logprobs: bool = False) -> dict[str, Any]:
    """``{"text": ...}`` (+ token ``logprobs`` when asked) + ``usage``."""
    body: dict[str, Any] = {"text": transcription.text}
    if logprobs:
        body["logprobs"] = [
            {"token": lp.token, "logprob": float(lp.logprob), "bytes": list(lp.bytes)}
            for lp in transcription.logprobs
        ]
    body["usage"] = usage(transcription)
    return body


def segment_fields(segment: Segment) -> dict[str, Any]:
    """Every field of a verbose_json segment, as plain JSON numbers and lists."""
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


def to_verbose_json(transcription: Transcription, *, words: bool = False) -> dict[str, Any]:
    """Task, full language name, duration (a number), text, segments; ``words`` when asked."""
    body: dict[str, Any] = {
        "task": transcription.task,
        "language": language_name(transcription.language),
        "duration": float(transcription.duration),
        "text": transcription.text,
        "segments": [segment_fields(s) for s in transcription.segments],
    }
    if words:
        body["words"] = [
            {"word": w.word, "start": float(w.start), "end": float(w.end)}
            for w in transcription.words
        ]
    body["usage"] = usage(transcription)
    return body


@dataclass(frozen=True)
class SubtitleStyle:
    header: str
    decimal_marker: str
    numbered_cues: bool


SRT = SubtitleStyle(header="", decimal_marker=",", numbered_cues=True)
VTT = SubtitleStyle(header="WEBVTT\n\n", decimal_marker=".", numbered_cues=False)


def subtitle_timestamp(seconds: float, decimal_marker: str) -> str:
    """``HH:MM:SS,mmm`` (SubRip) or ``HH:MM:SS.mmm`` (WebVTT); negative times clamp to 0."""
    milliseconds = max(0, round(seconds * 1000))
    hours, milliseconds = divmod(milliseconds, 3_600_000)
    minutes, milliseconds = divmod(milliseconds, 60_000)
    secs, milliseconds = divmod(milliseconds, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal_marker}{milliseconds:03d}"


def _cues(segments: tuple[Segment, ...]) -> Iterator[tuple[float, float, str]]:
    """One cue per segment with text. A cue line never starts with a space, and never holds
    ``-->`` (both formats would read it as a timing line)."""
    for segment in segments:
        text = segment.text.strip().replace("-->", "->")
        if text:
            yield segment.start, segment.end, text


def to_subtitles(transcription: Transcription, style: SubtitleStyle) -> str:
    """The cues of ``transcription`` in ``style``, a blank line after each."""
    blocks = []
    for number, (start, end, text) in enumerate(_cues(transcription.segments), start=1):
        timing = (
            f"{subtitle_timestamp(start, style.decimal_marker)} --> "
            f"{subtitle_timestamp(end, style.decimal_marker)}"
        )
        prefix = f"{number}\n" if style.numbered_cues else ""
        blocks.append(f"{prefix}{timing}\n{text}\n")
    return style.header + "\n".join(blocks)


def to_srt(transcription: Transcription) -> str:
    return to_subtitles(transcription, SRT)


def to_vtt(transcription: Transcription) -> str:
    return to_subtitles(transcription, VTT)


def render(
    transcription: Transcription,
    output_format: str,
    *,
    words: bool = False,
    logprobs: bool = False,
) -> str:
    """The document of ``output_format`` as text; JSON formats on one line (JSON Lines-ready)."""
    writers: dict[str, Callable[[], str]] = {
        "json": lambda: _dumps(to_json(transcription, logprobs=logprobs)),
        "verbose_json": lambda: _dumps(to_verbose_json(transcription, words=words)),
        "text": lambda: to_text(transcription),
        "srt": lambda: to_srt(transcription),
        "vtt": lambda: to_vtt(transcription),
    }
    if output_format not in writers:
        raise InvalidOption(
            "format", f"format must be one of {list(FORMATS)}, got {output_format!r}"
        )
    return writers[output_format]()


def _dumps(body: dict[str, Any]) -> str:
    return json.dumps(body, ensure_ascii=False)
