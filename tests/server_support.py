"""Shared helpers for the server tests: a running app in-process, real speech, a gate."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
from speech import SPEECH_DIR, clips, wer

from server.app import create_app
from server.settings import Settings
from whisper_engine.backends.base import AlignmentRequest, Backend, WindowOutput, WindowRequest
from whisper_engine.model import WhisperModel

JFK = SPEECH_DIR / "jfk.wav"


def reference_text(path: Path) -> str:
    return {clip.name: clip.reference for clip in clips()}[path.name]


def word_error_rate(reference: str, hypothesis: str) -> float:
    """WER after Whisper's English normalisation (case, punctuation, spellings)."""
    return wer(reference, hypothesis)


@asynccontextmanager
async def running_app(settings: Settings, model: WhisperModel) -> AsyncIterator[httpx.AsyncClient]:
    """The app through its whole lifespan (load, warm up, ready ... drain, close), with an
    httpx client talking to it in-process."""
    app = create_app(settings, model=model)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            yield client


def audio_upload(path: Path, **fields: str | list[str]) -> dict[str, object]:
    """Keyword arguments for ``client.post``: the file plus form fields."""
    return {"files": {"file": (path.name, path.read_bytes(), "audio/wav")}, "data": fields}


@dataclass
class GatedModel:
    """A loaded model whose backend waits at a gate before every call (to hold a request)."""

    model_id: str
    tokenizer: object
    backend: GatedBackend
    config: dict
    real: WhisperModel | None = None

    def aligner(self) -> Backend:
        assert self.real is not None
        return self.real.aligner()

    @property
    def suppress_ids(self) -> tuple[int, ...]:
        return tuple(self.config.get("suppress_tokens") or ())

    def transcriber(self, backend: Backend | None = None):  # the WhisperModel method
        return WhisperModel.transcriber(self, backend)  # type: ignore[arg-type]

    def close(self) -> None:
        """The real model belongs to the test session; leave it open."""

    @classmethod
    def around(cls, model: WhisperModel) -> GatedModel:
        return cls(
            model.model_id, model.tokenizer, GatedBackend(model.backend), model.config, model
        )


class GatedBackend:
    """Delegates to a real backend, but each call first waits until the gate is open."""

    def __init__(self, backend: Backend) -> None:
        self.inner = backend
        self.name = backend.name
        self.device = backend.device
        self.max_target_positions = backend.max_target_positions
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = threading.Event()  # set once a call waits at the closed gate
        self.calls = 0  # calls received, of any kind
        self.failure: Exception | None = None  # raised by every call while set

    def _pass(self) -> None:
        self.calls += 1
        if not self.gate.is_set():
            self.waiting.set()
        self.gate.wait()
        if self.failure is not None:
            raise self.failure

    def generate(self, requests: Sequence[WindowRequest]) -> list[WindowOutput]:
        self._pass()
        return self.inner.generate(requests)

    def next_token_logprobs(
        self, audios: Sequence[np.ndarray], prompt_ids: tuple[int, ...], candidates: Sequence[int]
    ) -> np.ndarray:
        self._pass()
        return self.inner.next_token_logprobs(audios, prompt_ids, candidates)

    def alignment_weights(self, requests: Sequence[AlignmentRequest]) -> list[np.ndarray] | None:
        self._pass()
        return self.inner.alignment_weights(requests)

    def close(self) -> None:
        """Owned by the real model."""
