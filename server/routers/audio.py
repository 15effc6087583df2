"""POST /v1/audio/transcriptions and /v1/audio/translations: parse, run, format."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from server import formats
from server.dependencies import ServiceDependency, SettingsDependency
from server.errors import upload_too_large
from server.forms import AudioForm, TranscriptionFormDependency, TranslationFormDependency
from server.service import TranscriptionService
from server.settings import Settings

TRANSCRIPTIONS_PATH = "/v1/audio/transcriptions"
TRANSLATIONS_PATH = "/v1/audio/translations"
AUDIO_PATHS = (TRANSCRIPTIONS_PATH, TRANSLATIONS_PATH)

router = APIRouter(tags=["audio"])


@router.post(TRANSCRIPTIONS_PATH, summary="Transcribe audio into the input language")
async def create_transcription(
    request: Request,
    form: TranscriptionFormDependency,
    service: ServiceDependency,
    settings: SettingsDependency,
) -> Response:
    return await _answer(request, form, service, settings)


@router.post(TRANSLATIONS_PATH, summary="Translate audio into English")
async def create_translation(
    request: Request,
    form: TranslationFormDependency,
    service: ServiceDependency,
    settings: SettingsDependency,
) -> Response:
    return await _answer(request, form, service, settings)


async def _answer(
    request: Request, form: AudioForm, service: TranscriptionService, settings: Settings
) -> Response:
    try:
        service.check_model(form.model)
        options = form.to_options()
        if form.file.size is not None and form.file.size > settings.limits.max_upload_bytes:
            raise upload_too_large(settings.limits.max_upload_bytes)
        if form.stream:
            events, release = await service.open_stream(form.file, options)
            return _ReleasingStreamingResponse(events, release)
        transcription = await service.transcribe(form.file, options, request.receive)
    finally:
        await form.file.close()  # the samples are in memory by now; drop the spooled upload
    body = formats.render(
        transcription, form.response_format, words=form.words, logprobs=form.logprobs
    )
    return Response(body.content, media_type=body.media_type)


class _ReleasingStreamingResponse(StreamingResponse):
    """SSE that gives back its admission slot however the stream ends (done, error, or the
    client going away), including when it is never started."""

    def __init__(self, events: AsyncIterator[str], release: Callable[[], None]) -> None:
        super().__init__(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()
