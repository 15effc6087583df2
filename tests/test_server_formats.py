"""The bodies the server sends, value by value (subtitles read back with real parsers): the
OpenAI formats as written by whisper_engine.output_formats, their media types, SSE events and
the stream's text deltas."""

from __future__ import annotations

import io
import json
from datetime import timedelta

import pytest
import srt
import webvtt

from server.formats import render, text_delta_event, text_done_event
from server.streaming import TextDeltas
from whisper_engine.output_formats import to_json as format_json
from whisper_engine.output_formats import to_srt as format_srt
from whisper_engine.output_formats import to_text as format_text
from whisper_engine.output_formats import to_verbose_json as format_verbose_json
from whisper_engine.output_formats import to_vtt as format_vtt
from whisper_engine.output_formats import usage
from whisper_engine.results import Segment, TokenLogprob, Transcription, Word


def _segment(index: int, start: float, end: float, text: str, words=()) -> Segment:
    return Segment(
        id=index,
        seek=int(start * 100),
        start=start,
        end=end,
        text=text,
        tokens=(50364 + index, 400 + index),
        temperature=0.2 * index,
        avg_logprob=-0.25 - index,
        compression_ratio=1.5 + index,
        no_speech_prob=0.01 * (index + 1),
        words=tuple(words),
    )


@pytest.fixture
def transcription() -> Transcription:
    first_words = (Word(" Hello", 0.0, 0.5, 0.9), Word(" there.", 0.5, 1.25, 0.8))
    return Transcription(
        text="Hello there. Second --> part é",
        language="en",
        language_probability=0.98,
        duration=3725.4321,
        task="transcribe",
        segments=(
            _segment(0, 0.0, 1.25, " Hello there.", first_words),
            _segment(1, 3661.0015, 3725.4321, " Second --> part é"),
        ),
        logprobs=(TokenLogprob(" Hello", -0.125, (32, 72)),),
    )


def test_usage_counts_whole_seconds_rounded_up(transcription):
    assert usage(transcription) == {"type": "duration", "seconds": 3726}


def test_text_is_the_transcription_text(transcription):
    assert format_text(transcription) == "Hello there. Second --> part é"


def test_json_has_text_usage_and_logprobs_only_when_asked(transcription):
    assert format_json(transcription) == {
        "text": "Hello there. Second --> part é",
        "usage": {"type": "duration", "seconds": 3726},
    }
    with_logprobs = format_json(transcription, logprobs=True)
    assert with_logprobs["logprobs"] == [{"token": " Hello", "logprob": -0.125, "bytes": [32, 72]}]


def test_verbose_json_fields(transcription):
    body = format_verbose_json(transcription)
    assert body["task"] == "transcribe"
    assert body["language"] == "english"
    assert body["duration"] == 3725.4321 and isinstance(body["duration"], float)
    assert body["text"] == transcription.text
    assert "words" not in body
    assert body["usage"] == {"type": "duration", "seconds": 3726}
    assert body["segments"][1] == {
        "id": 1,
        "seek": 366100,
        "start": 3661.0015,
        "end": 3725.4321,
        "text": " Second --> part é",
        "tokens": [50365, 401],
        "temperature": 0.2,
        "avg_logprob": -1.25,
        "compression_ratio": 2.5,
        "no_speech_prob": 0.02,
    }
    json.dumps(body)  # serialisable as it is


def test_verbose_json_words_when_asked(transcription):
    body = format_verbose_json(transcription, words=True)
    assert body["words"] == [
        {"word": " Hello", "start": 0.0, "end": 0.5},
        {"word": " there.", "start": 0.5, "end": 1.25},
    ]


def test_verbose_json_language_is_the_full_name(transcription):
    german = Transcription(**{**transcription.__dict__, "language": "de", "task": "translate"})
    body = format_verbose_json(german)
    assert (body["language"], body["task"]) == ("german", "translate")


def test_srt_exact_text_and_parsed(transcription):
    text = format_srt(transcription)
    assert text == (
        "1\n00:00:00,000 --> 00:00:01,250\nHello there.\n\n"
        "2\n01:01:01,002 --> 01:02:05,432\nSecond -> part é\n"
    )
    cues = list(srt.parse(text))
    assert [c.index for c in cues] == [1, 2]
    assert cues[0].start == timedelta(0) and cues[0].end == timedelta(seconds=1.25)
    assert cues[1].start == timedelta(hours=1, minutes=1, seconds=1, milliseconds=2)
    assert cues[1].end == timedelta(hours=1, minutes=2, seconds=5, milliseconds=432)
    assert [c.content for c in cues] == ["Hello there.", "Second -> part é"]


def test_vtt_exact_text_and_parsed(transcription):
    text = format_vtt(transcription)
    assert text.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:01.250\nHello there.\n")
    captions = webvtt.from_string(text).captions
    assert [(c.start, c.end, c.text) for c in captions] == [
        ("00:00:00.000", "00:00:01.250", "Hello there."),
        ("01:01:01.002", "01:02:05.432", "Second -> part é"),
    ]
    assert len(webvtt.from_buffer(io.StringIO(text)).captions) == 2


def test_subtitles_skip_empty_segments_and_keep_numbering(transcription):
    blank = _segment(1, 2.0, 3.0, "   ")
    with_blank = Transcription(
        **{
            **transcription.__dict__,
            "segments": (transcription.segments[0], blank, transcription.segments[1]),
        }
    )
    assert [c.index for c in srt.parse(format_srt(with_blank))] == [1, 2]
    assert len(webvtt.from_string(format_vtt(with_blank)).captions) == 2


def test_empty_transcription_gives_valid_empty_subtitles():
    empty = Transcription("", "en", None, 0.5, "transcribe", ())
    assert format_srt(empty) == ""
    assert format_vtt(empty) == "WEBVTT\n\n"
    assert format_json(empty) == {"text": "", "usage": {"type": "duration", "seconds": 1}}


@pytest.mark.parametrize(
    ("response_format", "media_type"),
    [
        ("json", "application/json"),
        ("verbose_json", "application/json"),
        ("text", "text/plain; charset=utf-8"),
        ("srt", "text/plain; charset=utf-8"),
        ("vtt", "text/plain; charset=utf-8"),
    ],
)
def test_render_picks_body_and_media_type(transcription, response_format, media_type):
    body = render(transcription, response_format)
    assert body.media_type == media_type
    if media_type == "application/json":
        assert json.loads(body.content)["text"] == transcription.text
    else:
        assert "Hello there." in body.content


def test_sse_events(transcription):
    assert text_delta_event("Hi") == 'data: {"type": "transcript.text.delta", "delta": "Hi"}\n\n'
    done = json.loads(text_done_event(transcription).removeprefix("data: "))
    assert done == {
        "type": "transcript.text.done",
        "text": transcription.text,
        "usage": {"type": "duration", "seconds": 3726},
    }


@pytest.mark.parametrize(
    "texts",
    [
        [" Hello there.", " Second part."],
        ["Hello", " world ", " again  ", "!"],
        [" one", "  two", " three "],
    ],
)
def test_deltas_concatenate_to_the_final_text(texts):
    segments = [_segment(i, i, i + 1, text) for i, text in enumerate(texts)]
    final = Transcription("".join(texts).strip(), "en", None, 9.0, "transcribe", tuple(segments))
    deltas = TextDeltas()
    pieces = [deltas.add(segment) for segment in segments]
    pieces.append(deltas.finish(final))
    assert "".join(pieces) == final.text
    assert pieces[0] == texts[0].strip()
