"""Long-form transcription: language, windows, batched decoding, segments, words."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from whisper_engine.alignment import align_words
from whisper_engine.backends.base import SAMPLE_RATE, AlignmentRequest, Backend
from whisper_engine.decoding import (
    DecodedWindow,
    WindowDecoder,
    WindowPlan,
    is_silence,
    token_rules,
)
from whisper_engine.errors import Cancelled, InvalidOption
from whisper_engine.options import TranscribeOptions
from whisper_engine.results import Segment, TokenLogprob, Transcription, Word
from whisper_engine.segments import RawSegment, split_segments
from whisper_engine.tokenizer import WhisperTokenizer
from whisper_engine.windows import SpeechMap, Window, plan_windows

MEL_HOP = 160  # samples per mel frame: a segment's ``seek`` is in these units
AUDIO_FRAME = 320  # samples per encoder frame (20 ms)
# Whisper leaves out an utterance it believes the window's end cuts off. Windows end at quiet
# moments, so such a left-out utterance lies whole between the last segment and the window's
# end: that tail is decoded again as a window of its own when it is long enough to hold one.
MAX_TAIL_ROUNDS = 2
# Timestamps are coarse (small models often emit whole seconds): the second after the last
# segment's end may still hold its last syllable. A tail is decoded only when, past that
# second, it holds at least half a second of speech; decoding a lone syllable makes the
# model invent a word.
TAIL_GUARD_SECONDS = 1.0
MIN_TAIL_SPEECH_SECONDS = 0.5


@dataclass(frozen=True)
class LanguageGuess:
    code: str
    probability: float | None


class Transcriber:
    """Turns audio into a ``Transcription`` through any ``Backend`` (or a pool of them)."""

    def __init__(
        self,
        tokenizer: WhisperTokenizer,
        backend: Backend,
        *,
        suppress_ids: Sequence[int] = (),
        stream_batch_windows: int = 4,
        aligner: Callable[[], Backend] | None = None,
        supports_previous_text: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.backend = backend
        self.rules = token_rules(tokenizer, suppress_ids)
        self.decoder = WindowDecoder(backend, tokenizer, self.rules)
        self.stream_batch_windows = stream_batch_windows
        self.aligner = aligner  # for word timings when ``backend`` gives no cross-attention
        self.supports_previous_text = supports_previous_text

    def transcribe(
        self,
        audio: np.ndarray,
        options: TranscribeOptions,
        *,
        cancel: threading.Event | None = None,
        progress: Callable[[float], None] | None = None,
    ) -> Transcription:
        """Decode every window of the audio together, as one batch."""
        stream = TranscriptionStream(self, audio, options, cancel, batch_windows=None)
        for _ in stream:
            if progress is not None:
                progress(stream.seconds_done)
        return stream.result

    def stream(
        self,
        audio: np.ndarray,
        options: TranscribeOptions,
        *,
        cancel: threading.Event | None = None,
        batch_windows: int | None = None,
    ) -> TranscriptionStream:
        """Segments in order, a few windows at a time, as each batch finishes."""
        return TranscriptionStream(
            self, audio, options, cancel, batch_windows or self.stream_batch_windows
        )

    def detect_language(self, audio: np.ndarray) -> LanguageGuess:
        """The most likely language of the first 30 s, with its probability."""
        special = self.tokenizer.special
        if not self.tokenizer.is_multilingual:
            return LanguageGuess("en", None)
        codes = list(special.languages)
        first = plan_windows(audio)[0]
        logprobs = self.backend.next_token_logprobs(
            [audio[first.start : first.end]], (special.sot,), [special.languages[c] for c in codes]
        )[0]
        best = int(np.argmax(logprobs))
        return LanguageGuess(codes[best], float(math.exp(logprobs[best])))


class TranscriptionStream:
    """An iterator of ``Segment``; ``result`` holds the whole ``Transcription`` at the end."""

    def __init__(
        self,
        transcriber: Transcriber,
        audio: np.ndarray,
        options: TranscribeOptions,
        cancel: threading.Event | None,
        batch_windows: int | None,
    ) -> None:
        self._t = transcriber
        self._audio = np.ascontiguousarray(audio, dtype=np.float32)
        self._options = options
        self._cancel = cancel
        self._batch_windows = batch_windows
        self._result: Transcription | None = None
        self.seconds_done = 0.0
        self._segments = self._run()

    def __iter__(self) -> Iterator[Segment]:
        return self._segments

    @property
    def result(self) -> Transcription:
        if self._result is None:
            raise RuntimeError("The transcription is complete only once its segments are read")
        return self._result

    def _check_cancel(self) -> None:
        if self._cancel is not None and self._cancel.is_set():
            raise Cancelled("The transcription was cancelled")

    def _run(self) -> Iterator[Segment]:
        t, options = self._t, self._options
        if options.prompt and not t.supports_previous_text:
            raise InvalidOption(
                "prompt",
                "A previous-text prompt is not supported by this engine (TensorRT-LLM requires "
                "the decoder prompt to start with <|startoftranscript|>; moving the text after "
                "the task tokens would make the model treat it as already spoken). Leave the "
                "prompt out, or serve with the torch backend.",
            )
        self._check_cancel()
        speech = SpeechMap.of(self._audio)
        windows = plan_windows(self._audio, energy=speech.energy)
        if options.language is not None:
            language = LanguageGuess(options.language, None)
        else:
            opening = windows[0]  # the language is detected from the first window
            language = t.detect_language(self._audio[opening.start : opening.end])
        prompt = t.tokenizer.decoder_prompt(
            language.code, options.task, options.with_timestamps, options.prompt
        )
        segments: list[Segment] = []
        logprobs: list[TokenLogprob] = []
        size = self._batch_windows or max(1, len(windows))
        for first in range(0, len(windows), size):
            self._check_cancel()
            batch = windows[first : first + size]
            decoded = self._decode_with_tails(batch, prompt, speech, language.code, first)
            decoded.sort(key=lambda item: item[0].start)
            new = [
                replace(segment, id=len(segments) + i)
                for i, segment in enumerate(s for _, _, pieces in decoded for s in pieces)
            ]
            if options.token_logprobs:
                for _, result, _ in decoded:
                    logprobs.extend(self._token_logprobs(result))
            segments.extend(new)
            self.seconds_done = batch[-1].end / SAMPLE_RATE
            yield from new
        self._result = Transcription(
            text="".join(s.text for s in segments).strip(),
            language=language.code,
            language_probability=language.probability,
            duration=len(self._audio) / SAMPLE_RATE,
            task=options.task,
            segments=tuple(segments),
            logprobs=tuple(logprobs),
        )

    def _decode_with_tails(
        self,
        windows: list[Window],
        prompt: tuple[int, ...],
        speech: SpeechMap,
        language: str,
        seed: int,
    ) -> list[tuple[Window, DecodedWindow, list[Segment]]]:
        """Every window that holds speech, decoded, with the tails it left out decoded too."""
        t, options = self._t, self._options
        done: list[tuple[Window, DecodedWindow, list[Segment]]] = []
        pending = [w for w in windows if speech.has_speech(w.start, w.end)]
        for round_number in range(MAX_TAIL_ROUNDS + 1):
            if not pending:
                break
            self._check_cancel()
            plans = [
                WindowPlan(self._audio[w.start : w.end], prompt, seed=seed + i)
                for i, w in enumerate(pending)
            ]
            decoded = t.decoder.decode(plans, options)
            kept = [i for i, result in enumerate(decoded) if not is_silence(result, options)]
            words = (
                self._align([plans[i] for i in kept], [decoded[i] for i in kept], language)
                if options.word_timestamps
                else [[] for _ in kept]
            )
            tails = []
            for i, window_words in zip(kept, words, strict=True):
                window, result = pending[i], decoded[i]
                raw = split_segments(
                    result.output.token_ids, t.rules.timestamp_begin, window.seconds
                )
                done.append(
                    (window, result, self._window_segments(window, raw, result, window_words))
                )
                tail = _left_out_tail(window, raw, speech)
                if tail is not None and round_number < MAX_TAIL_ROUNDS:
                    tails.append(tail)
            pending = tails
        return done

    def _window_segments(
        self, window: Window, raw: list[RawSegment], result: DecodedWindow, words: list[Word]
    ) -> list[Segment]:
        segments = []
        for piece, piece_words in zip(raw, _words_per_segment(raw, words), strict=True):
            text = self._t.tokenizer.decode(piece.text_tokens)
            if text.strip():
                segments.append(_segment(window, piece, text, result, piece_words))
        return segments

    def _align(
        self, plans: list[WindowPlan], decoded: list[DecodedWindow], language: str
    ) -> list[list[Word]]:
        t = self._t
        eot = t.rules.eot
        texts = [[tok for tok in d.output.token_ids if tok < eot] for d in decoded]
        requests = [
            AlignmentRequest(plan.audio, (*plan.prompt_ids, *text, eot))
            for plan, text in zip(plans, texts, strict=True)
        ]
        weights = t.backend.alignment_weights(requests)
        if weights is None and t.aligner is not None:
            weights = t.aligner().alignment_weights(requests)
        if weights is None:
            return [[] for _ in plans]
        aligned = []
        for plan, result, text, w in zip(plans, decoded, texts, weights, strict=True):
            probs = [
                math.exp(lp)
                for tok, lp in zip(result.output.token_ids, result.output.logprobs, strict=True)
                if tok < eot
            ]
            words, groups = t.tokenizer.split_to_words(text, language)
            frames = math.ceil(len(plan.audio) / AUDIO_FRAME)
            timed = align_words(w, len(plan.prompt_ids), text, probs, words, groups, frames)
            aligned.append([Word(x.word, x.start, x.end, x.probability) for x in timed])
        return aligned

    def _token_logprobs(self, window: DecodedWindow) -> list[TokenLogprob]:
        tokenizer, eot = self._t.tokenizer, self._t.rules.eot
        return [
            TokenLogprob(tokenizer.decode([tok]), lp, tuple(tokenizer.token_bytes(tok)))
            for tok, lp in zip(window.output.token_ids, window.output.logprobs, strict=True)
            if tok < eot
        ]


def _left_out_tail(window: Window, raw: list[RawSegment], speech: SpeechMap) -> Window | None:
    """The end of the window after its last segment, when it holds a left-out utterance."""
    if not raw:
        return None
    start = window.start + int(raw[-1].end * SAMPLE_RATE)
    guarded = start + int(TAIL_GUARD_SECONDS * SAMPLE_RATE)
    if speech.speech_seconds(guarded, window.end) < MIN_TAIL_SPEECH_SECONDS:
        return None
    return Window(start, window.end)


def _words_per_segment(raw: list[RawSegment], words: list[Word]) -> list[list[Word]]:
    """Hand the window's words (relative times) to its segments in order, by time."""
    if not words:
        return [[] for _ in raw]
    groups: list[list[Word]] = [[] for _ in raw]
    for word in words:
        middle = (word.start + word.end) / 2
        target = next((i for i, s in enumerate(raw) if middle < s.end), len(raw) - 1)
        groups[target].append(word)
    return groups


def _segment(
    window: Window,
    piece: RawSegment,
    text: str,
    result: DecodedWindow,
    words: list[Word],
) -> Segment:
    offset = window.start_seconds
    window_end = offset + window.seconds
    start = round(offset + piece.start, 3)
    end = round(max(offset + piece.end, start), 3)
    return Segment(
        id=0,  # numbered once the batch's segments are in time order
        seek=window.start // MEL_HOP,
        start=start,
        end=end,
        text=text,
        tokens=piece.tokens,
        temperature=result.temperature,
        avg_logprob=result.avg_logprob,
        compression_ratio=result.compression_ratio,
        no_speech_prob=result.no_speech_prob,
        words=tuple(
            Word(
                w.word,
                round(min(offset + w.start, window_end), 3),
                round(min(offset + w.end, window_end), 3),
                w.probability,
            )
            for w in words
        ),
    )
