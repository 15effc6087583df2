"""Engine arguments computed from real Whisper config.json values, and the checked-in configs."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from whisper_engine.backends import trtllm_args
from whisper_engine.backends.trtllm_args import (
    config_file_text,
    engine_config_text,
    to_yaml,
    trtllm_engine_args,
)
from whisper_engine.errors import InvalidOption, ModelLoadError

ROOT = Path(__file__).resolve().parent.parent
MODEL_CONFIGS = sorted((ROOT / "tests/data/model_configs").glob("*.json"))
EXPECTED_SIZES = {
    "whisper-tiny",
    "whisper-base",
    "whisper-small",
    "whisper-medium",
    "whisper-large-v2",
    "whisper-large-v3",
    "whisper-large-v3-turbo",
}


def _config(name: str) -> dict:
    return json.loads((ROOT / "tests/data/model_configs" / f"{name}.json").read_text())


def test_every_size_has_a_config_and_a_checked_in_engine_config():
    assert {p.stem for p in MODEL_CONFIGS} == EXPECTED_SIZES
    for name in EXPECTED_SIZES:
        assert (ROOT / "configs" / f"trtllm-{name}.yaml").is_file(), name


@pytest.mark.parametrize("config_path", MODEL_CONFIGS, ids=lambda p: p.stem)
def test_checked_in_config_matches_the_code(config_path):
    expected = config_file_text(f"openai/{config_path.stem}", json.loads(config_path.read_text()))
    checked_in = (ROOT / "configs" / f"trtllm-{config_path.stem}.yaml").read_text()
    assert checked_in == expected, (
        f"configs/trtllm-{config_path.stem}.yaml drifted: run "
        "python -m whisper_engine.backends.trtllm_args --write-configs configs/"
    )


@pytest.mark.parametrize("config_path", MODEL_CONFIGS, ids=lambda p: p.stem)
def test_computed_args_follow_every_rule(config_path):
    config = json.loads(config_path.read_text())
    args = trtllm_engine_args(config, max_batch_size=4)
    assert args["backend"] == "pytorch"
    assert args["max_input_len"] >= config["max_source_positions"]
    assert "max_seq_len" not in args
    assert args["kv_cache_config"]["enable_block_reuse"] is False
    assert 0 < args["kv_cache_config"]["cross_kv_cache_fraction"] < 1
    assert 0 < args["kv_cache_config"]["free_gpu_memory_fraction"] < 1
    assert args["max_num_tokens"] >= config["max_source_positions"] * args["max_batch_size"]
    assert args["enable_chunked_prefill"] is False
    assert args["attn_backend"] == "TRTLLM"
    assert args["scheduler_config"] == {"use_python_scheduler": True}


def test_source_positions_are_read_not_assumed():
    config = {**_config("whisper-tiny"), "max_source_positions": 750}
    args = trtllm_engine_args(config, max_batch_size=3)
    assert args["max_input_len"] == 750
    assert args["max_num_tokens"] == 2250


def test_not_whisper_config_is_refused():
    with pytest.raises(ModelLoadError, match="max_source_positions"):
        trtllm_engine_args({"model_type": "llama"})


@pytest.mark.parametrize(
    ("overrides", "param", "message"),
    [
        ({"kv_cache_config": {"enable_block_reuse": True}}, "kv_cache_config.enable_block_reuse",
         "bad optional access.*#19450.*#19302"),
        ({"kv_cache_config": {"cross_kv_cache_fraction": None}},
         "kv_cache_config.cross_kv_cache_fraction", "cross_kv_cache_fraction to be set"),
        ({"max_input_len": 1024}, "max_input_len", "max_source_positions \\(1500\\).*#19514"),
        ({"max_seq_len": 2048}, "max_seq_len", "No free block found"),
        ({"enable_chunked_prefill": True}, "enable_chunked_prefill", "encoder phase"),
        ({"max_num_tokens": 1000}, "max_num_tokens", "one encoder pass"),
    ],
)  # fmt: skip
def test_guard_refuses_overrides_that_bring_back_known_failures(overrides, param, message):
    with pytest.raises(InvalidOption, match=message) as info:
        trtllm_engine_args(_config("whisper-large-v3"), overrides=overrides)
    assert info.value.param == param


def test_block_reuse_is_allowed_on_a_version_with_the_scheduler_fix(monkeypatch):
    monkeypatch.setattr(trtllm_args, "VERSIONS_WITH_SCHEDULER_FIX", frozenset({"9.9.9"}))
    overrides = {"kv_cache_config": {"enable_block_reuse": True}}
    args = trtllm_engine_args(
        _config("whisper-base"), overrides=overrides, installed_version="9.9.9"
    )
    assert args["kv_cache_config"]["enable_block_reuse"] is True
    with pytest.raises(InvalidOption):
        trtllm_engine_args(_config("whisper-base"), overrides=overrides, installed_version="9.9.8")


def test_harmless_overrides_merge_into_nested_configs():
    args = trtllm_engine_args(
        _config("whisper-small"),
        overrides={"kv_cache_config": {"free_gpu_memory_fraction": 0.5}, "max_batch_size": 8},
    )
    assert args["kv_cache_config"] == {
        "enable_block_reuse": False,
        "cross_kv_cache_fraction": 0.5,
        "free_gpu_memory_fraction": 0.5,
    }
    assert args["max_batch_size"] == 8


def test_turning_block_reuse_off_logs_why(caplog):
    with caplog.at_level(logging.INFO, logger="whisper_engine.backends.trtllm_args"):
        trtllm_engine_args(_config("whisper-tiny"))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1
    assert "block reuse is off" in lines[0] and "bad optional access" in lines[0]


def test_yaml_is_what_trtllm_serve_reads():
    args = trtllm_engine_args(_config("whisper-large-v3-turbo"))
    loaded = yaml.safe_load(to_yaml(args))
    assert loaded == args
    assert isinstance(loaded["kv_cache_config"], dict)
    assert isinstance(loaded["scheduler_config"], dict)


def test_engine_config_text_reads_a_checkpoint_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(_config("whisper-medium")))
    assert yaml.safe_load(engine_config_text(tmp_path, "yaml"))["max_input_len"] == 1500
    assert json.loads(engine_config_text(tmp_path, "json"))["max_num_tokens"] == 1500 * 16
    with pytest.raises(ModelLoadError, match=r"config\.json"):
        engine_config_text(tmp_path / "missing", "yaml")
    with pytest.raises(InvalidOption):
        engine_config_text(tmp_path, "toml")


def test_module_imports_no_model_library():
    code = (
        "import sys, whisper_engine.backends.trtllm_args as m; "
        "bad = [n for n in ('torch', 'transformers', 'tensorrt_llm') if n in sys.modules]; "
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
