"""Settings: defaults, the YAML file, WHISPER_* variables (nested with __), validation."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from server.settings import Settings, load_settings

CPU_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "cpu.yaml"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in list(os.environ):
        if name.startswith("WHISPER_"):
            monkeypatch.delenv(name)


def test_defaults():
    settings = Settings()
    assert (settings.host, settings.port, settings.model, settings.backend) == (
        "127.0.0.1",
        8000,
        None,
        "auto",
    )
    assert settings.api_keys == [] and settings.cors_origins == []
    assert settings.limits.max_upload_bytes == 26_214_400
    assert settings.model_names("whisper-base") == ["whisper-base", "whisper-1"]


def test_cpu_config_file():
    settings = load_settings(CPU_CONFIG)
    assert (settings.backend, settings.device, settings.host) == ("torch", "cpu", "0.0.0.0")
    assert settings.limits.max_concurrent_requests == 2
    assert settings.engine.max_batch_windows == 4


def test_environment_beats_file_and_arguments_beat_environment(monkeypatch):
    monkeypatch.setenv("WHISPER_CONFIG", str(CPU_CONFIG))
    monkeypatch.setenv("WHISPER_LIMITS__MAX_QUEUED_REQUESTS", "3")
    monkeypatch.setenv("WHISPER_API_KEYS", "k1, k2")
    monkeypatch.setenv("WHISPER_SERVED_MODEL_NAME", '["whisper-1", "large"]')
    monkeypatch.setenv("WHISPER_PORT", "9001")
    settings = load_settings(port=9002)
    assert settings.limits.max_queued_requests == 3
    assert settings.limits.max_concurrent_requests == 2  # from the file, merged with the env
    assert settings.api_keys == ["k1", "k2"]
    assert settings.model_names("m") == ["m", "whisper-1", "large"]
    assert settings.port == 9002


@pytest.mark.parametrize(
    "bad",
    [
        {"port": 70000},
        {"backend": "onnx"},
        {"device": "gpu"},
        {"log_level": "loud"},
        {"limits": {"max_upload_bytes": 0}},
        {"engine": {"max_batch_windows": 0}},
        {"colour": 1},
    ],
)
def test_invalid_values_are_refused(bad):
    with pytest.raises(ValidationError):
        Settings(**bad)
