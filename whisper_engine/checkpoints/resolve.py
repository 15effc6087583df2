"""Turn a model name into a local directory in the Hugging Face Whisper layout."""

from __future__ import annotations

import json
import os
from pathlib import Path

from whisper_engine.checkpoints.cache import cache_root, convert_ct2_directory
from whisper_engine.checkpoints.embedded import EMBEDDED_MODEL_ID, embedded_checkpoint
from whisper_engine.checkpoints.hf_layout import CT2Files
from whisper_engine.errors import ModelLoadError

HF_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
HUB_PATTERNS = [
    "config.json",
    "generation_config.json",
    "preprocessor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "normalizer.json",
    "added_tokens.json",
    "special_tokens_map.json",
    "model.safetensors",
    "model.safetensors.index.json",
    "model-*.safetensors",
    # CTranslate2 / faster-whisper repositories
    "model.bin",
    "vocabulary.txt",
    "vocabulary.json",
]
HUB_TIMEOUT_S = 10.0


def resolve_checkpoint(
    model: str | None = None, *, cache_dir: Path | None = None, offline: bool | None = None
) -> Path:
    """A directory that ``WhisperForConditionalGeneration.from_pretrained`` loads.

    ``model`` is the embedded default (None, "" or "whisper-base"), a local directory in
    Hugging Face or CTranslate2 layout, or a Hugging Face hub id.
    """
    root = cache_root(cache_dir)
    if not model or model == EMBEDDED_MODEL_ID:
        return embedded_checkpoint(root)
    local = Path(model).expanduser()
    if local.is_dir():
        return _local_checkpoint(local, root, source=str(local.resolve()))
    if local.is_absolute() or model.startswith((".", "~")) or local.exists():
        raise ModelLoadError(f"Model directory '{model}' does not exist")
    return _local_checkpoint(_hub_snapshot(model, offline), root, source=f"hub:{model}")


def is_hf_layout(directory: Path) -> bool:
    config = directory / "config.json"
    if not config.is_file() or not any((directory / f).is_file() for f in HF_WEIGHT_FILES):
        return False
    try:
        return json.loads(config.read_text(encoding="utf-8")).get("model_type") == "whisper"
    except (OSError, ValueError, AttributeError):
        return False


def is_ct2_layout(directory: Path) -> bool:
    return all((directory / f).is_file() for f in ("model.bin", "config.json", "tokenizer.json"))


def _local_checkpoint(directory: Path, root: Path, source: str) -> Path:
    if is_hf_layout(directory):
        return directory
    if is_ct2_layout(directory):
        return convert_ct2_directory(CT2Files.in_directory(directory), root, "ct2", source)
    raise ModelLoadError(
        f"'{directory}' is neither a Hugging Face Whisper model (config.json with model_type "
        "'whisper' and model.safetensors) nor a CTranslate2 one (model.bin, config.json, "
        "tokenizer.json)"
    )


def _hub_offline(offline: bool | None) -> bool:
    if offline is not None:
        return offline
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _hub_snapshot(repo_id: str, offline: bool | None) -> Path:
    local_only = _hub_offline(offline)
    path = _snapshot_download(repo_id, HUB_PATTERNS, local_only)
    if not any((path / f).is_file() for f in (*HF_WEIGHT_FILES, "model.bin")):
        # Older repositories have PyTorch pickles only; fetched just when nothing else is.
        path = _snapshot_download(repo_id, [*HUB_PATTERNS, "pytorch_model.bin"], local_only)
    return path


def _snapshot_download(repo_id: str, patterns: list[str], local_only: bool) -> Path:
    import huggingface_hub  # only the hub path needs it

    try:
        path = huggingface_hub.snapshot_download(
            repo_id,
            allow_patterns=patterns,
            local_files_only=local_only,
            etag_timeout=HUB_TIMEOUT_S,
        )
    except Exception as exc:  # the hub raises many types: network, auth, validation, cache
        raise ModelLoadError(
            f"Model '{repo_id}' is not a local directory and could not be fetched from the "
            f"Hugging Face hub (offline or unreachable): {type(exc).__name__}: {exc}. "
            f"Pass a local directory or the embedded default '{EMBEDDED_MODEL_ID}'."
        ) from exc
    return Path(path)
