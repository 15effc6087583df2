"""TensorRT-LLM engine arguments for a Whisper checkpoint, computed from its ``config.json``.

This module imports nothing from tensorrt_llm, torch or transformers, so the arguments can be
printed (``whisper-server engine-config``, ``configs/``) on a machine without them.

Why each argument (see docs/tensorrt-llm.md):
- ``max_input_len`` >= ``max_source_positions``: the cross-attention KV pool is sized from
  ``max_input_len`` (TensorRT-LLM issue #19514 / PR #19516); the default 1024 is smaller than
  the encoder's 1500 positions and every request then fails.
- ``max_seq_len`` unset: the model's ``infer_max_seq_len()`` gives max(source, target)
  positions; a hand-set value bigger than ``max_input_len`` fails at executor start-up.
- ``kv_cache_config.enable_block_reuse`` False: the C++ capacity scheduler dereferences an
  empty optional for feature-fed encoders while block reuse is on ("bad optional access",
  PRs #19450 / #19302, unreleased). Prefix reuse has nothing to match on audio features and
  Whisper's decoder prompts are a few tokens, so turning it off costs nothing.
- ``kv_cache_config.cross_kv_cache_fraction``: required for encoder-decoder models.
- ``max_num_tokens`` = ``max_source_positions`` x ``max_batch_size``: a request's encoder pass
  is scheduled as ``max_source_positions`` tokens; a full batch of fresh windows must fit in
  one iteration's token budget, or requests wait an iteration for each missing slot.
- ``enable_chunked_prefill`` False: the encoder phase cannot be chunked.
- ``scheduler_config.use_python_scheduler`` True: the Python capacity scheduler checks the
  optional that the C++ one dereferences.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
from pathlib import Path
from typing import Any

from whisper_engine.errors import InvalidOption, ModelLoadError

logger = logging.getLogger(__name__)

DEFAULT_MAX_BATCH_SIZE = 16
DEFAULT_FREE_GPU_MEMORY_FRACTION = 0.85
DEFAULT_CROSS_KV_CACHE_FRACTION = 0.5

# Installed TensorRT-LLM versions (``tensorrt_llm.__version__``, exact strings) whose C++
# capacity scheduler checks ``getEncoderUniqueTokens().has_value()`` (PRs #19450 / #19302).
# Empty: no release had the fix when this was written. Add a version once it ships.
VERSIONS_WITH_SCHEDULER_FIX: frozenset[str] = frozenset()
# Versions whose cross-KV pool is sized from the encoder length, not ``max_input_len``
# (issue #19514 / PR #19516). Empty for the same reason.
VERSIONS_WITH_CROSS_KV_FIX: frozenset[str] = frozenset()

SCHEDULER_BUG = (
    "TensorRT-LLM's C++ capacity scheduler crashes with 'bad optional access' on Whisper "
    "(encoder fed with features, not tokens) while KV-cache block reuse is on "
    "(capacityScheduler.cpp; fix PRs NVIDIA/TensorRT-LLM#19450 and #19302, not in a release)"
)
CROSS_KV_BUG = (
    "TensorRT-LLM sizes the cross-attention KV pool from max_input_len, not from the encoder's "
    "max_source_positions (issue NVIDIA/TensorRT-LLM#19514, PR #19516)"
)

REQUIRED_CONFIG_KEYS = ("max_source_positions", "max_target_positions")


def _check_model_config(model_config: dict[str, Any]) -> tuple[int, int]:
    missing = [key for key in REQUIRED_CONFIG_KEYS if key not in model_config]
    if missing:
        raise ModelLoadError(f"The checkpoint's config.json lacks {missing}: is it Whisper?")
    return int(model_config["max_source_positions"]), int(model_config["max_target_positions"])


def _merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` over ``base``; nested mappings (kv_cache_config, ...) merge key by key."""
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def trtllm_engine_args(
    model_config: dict[str, Any],
    *,
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    free_gpu_memory_fraction: float = DEFAULT_FREE_GPU_MEMORY_FRACTION,
    cross_kv_cache_fraction: float = DEFAULT_CROSS_KV_CACHE_FRACTION,
    overrides: dict[str, Any] | None = None,
    installed_version: str | None = None,
    python_scheduler: bool = True,
) -> dict[str, Any]:
    """Keyword arguments for ``tensorrt_llm.LLM(model=..., **args)`` (plain dicts for the
    nested configs: the backend turns them into ``KvCacheConfig`` / ``SchedulerConfig``).

    ``overrides`` (user settings) win, but one that would bring back a known failure is
    refused with ``InvalidOption`` naming the upstream bug, unless ``installed_version`` is in
    the table of versions with the fix.
    """
    source_positions, target_positions = _check_model_config(model_config)
    if max_batch_size < 1:
        raise InvalidOption("max_batch_size", "max_batch_size must be at least 1")
    args: dict[str, Any] = {
        "backend": "pytorch",
        "max_batch_size": max_batch_size,
        "max_input_len": max(source_positions, target_positions),
        "max_num_tokens": source_positions * max_batch_size,
        "enable_chunked_prefill": False,
        "attn_backend": "TRTLLM",
        "kv_cache_config": {
            "enable_block_reuse": False,
            "cross_kv_cache_fraction": cross_kv_cache_fraction,
            "free_gpu_memory_fraction": free_gpu_memory_fraction,
        },
    }
    if python_scheduler:
        args["scheduler_config"] = {"use_python_scheduler": True}
    args = _merge(args, overrides or {})
    _refuse_known_failures(args, source_positions, target_positions, installed_version)
    if not args["kv_cache_config"].get("enable_block_reuse", True):
        logger.info(
            "KV-cache block reuse is off for Whisper: %s; prefix reuse cannot match audio "
            "features and decoder prompts are a few tokens, so nothing is lost.",
            SCHEDULER_BUG,
        )
    return args


