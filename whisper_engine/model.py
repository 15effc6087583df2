"""Loading a Whisper model: checkpoint, tokenizer and backend, ready to transcribe."""

from __future__ import annotations

import importlib.util
import json
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from whisper_engine.backends.base import Backend
from whisper_engine.checkpoints import EMBEDDED_MODEL_ID, resolve_checkpoint
from whisper_engine.errors import InvalidOption
from whisper_engine.tokenizer import WhisperTokenizer
from whisper_engine.transcribe import Transcriber

log = logging.getLogger(__name__)

BACKENDS = ("auto", "torch", "trtllm")


@dataclass
class WhisperModel:
    model_id: str
    checkpoint_dir: Path
    tokenizer: WhisperTokenizer
    backend: Backend
    config: dict[str, Any] = field(repr=False)
    device: str | None = None
    _aligner: Backend | None = field(default=None, init=False, repr=False)
    _aligner_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @property
    def suppress_ids(self) -> tuple[int, ...]:
        return tuple(self.config.get("suppress_tokens") or ())

    def transcriber(self, backend: Backend | None = None) -> Transcriber:
        """A transcriber over this model's backend, or over ``backend`` (e.g. a pool of them)."""
        return Transcriber(
            self.tokenizer,
            backend or self.backend,
            suppress_ids=self.suppress_ids,
            aligner=self.aligner,
            supports_previous_text=getattr(self.backend, "supports_previous_text", True),
        )

    def aligner(self) -> Backend:
        """A backend that can give cross-attention for word timings: the model's own, or, for
        engines that expose none (TensorRT-LLM), the torch model of the same checkpoint, loaded
        on first use on the same device."""
        with self._aligner_lock:
            if self._aligner is None:
                from whisper_engine.backends.torch_backend import TorchBackend

                log.info("loading the torch model of %s for word timestamps", self.model_id)
                self._aligner = TorchBackend(self.checkpoint_dir, device=_torch_device(self.device))
            return self._aligner

    def start_backend(self, device: str | None = None, **backend_options: Any) -> Backend:
        """One more engine for this checkpoint and tokenizer, on the same kind of backend as
        ``self.backend``, on ``device`` (e.g. another GPU). The caller owns and closes it."""
        name = "trtllm" if self.backend.name == "trtllm" else "torch"
        return _start_backend(name, self.checkpoint_dir, self.tokenizer, device, backend_options)

    def close(self) -> None:
        self.backend.close()
        if self._aligner is not None:
            self._aligner.close()


def _torch_device(device: str | None) -> str | None:
    return device if device is None or device.startswith(("cpu", "cuda")) else None


def load_model(
    model: str | None = None,
    backend: str = "auto",
    device: str | None = None,
    **backend_options: Any,
) -> WhisperModel:
    """Resolve ``model`` (hub id, local dir, CTranslate2 dir, or None for the embedded model)
    and start it on ``backend``."""
    if backend not in BACKENDS:
        raise InvalidOption("backend", f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    checkpoint_dir = resolve_checkpoint(model)
    tokenizer = WhisperTokenizer.from_file(checkpoint_dir / "tokenizer.json")
    config = json.loads((checkpoint_dir / "config.json").read_text())
    chosen = resolve_backend_name(backend, device)
    log.info(
        "loading %s from %s on the %s backend", model or EMBEDDED_MODEL_ID, checkpoint_dir, chosen
    )
    engine = _start_backend(chosen, checkpoint_dir, tokenizer, device, backend_options)
    return WhisperModel(
        model or EMBEDDED_MODEL_ID, checkpoint_dir, tokenizer, engine, config, device=device
    )


def resolve_backend_name(backend: str, device: str | None) -> str:
    """``auto`` means TensorRT-LLM where it is installed and a GPU is asked for or present."""
    if backend != "auto":
        return backend
    if device == "cpu" or importlib.util.find_spec("tensorrt_llm") is None:
        return "torch"
    return "trtllm"


def _start_backend(
    name: str,
    checkpoint_dir: Path,
    tokenizer: WhisperTokenizer,
    device: str | None,
    options: dict[str, Any],
) -> Backend:
    if name == "trtllm":
        from whisper_engine.backends.trtllm import TrtllmBackend

        return TrtllmBackend(checkpoint_dir, tokenizer, device=device or "cuda:0", **options)
    from whisper_engine.backends.torch_backend import TorchBackend

    return TorchBackend(checkpoint_dir, device=device, **options)
