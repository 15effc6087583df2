"""The FastAPI application factory.

``create_app(settings, model)`` builds an app; its lifespan loads the model (unless one is
given, as tests do to share it), puts an ``EnginePool`` and a ``Transcriber`` in front of it,
warms up, then reports ready. ``app_from_env`` is the zero-argument factory for
``uvicorn --factory server.app:app_from_env``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import numpy as np
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from server.admission import AdmissionControl
from server.errors import install_error_handlers
from server.metrics import MetricsMiddleware, ServerMetrics
from server.middleware import ApiKeyMiddleware, UploadLimitMiddleware
from server.routers import audio, models, probes
from server.service import TranscriptionService
from server.settings import Settings
from whisper_engine.backends.base import SAMPLE_RATE, Backend
from whisper_engine.backends.devices import engine_devices
from whisper_engine.model import WhisperModel, load_model
from whisper_engine.options import TranscribeOptions
from whisper_engine.pool import EnginePool
from whisper_engine.transcribe import Transcriber

logger = logging.getLogger(__name__)

# Room for the multipart envelope and the form fields around the file itself.
MULTIPART_OVERHEAD_BYTES = 64 * 1024
DRAIN_SECONDS = 30.0


def create_app(settings: Settings | None = None, model: WhisperModel | None = None) -> FastAPI:
    """An app serving ``model`` (already loaded, and then left open at shutdown) or the model
    that ``settings`` names (loaded at startup and closed at shutdown)."""
    settings = settings if settings is not None else Settings()
    metrics = ServerMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with _serving(app, settings, model, metrics):
            yield

    app = FastAPI(
        title="whisper-serve",
        summary="OpenAI-compatible speech-to-text with Whisper",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.service = None
    app.state.started_at = int(time.time())
    install_error_handlers(app)
    for router in (audio.router, models.router, probes.router):
        app.include_router(router)
    # Added innermost first: metrics see every answer, CORS headers go on errors too, and
    # the key is checked before any of the upload is read.
    app.add_middleware(
        UploadLimitMiddleware,
        max_bytes=settings.limits.max_upload_bytes + MULTIPART_OVERHEAD_BYTES,
        paths=audio.AUDIO_PATHS,
    )
    app.add_middleware(ApiKeyMiddleware, api_keys=settings.api_keys)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type"],
        )
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    return app


def app_from_env() -> FastAPI:
    """Zero-argument factory: settings from ``WHISPER_*`` variables and ``WHISPER_CONFIG``."""
    return create_app(Settings())


@asynccontextmanager
async def _serving(
    app: FastAPI, settings: Settings, model: WhisperModel | None, metrics: ServerMetrics
) -> AsyncIterator[None]:
    devices = engine_devices(settings.device, settings.engine.engines)
    loaded = model
    if loaded is None:
        loaded = await anyio.to_thread.run_sync(_load, settings, devices[0])
    pool, extra_engines = await anyio.to_thread.run_sync(
        start_engines, settings, loaded, devices, model is None
    )
    app.state.pool = pool
    limits = settings.limits
    admission = AdmissionControl(
        limits.max_concurrent_requests, limits.max_queued_requests, limits.retry_after_seconds
    )
    service = TranscriptionService(
        transcriber=loaded.transcriber(pool),
        admission=admission,
        metrics=metrics,
        model_names=settings.model_names(loaded.model_id),
        max_audio_seconds=limits.max_audio_seconds,
    )
    metrics.track(
        lambda: admission.running, lambda: admission.waiting, lambda: pool.pending_windows
    )
    app.state.service = service
    try:
        if settings.engine.warmup:
            await anyio.to_thread.run_sync(_warm_up, service.transcriber)
        service.ready = True
        logger.info("Serving %s as %s", loaded.model_id, service.model_names)
        yield
    finally:
        service.ready = False
        with anyio.move_on_after(DRAIN_SECONDS):
            await admission.wait_idle()
        await anyio.to_thread.run_sync(pool.close)
        for engine in extra_engines:
            engine.close()
        if model is None:
            loaded.close()


def _load(settings: Settings, device: str | None) -> WhisperModel:
    return load_model(settings.model, backend=settings.backend, device=device)


def start_engines(
    settings: Settings,
    model: WhisperModel,
    devices: list[str | None],
    restart: bool,
) -> tuple[EnginePool, list[Backend]]:
    """A pool over ``model.backend`` and one more engine per further entry of ``devices``.
    Returns the pool and the engines started here (the caller closes them after the pool).
    ``restart``: replace an engine that fails with a new one on its device; only for a model
    the server loaded itself (a model handed in belongs to its caller and stays as it is)."""
    extra = [model.start_backend(device) for device in devices[1:]]

    def restart_engine(slot: int) -> Backend:
        return model.start_backend(devices[slot])

    pool = EnginePool(
        [model.backend, *extra],
        max_batch_windows=settings.engine.max_batch_windows,
        factory=restart_engine if restart else None,
    )
    return pool, extra


def _warm_up(transcriber: Transcriber) -> None:
    """One short decode so the first request does not pay for lazy initialisation."""
    silence = np.zeros(SAMPLE_RATE, dtype=np.float32)
    transcriber.transcribe(silence, TranscribeOptions(language="en"))
