"""The TensorRT-LLM stand-in fails exactly as the documented failure matrix shows, and the
computed configuration transcribes real speech."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from trtllm_sim.fixtures import stand_in_library

from whisper_engine.backends.trtllm_args import trtllm_engine_args
from whisper_engine.checkpoints import resolve_checkpoint

SPEECH = Path(__file__).resolve().parent / "data" / "speech"
CROSS_KV_MESSAGE = (
    "The max KV cache length of input sequences (1500) exceeds the KV cache manager's "
    "maximum supported length (1024)"
)


@pytest.fixture(scope="module")
def trtllm():
    with stand_in_library() as library:
        yield library


@pytest.fixture(scope="module")
def checkpoint() -> Path:
    return resolve_checkpoint()


@pytest.fixture(scope="module")
def jfk() -> np.ndarray:
    audio, rate = sf.read(SPEECH / "jfk.wav", dtype="float32")
    assert rate == 16_000
    return audio


@pytest.fixture(scope="module")
def computed_llm(trtllm, checkpoint):
    args = trtllm_engine_args(json.loads((checkpoint / "config.json").read_text()))
    args["kv_cache_config"] = trtllm.KvCacheConfig(**args["kv_cache_config"])
    args["scheduler_config"] = trtllm.SchedulerConfig(**args["scheduler_config"])
    with trtllm.LLM(model=checkpoint, **args) as llm:
        yield llm


def _request(audio, prompt: str = "") -> dict:
    return {"prompt": prompt, "multi_modal_data": {"audio": [(audio, 16_000)]}}


def _kv(trtllm, block_reuse: bool):
    return trtllm.KvCacheConfig(enable_block_reuse=block_reuse, cross_kv_cache_fraction=0.5)


def test_stand_in_says_what_it_is(trtllm):
    assert "NOT NVIDIA's library" in trtllm.__doc__
    assert trtllm.__version__ == "1.3.0rc25"
    assert trtllm.SamplingParams().max_tokens == 32


def test_stock_configuration_fails_for_lack_of_cross_kv_fraction(trtllm, checkpoint):
    with pytest.raises(ValueError) as info:
        trtllm.LLM(model=checkpoint)
    assert str(info.value) == (
        "Encoder-decoder models require kv_cache_config.cross_kv_cache_fraction to be set"
    )


@pytest.mark.parametrize("max_input_len", [1024, 1500])
def test_block_reuse_on_is_bad_optional_access_at_first_request(
    trtllm, checkpoint, jfk, max_input_len
):
    extra = {"max_seq_len": 448} if max_input_len == 1024 else {}
    with trtllm.LLM(
        model=checkpoint,
        kv_cache_config=_kv(trtllm, True),
        max_input_len=max_input_len,
        **extra,
    ) as llm:
        pending = llm.generate_async(_request(jfk), trtllm.SamplingParams(max_tokens=50))
        with pytest.raises(RuntimeError) as info:
            pending.result()
        assert str(info.value) == "bad optional access"


def test_cross_kv_pool_of_1024_is_request_error_then_sampling_failed(
    trtllm, checkpoint, jfk, caplog
):
    with trtllm.LLM(
        model=checkpoint, kv_cache_config=_kv(trtllm, False), max_input_len=1024, max_seq_len=448
    ) as llm:
        pending = llm.generate_async(_request(jfk), trtllm.SamplingParams(max_tokens=50))
        with caplog.at_level(logging.ERROR), pytest.raises(AssertionError) as info:
            pending.result()
    assert str(info.value) == "Sampling failed"
    assert type(info.value.__cause__).__name__ == "RequestError"
    assert str(info.value.__cause__) == CROSS_KV_MESSAGE
    assert CROSS_KV_MESSAGE in caplog.text


def test_max_seq_len_2048_with_max_input_len_1024_fails_at_init(trtllm, checkpoint):
    with pytest.raises(RuntimeError) as info:
        trtllm.LLM(
            model=checkpoint,
            kv_cache_config=_kv(trtllm, False),
            max_input_len=1024,
            max_seq_len=2048,
        )
    assert str(info.value) == "No free block found. This shouldn't happen!"


def test_computed_configuration_transcribes_jfk(computed_llm, trtllm, jfk):
    out = computed_llm.generate(_request(jfk), trtllm.SamplingParams(max_tokens=200))
    completion = out.outputs[0]
    assert "ask not what your country can do for you" in completion.text.lower()
    assert completion.finish_reason == "stop"
    assert completion.token_ids[-1] == 50257  # eot, which the text leaves out


def test_audio_rules_with_the_library_messages(computed_llm, trtllm, jfk):
    params = trtllm.SamplingParams(max_tokens=5)
    long_audio = np.zeros(31 * 16_000, dtype=np.float32)
    with pytest.raises(ValueError, match="chunk the input on the client side"):
        computed_llm.generate_async(_request(long_audio), params)
    with pytest.raises(ValueError, match="Resample on the client side"):
        computed_llm.generate_async(
            {"prompt": "", "multi_modal_data": {"audio": [(jfk, 44_100)]}}, params
        )
    with pytest.raises(ValueError, match="exactly one audio clip per request; got 2"):
        computed_llm.generate_async(
            {"prompt": "", "multi_modal_data": {"audio": [(jfk, 16_000)] * 2}}, params
        )
    with pytest.raises(ValueError, match="test stand-in: refusing"):
        computed_llm.generate_async(
            {"prompt": "", "multi_modal_data": {"audio": ["/etc/passwd"]}}, params
        )
    assert computed_llm.audio_sources_read == ["/etc/passwd"]


def test_prompt_rules(computed_llm, trtllm, jfk):
    params = trtllm.SamplingParams(max_tokens=5)
    with pytest.raises(ValueError, match="must start with <\\|startoftranscript\\|>"):
        computed_llm.generate_async(
            _request(jfk, "<|startofprev|> hello<|startoftranscript|><|en|>"), params
        )
    too_long = "<|startoftranscript|>" + "<|en|>" * 447
    with pytest.raises(ValueError, match="448 tokens; at most 447"):
        computed_llm.generate_async(_request(jfk, too_long), params)
    out = computed_llm.generate(_request(jfk, ""), trtllm.SamplingParams(max_tokens=3))
    assert out.prompt_token_ids == [50258, 50259, 50359, 50363]  # sot en transcribe notimestamps


def test_max_tokens_default_truncates_and_is_capped(computed_llm, trtllm):
    clips = [sf.read(SPEECH / f"librivox-0{n}.wav", dtype="float32")[0] for n in (870, 890, 920)]
    long_clip = np.concatenate(clips)
    out = computed_llm.generate(_request(long_clip), trtllm.SamplingParams())
    assert len(out.outputs[0].token_ids) == 32
    assert out.outputs[0].finish_reason == "length"
    params = trtllm.SamplingParams(max_tokens=1000)
    out = computed_llm.generate_async(_request(long_clip), params)
    assert params.max_tokens == 448 - 4
    assert out.result().outputs[0].finish_reason == "stop"
