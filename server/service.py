"""The transcription service behind the routes: admission, audio decoding and the engine,
all off the event loop, with cancellation when the client goes away."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import anyio
import numpy as np
from starlette.datastructures import UploadFile
from starlette.types import Receive

from server import formats
from server.admission import AdmissionControl
from server.errors import APIError, from_exception, model_not_found, not_ready
from server.metrics import ServerMetrics
from server.streaming import TextDeltas
from whisper_engine.audio import decode_audio
from whisper_engine.errors import (
    AudioDecodeError,
    AudioTooLong,
    Cancelled,
    InvalidOption,
    WhisperEngineError,
)
from whisper_engine.options import TranscribeOptions
from whisper_engine.results import Segment, Transcription
from whisper_engine.transcribe import Transcriber

logger = logging.getLogger(__name__)

T = TypeVar("T")
_END = object()


@dataclass
class TranscriptionService:
    transcriber: Transcriber
    admission: AdmissionControl
    metrics: ServerMetrics
    model_names: list[str]
    max_audio_seconds: float
    ready: bool = False

    def require_ready(self) -> None:
        if not self.ready:
            raise not_ready()

    def check_model(self, name: str) -> None:
        if name not in self.model_names:
            raise model_not_found(name)

    async def decode_upload(self, upload: UploadFile) -> np.ndarray:
        await upload.seek(0)
        return await anyio.to_thread.run_sync(
            lambda: decode_audio(upload.file, max_seconds=self.max_audio_seconds)
        )

    async def transcribe(
        self, upload: UploadFile, options: TranscribeOptions, receive: Receive
    ) -> Transcription:
        """Decode and transcribe in worker threads; stop early if the client disconnects."""
        await self._admit(upload)
        try:
            audio = await self.decode_upload(upload)
            cancel = threading.Event()
            result = await _run_until_disconnect(
                lambda: self.transcriber.transcribe(audio, options, cancel=cancel),
                receive,
                cancel,
            )
        except Cancelled:
            self.metrics.cancelled.inc()
            raise
        except Exception as exc:
            self._count_engine_error(exc)
            raise
        finally:
            self.admission.release()
        self.metrics.audio_seconds.labels(options.task).inc(result.duration)
        return result

    async def open_stream(
        self, upload: UploadFile, options: TranscribeOptions
    ) -> tuple[AsyncIterator[str], Callable[[], None]]:
        """Admit and decode now (so errors are still plain HTTP errors), then return the SSE
        events and the release callback the response must call once it is done."""
        await self._admit(upload)
        try:
            audio = await self.decode_upload(upload)
        except BaseException:
            self.admission.release()
            raise
        return self._events(audio, options), self.admission.release

    async def _events(self, audio: np.ndarray, options: TranscribeOptions) -> AsyncIterator[str]:
        cancel = threading.Event()
        stream = self.transcriber.stream(audio, options, cancel=cancel)
        segments: Iterator[Segment] = iter(stream)
        deltas = TextDeltas()
        finished = False
        try:
            while (segment := await anyio.to_thread.run_sync(next, segments, _END)) is not _END:
                assert isinstance(segment, Segment)
                if delta := deltas.add(segment):
                    yield formats.text_delta_event(delta)
            result = stream.result
            if delta := deltas.finish(result):
                yield formats.text_delta_event(delta)
            self.metrics.audio_seconds.labels(options.task).inc(result.duration)
            finished = True
            yield formats.text_done_event(result)
        except Exception as exc:  # the response has started: report in the stream
            self._count_engine_error(exc)
            if not isinstance(exc, WhisperEngineError):
                logger.exception("Streaming transcription failed")
            finished = True
            yield formats.sse_event({"type": "error", **from_exception(exc).body()})
        finally:
            if not finished:
                self.metrics.cancelled.inc()
            cancel.set()  # a client that went away stops the remaining windows

    async def _admit(self, upload: UploadFile) -> None:
        """Refuse what needs no slot to refuse, then wait for a slot (429 when none is near)."""
        self.require_ready()
        if not upload.size:
            raise APIError(400, "The audio file is empty.", param="file")
        try:
            await self.admission.acquire()
        except WhisperEngineError:
            self.metrics.rejected.inc()
            raise

    def _count_engine_error(self, exc: BaseException) -> None:
        """Failures of the engine itself; bad input and cancellations are not counted."""
        if not isinstance(exc, (Cancelled, AudioDecodeError, AudioTooLong, InvalidOption)):
            self.metrics.engine_errors.labels(type(exc).__name__).inc()


async def _run_until_disconnect(
    work: Callable[[], T], receive: Receive, cancel: threading.Event
) -> T:
    """Run ``work`` in a worker thread while watching the connection: a disconnect sets
    ``cancel`` so the engine stops before its next batch of windows."""

    async def watch() -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                cancel.set()
                return
            await asyncio.sleep(0.1)  # a stray body message: do not spin

    watcher = asyncio.ensure_future(watch())
    try:
        return await anyio.to_thread.run_sync(work)
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
