"""The engine end to end on real speech with the real embedded model (Whisper base, CPU)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tests.speech import clips, load_audio, normalize, wer
from whisper_engine.backends.base import SAMPLE_RATE
from whisper_engine.errors import Cancelled, InvalidOption
from whisper_engine.model import WhisperModel, load_model
from whisper_engine.options import TranscribeOptions
from whisper_engine.transcribe import Transcriber

# Whisper base's published LibriSpeech test-clean WER is ~5%. These six clips are clean read
# speech; base transcribes them with one error in 93 words (the reader's "a amiable" comes out
# as "amiable"). 10% per clip leaves room for one more slip on a short clip, yet fails on
# any systematic decoding fault (a lost word per sentence, a truncated window).
CLIP_WER_LIMIT = 0.10
OVERALL_WER_LIMIT = 0.03


@pytest.fixture(scope="module")
def model() -> WhisperModel:
    loaded = load_model(backend="torch")
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def transcriber(model: WhisperModel) -> Transcriber:
    return model.transcriber()


def test_each_clip_is_transcribed_within_the_wer_limit(transcriber: Transcriber) -> None:
    references, hypotheses = [], []
    for clip in clips():
        result = transcriber.transcribe(clip.audio(), TranscribeOptions(language="en"))
        assert wer(clip.reference, result.text) <= CLIP_WER_LIMIT, (clip.name, result.text)
        references.append(clip.reference)
        hypotheses.append(result.text)
    assert wer(references, hypotheses) <= OVERALL_WER_LIMIT


def test_result_fields_are_real(transcriber: Transcriber) -> None:
    audio = load_audio("jfk.wav")
    result = transcriber.transcribe(audio, TranscribeOptions())
    assert result.language == "en" and result.language_probability > 0.5
    assert result.duration == pytest.approx(len(audio) / SAMPLE_RATE)
    assert result.task == "transcribe"
    assert result.segments, "no segments"
    assert result.text == "".join(s.text for s in result.segments).strip()
    for segment in result.segments:
        assert 0 <= segment.start < segment.end <= result.duration + 0.01
        assert segment.tokens and segment.temperature == 0.0
        assert -1.0 < segment.avg_logprob < 0
        assert 0 < segment.compression_ratio < 2.4
        assert 0 <= segment.no_speech_prob < 0.5
        assert segment.seek == 0


def test_language_detection_finds_english_and_spanish(transcriber: Transcriber) -> None:
    english = transcriber.detect_language(load_audio("jfk.wav"))
    spanish = transcriber.detect_language(load_audio("espeak-es.wav"))
    assert english.code == "en" and english.probability > 0.5
    assert spanish.code == "es" and spanish.probability > 0.5


def test_translation_of_spanish_speech_is_english(transcriber: Transcriber) -> None:
    audio = load_audio("espeak-es.wav")
    original = transcriber.transcribe(audio, TranscribeOptions())
    translated = transcriber.transcribe(audio, TranscribeOptions(task="translate"))
    assert original.language == "es" and translated.language == "es"
    assert translated.task == "translate"
    # the clip says "me gusta mucho la música y el café ..."
    assert "música" in original.text.lower()
    words = set(normalize(translated.text).split())
    assert {"music", "coffee"} <= words, translated.text
    assert not {"música", "musica", "café", "gusta"} & words


def test_word_timestamps_are_ordered_and_cover_the_speech(transcriber: Transcriber) -> None:
    audio = load_audio("jfk.wav")
    result = transcriber.transcribe(audio, TranscribeOptions(language="en", word_timestamps=True))
    words = result.words
    assert normalize(" ".join(w.word for w in words)) == normalize(result.text)
    starts = [w.start for w in words]
    assert starts == sorted(starts)
    assert all(w.start <= w.end for w in words)
    assert all(0 <= w.probability <= 1 for w in words)
    # the address's last word ends near the end of the 11 s clip, the first starts early
    assert words[0].start < 1.5 and words[-1].end > 9.0
    for segment in result.segments:
        assert all(segment.start - 0.5 <= w.start <= segment.end + 0.5 for w in segment.words)


def _joined(clip_names: list[str], gap_seconds: float) -> tuple[np.ndarray, list[float]]:
    gap = np.zeros(int(gap_seconds * SAMPLE_RATE), dtype=np.float32)
    parts, offsets, position = [], [], 0
    for name in clip_names:
        offsets.append(position / SAMPLE_RATE)
        audio = load_audio(name)
        parts += [audio, gap]
        position += len(audio) + len(gap)
    return np.concatenate(parts), offsets


@pytest.mark.slow
def test_long_form_stitches_windows_with_exact_times(transcriber: Transcriber) -> None:
    by_name = {c.name: c for c in clips()}
    names = list(by_name) * 2  # ~70 s of speech, ~85 s with the gaps: three windows
    audio, offsets = _joined(names, gap_seconds=1.2)
    assert len(audio) / SAMPLE_RATE > 60
    result = transcriber.transcribe(audio, TranscribeOptions(language="en", word_timestamps=True))

    reference = " ".join(by_name[n].reference for n in names)
    assert wer(reference, result.text) <= OVERALL_WER_LIMIT, result.text
    assert len({s.seek for s in result.segments}) >= 3, "expected several windows"
    times = [t for s in result.segments for t in (s.start, s.end)]
    assert times == sorted(times) and times[-1] <= result.duration + 0.01
    assert [s.id for s in result.segments] == list(range(len(result.segments)))

    words = result.words
    spoken = [normalize(w.word) for w in words]
    for name, offset in zip(names, offsets, strict=True):
        first_word = normalize(by_name[name].reference).split()[0]
        candidates = [w.start for w, s in zip(words, spoken, strict=True) if s == first_word]
        nearest = min(candidates, key=lambda start: abs(start - offset))
        assert abs(nearest - offset) < 1.0, (name, offset, nearest)


def test_stream_yields_the_same_segments_as_transcribe(transcriber: Transcriber) -> None:
    audio, _ = _joined(["jfk.wav", "librivox-0870.wav", "jfk.wav", "librivox-0920.wav"], 1.0)
    options = TranscribeOptions(language="en")
    whole = transcriber.transcribe(audio, options)
    stream = transcriber.stream(audio, options, batch_windows=1)
    streamed = list(stream)
    # the same tokens, text and times; scores may differ slightly, since the batch a window
    # is decoded in changes the order of floating-point sums, and on CPUs the vocabulary
    # projection rounds logits to bfloat16 (steps of 1/8 at logits of 16-32)
    assert [_decoded(s) for s in streamed] == [_decoded(s) for s in whole.segments]
    for one, other in zip(streamed, whole.segments, strict=True):
        assert one.avg_logprob == pytest.approx(other.avg_logprob, abs=0.02)
        assert one.no_speech_prob == pytest.approx(other.no_speech_prob, abs=0.02)
    assert stream.result.text == whole.text
    assert stream.result.segments == tuple(streamed)


def _decoded(segment) -> tuple:
    return (segment.id, segment.seek, segment.start, segment.end, segment.text, segment.tokens)


def test_temperature_fallback_climbs_the_ladder(transcriber: Transcriber) -> None:
    # no real window reaches an average log-probability of 0, so every temperature is tried
    # and the last decode (at 1.0) is the one kept
    options = TranscribeOptions(language="en", logprob_threshold=-0.0001, no_speech_threshold=None)
    result = transcriber.transcribe(load_audio("librivox-0930.wav"), options)
    assert {s.temperature for s in result.segments} == {1.0}
    greedy = transcriber.transcribe(load_audio("librivox-0930.wav"), TranscribeOptions())
    assert {s.temperature for s in greedy.segments} == {0.0}


def test_silence_gives_no_segments(transcriber: Transcriber) -> None:
    result = transcriber.transcribe(
        np.zeros(5 * SAMPLE_RATE, dtype=np.float32), TranscribeOptions(language="en")
    )
    assert result.text == "" and result.segments == ()


def test_prompt_is_used_as_previous_text(transcriber: Transcriber) -> None:
    audio = load_audio("librivox-0870.wav")
    # the clip says "mister john dashwood"; a prompt with the spelled-out title keeps it
    result = transcriber.transcribe(
        audio, TranscribeOptions(language="en", prompt="Mister John Dashwood and Mister Ferrars.")
    )
    assert "Mister" in result.text
    assert wer(clips()[0].reference, result.text) <= CLIP_WER_LIMIT


def test_token_logprobs_match_the_text(transcriber: Transcriber) -> None:
    result = transcriber.transcribe(
        load_audio("librivox-0880.wav"), TranscribeOptions(language="en", token_logprobs=True)
    )
    assert "".join(t.token for t in result.logprobs).strip() == result.text
    assert all(t.logprob <= 0 for t in result.logprobs)
    assert b"".join(bytes(t.bytes) for t in result.logprobs).decode().strip() == result.text


def test_cancel_stops_before_decoding(transcriber: Transcriber) -> None:
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled):
        transcriber.transcribe(load_audio("jfk.wav"), TranscribeOptions(), cancel=cancel)


@pytest.mark.parametrize(
    ("field", "value"),
    [("language", "xx"), ("task", "summarize"), ("temperature", 1.5), ("max_new_tokens", 0)],
)
def test_bad_options_raise_with_the_field_named(field: str, value: object) -> None:
    with pytest.raises(InvalidOption) as error:
        TranscribeOptions(**{field: value})
    assert error.value.param == field


def test_language_names_are_accepted() -> None:
    assert TranscribeOptions(language="German").language == "de"
    assert TranscribeOptions(language="EN").language == "en"
