"""Server settings: defaults, then a YAML file, then ``WHISPER_*`` environment variables.

Nested groups are set from the environment with ``__``: ``WHISPER_LIMITS__MAX_UPLOAD_BYTES``.
"""

from __future__ import annotations

import json
import os
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, Field, field_validator
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

CONFIG_ENV = "WHISPER_CONFIG"
OPENAI_MODEL_ALIAS = "whisper-1"

# The YAML file given to load_settings(); beats WHISPER_CONFIG, without touching os.environ.
_config_file: ContextVar[str | None] = ContextVar("whisper_config_file", default=None)

NameList = Annotated[list[str], NoDecode]  # "a,b" or '["a", "b"]' in the environment


class LimitSettings(BaseModel):
    """What one request may ask for, and how much work the server takes on at once."""

    max_upload_bytes: int = Field(default=26_214_400, ge=1)
    """Largest accepted upload, in bytes (OpenAI's limit is 25 MiB). Larger: 413."""

    max_audio_seconds: float = Field(default=3 * 3600.0, gt=0)
    """Longest accepted audio after decoding, in seconds. Longer: 400."""

    max_concurrent_requests: int = Field(default=8, ge=1)
    """Transcriptions decoding audio or running on the engine at the same time."""

    max_queued_requests: int = Field(default=64, ge=0)
    """Transcriptions waiting for a free slot; one more is refused with 429 and Retry-After."""

    retry_after_seconds: int = Field(default=1, ge=0)
    """The Retry-After value sent with 429."""


class EngineSettings(BaseModel):
    """How the engine batches work."""

    max_batch_windows: int = Field(default=16, ge=1)
    """Most 30 s windows (of any requests) decoded together in one forward pass."""

    engines: int | None = Field(default=None, ge=1)
    """Engines (model copies) decoding in parallel, over the same checkpoint. None: one per
    visible CUDA GPU (cuda:0..N-1), or one on the CPU or on a device pinned as cuda:N. More
    engines than GPUs share the GPUs round-robin. A failed engine is restarted in place."""

    warmup: bool = True
    """Decode one second of silence before reporting ready (compiles kernels, fills caches)."""


class Settings(BaseSettings):
    """Everything the server can be told. See README.md for the environment variable names."""

    model_config = SettingsConfigDict(
        env_prefix="WHISPER_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
    )

    host: str = Field(default="127.0.0.1", min_length=1)
    """Address to listen on; 0.0.0.0 to accept connections from other machines."""

    port: int = Field(default=8000, ge=0, le=65535)
    """TCP port to listen on."""

    model: str | None = Field(default=None, min_length=1)
    """A Hugging Face model id or local checkpoint directory; None: the embedded whisper-base."""

    backend: Literal["auto", "torch", "trtllm"] = "auto"
    """Which engine decodes: TensorRT-LLM, PyTorch, or auto (TensorRT-LLM when usable)."""

    device: str | None = Field(default=None, pattern=r"^(cpu|cuda(:\d+)?)$")
    """cpu, cuda or cuda:N; None: a GPU when one is present, else the CPU."""

    served_model_name: NameList = Field(default_factory=lambda: [OPENAI_MODEL_ALIAS])
    """Extra names clients may send as ``model`` (the loaded model's id always works)."""

    api_keys: NameList = Field(default_factory=list)
    """Accepted ``Authorization: Bearer`` keys; empty: no authentication."""

    cors_origins: NameList = Field(default_factory=list)
    """Origins browsers may call from ("*" for any); empty: no CORS headers."""

    limits: LimitSettings = Field(default_factory=LimitSettings)
    """Request limits and admission control."""

    engine: EngineSettings = Field(default_factory=EngineSettings)
    """Engine batching."""

    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    """Logging verbosity of the server and uvicorn."""

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_case_level(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @field_validator("api_keys", "served_model_name", "cors_origins", mode="before")
    @classmethod
    def _split_comma_list(cls, value: Any) -> Any:
        """Accept "a,b" as well as a JSON list (environment variables are easier that way)."""
        if isinstance(value, str):
            if value.lstrip().startswith("["):
                return json.loads(value)
            return [item.strip() for item in value.split(",") if item.strip()]
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Explicit arguments beat the environment, which beats the YAML file.
        return (init_settings, env_settings, _YamlFileSource(settings_cls))

    def model_names(self, model_id: str) -> list[str]:
        """Every name accepted as ``model``: the loaded model's id first, then the aliases."""
        names = [model_id]
        for name in [*self.served_model_name, OPENAI_MODEL_ALIAS]:
            if name not in names:
                names.append(name)
        return names


class _YamlFileSource(InitSettingsSource):
    """Values from the YAML file named by ``WHISPER_CONFIG`` (``--config``), if any."""

    def __init__(self, settings_cls: type[BaseSettings]) -> None:
        path = _config_file.get() or os.environ.get(CONFIG_ENV)
        super().__init__(settings_cls, _read_yaml(path))


def _read_yaml(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the settings file must hold a mapping of names to values")
    return data


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """Settings from ``config_file`` (else ``WHISPER_CONFIG``), the environment and overrides."""
    token = _config_file.set(str(config_file) if config_file is not None else None)
    try:
        return Settings(**overrides)
    finally:
        _config_file.reset(token)