def _refuse_known_failures(
    args: dict[str, Any], source_positions: int, target_positions: int, version: str | None
) -> None:
    kv = args.get("kv_cache_config") or {}
    # TensorRT-LLM's KvCacheConfig defaults enable_block_reuse to True: absent means on.
    if kv.get("enable_block_reuse", True) and version not in VERSIONS_WITH_SCHEDULER_FIX:
        raise InvalidOption(
            "kv_cache_config.enable_block_reuse",
            f"Refusing enable_block_reuse=True: {SCHEDULER_BUG}. Every request would fail. "
            f"Installed version {version or 'unknown'} is not in VERSIONS_WITH_SCHEDULER_FIX.",
        )
    if kv.get("cross_kv_cache_fraction") is None:
        raise InvalidOption(
            "kv_cache_config.cross_kv_cache_fraction",
            "Encoder-decoder models require kv_cache_config.cross_kv_cache_fraction to be set "
            "(the share of KV-cache memory for the cross-attention of the encoder output).",
        )
    max_input_len = args.get("max_input_len")
    if (
        max_input_len is None or max_input_len < source_positions
    ) and version not in VERSIONS_WITH_CROSS_KV_FIX:
        raise InvalidOption(
            "max_input_len",
            f"Refusing max_input_len={max_input_len}: it must be at least the checkpoint's "
            f"max_source_positions ({source_positions}). {CROSS_KV_BUG}.",
        )
    max_seq_len = args.get("max_seq_len")
    if max_seq_len is not None and max_seq_len != max(source_positions, target_positions):
        raise InvalidOption(
            "max_seq_len",
            f"Leave max_seq_len unset (the model infers {max(source_positions, target_positions)}"
            "): other values fail at executor start-up ('No free block found').",
        )
    if args.get("enable_chunked_prefill"):
        raise InvalidOption(
            "enable_chunked_prefill",
            "Chunked prefill is not supported for the encoder phase of encoder-decoder models.",
        )
    max_num_tokens = args.get("max_num_tokens")
    if max_num_tokens is not None and max_num_tokens < source_positions:
        raise InvalidOption(
            "max_num_tokens",
            f"max_num_tokens={max_num_tokens} cannot hold one encoder pass "
            f"({source_positions} positions).",
        )


def to_yaml(args: dict[str, Any], header: str | None = None) -> str:
    """The arguments as the YAML that ``trtllm-serve --config`` (LLM API fields) reads."""
    import yaml

    body = yaml.safe_dump(args, sort_keys=False, default_flow_style=False)
    if header:
        comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
        return comment + body
    return body


def read_model_config(model: str | Path) -> dict[str, Any]:
    """``config.json`` of a checkpoint directory (or the path of the file itself)."""
    path = Path(model)
    config_path = path / "config.json" if path.is_dir() else path
    if not config_path.is_file():
        raise ModelLoadError(
            f"No config.json at {config_path}: pass a local Whisper checkpoint directory"
        )
    try:
        return json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"Cannot read {config_path}: {exc}") from exc


def engine_config_text(model: str | Path, fmt: str = "yaml", **options: Any) -> str:
    """The computed engine arguments of a checkpoint, as ``yaml`` (trtllm-serve --config) or
    ``json``. ``options`` are passed to :func:`trtllm_engine_args`."""
    args = trtllm_engine_args(read_model_config(model), **options)
    if fmt == "yaml":
        return to_yaml(args)
    if fmt == "json":
        return json.dumps(args, indent=2) + "\n"
    raise InvalidOption("format", f"format must be 'yaml' or 'json', got {fmt!r}")


def config_file_text(model_id: str, model_config: dict[str, Any]) -> str:
    """The checked-in ``configs/trtllm-<name>.yaml`` for one checkpoint."""
    header = (
        f"TensorRT-LLM engine arguments for {model_id} (trtllm-serve --config).\n"
        "Generated from the checkpoint's config.json by\n"
        "  python -m whisper_engine.backends.trtllm_args --write-configs configs/\n"
        "Do not edit by hand: tests/test_trtllm_args.py fails when this drifts from the code."
    )
    return to_yaml(trtllm_engine_args(model_config), header=header)


def write_configs(model_configs_dir: Path, out_dir: Path) -> list[Path]:
    """One ``trtllm-<name>.yaml`` per ``<name>.json`` in ``model_configs_dir``."""
    written = []
    out_dir.mkdir(parents=True, exist_ok=True)
    for config_path in sorted(model_configs_dir.glob("*.json")):
        name = config_path.stem
        text = config_file_text(f"openai/{name}", json.loads(config_path.read_text("utf-8")))
        target = out_dir / f"trtllm-{name}.yaml"
        target.write_text(text, encoding="utf-8")
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="checkpoint directory: print its engine arguments")
    parser.add_argument("--format", default="yaml", choices=["yaml", "json"])
    parser.add_argument("--write-configs", type=Path, metavar="DIR")
    parser.add_argument(
        "--model-configs", type=Path, default=Path("tests/data/model_configs"), metavar="DIR"
    )
    ns = parser.parse_args(argv)
    if ns.write_configs:
        for path in write_configs(ns.model_configs, ns.write_configs):
            print(path)
    elif ns.model:
        print(engine_config_text(ns.model, ns.format), end="")
    else:
        parser.error("give --model DIR or --write-configs DIR")


if __name__ == "__main__":
    main()
