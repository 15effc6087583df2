"""TrtllmBackend on the TensorRT-LLM stand-in, with the embedded Whisper base model."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from trtllm_sim.fixtures import stand_in_library

from whisper_engine.backends.base import Backend, TokenRules, WindowRequest
from whisper_engine.backends.trtllm import TrtllmBackend, check_library
from whisper_engine.checkpoints import resolve_checkpoint
from whisper_engine.decoding import token_rules
from whisper_engine.errors import InvalidOption, ModelLoadError
from whisper_engine.tokenizer import WhisperTokenizer

SPEECH = Path(__file__).resolve().parent / "data" / "speech"


def _clip(name: str) -> np.ndarray:
    audio, rate = sf.read(SPEECH / name, dtype="float32")
    assert rate == 16_000
    return audio


@pytest.fixture(scope="module")
def checkpoint() -> Path:
    return resolve_checkpoint()


@pytest.fixture(scope="module")
def tokenizer(checkpoint) -> WhisperTokenizer:
    return WhisperTokenizer.from_file(checkpoint / "tokenizer.json")


@pytest.fixture(scope="module")
def trtllm():
    with stand_in_library() as library:
        yield library


@pytest.fixture(scope="module")
def backend(trtllm, checkpoint, tokenizer):
    engine = TrtllmBackend(checkpoint, tokenizer, max_batch_size=4)
    sent = []
    submit = engine.llm.generate_async

    def recording_submit(inputs, sampling_params=None, **kwargs):
        sent.append((inputs, sampling_params))
        return submit(inputs, sampling_params, **kwargs)

    engine.llm.generate_async = recording_submit
    engine.sent = sent
    yield engine
    engine.close()


def _rules(tokenizer: WhisperTokenizer) -> TokenRules:
    return token_rules(tokenizer, tokenizer.non_speech_tokens)


def _window(tokenizer, audio, *, timestamps=False, max_new_tokens=224, prompt=None):
    prompt_ids = prompt or tokenizer.decoder_prompt("en", "transcribe", timestamps)
    return WindowRequest(
        audio=audio,
        prompt_ids=prompt_ids,
        temperature=0.0,
        max_new_tokens=max_new_tokens,
        timestamps=timestamps,
        rules=_rules(tokenizer),
    )


def test_is_a_backend(backend):
    assert isinstance(backend, Backend)
    assert backend.name == "trtllm"
    assert backend.max_target_positions == 448
    assert backend.alignment_weights([]) is None
    assert backend.engine_args["kv_cache_config"].enable_block_reuse is False
    assert backend.engine_args["scheduler_config"].use_python_scheduler is True


def test_generate_transcribes_real_clips_in_order(backend, tokenizer):
    clips = ["jfk.wav", "librivox-0880.wav", "librivox-0890.wav"]
    outputs = backend.generate([_window(tokenizer, _clip(name)) for name in clips])
    texts = [tokenizer.decode(out.token_ids).lower().replace("-", " ") for out in outputs]
    assert "ask not what your country can do for you" in texts[0]
    assert "ill disposed young man" in texts[1]
    assert "cold hearted" in texts[2]
    for out in outputs:
        assert out.finished
        assert tokenizer.special.eot not in out.token_ids
        assert len(out.logprobs) == len(out.token_ids)
        assert all(lp <= 0 for lp in out.logprobs)
        assert out.sum_logprob <= sum(out.logprobs)  # the eot's logprob is included
        assert 0.0 <= out.no_speech_prob < 0.2


def test_only_arrays_and_explicit_max_tokens_are_sent(backend, tokenizer):
    backend.sent.clear()
    backend.generate([_window(tokenizer, _clip("librivox-0880.wav"), max_new_tokens=100)])
    assert backend.sent
    for inputs, params in backend.sent:
        (item,) = inputs["multi_modal_data"]["audio"]
        array, rate = item
        assert isinstance(array, np.ndarray) and array.dtype == np.float32 and rate == 16_000
        assert inputs["prompt"].startswith("<|startoftranscript|>")
        assert params.max_tokens in (100, 1)  # the window, and its no-speech probe
    assert backend.llm.audio_sources_read == []


def test_long_clip_is_not_cut_at_the_library_default_of_32_tokens(backend, tokenizer):
    long_clip = np.concatenate([_clip(f"librivox-0{n}.wav") for n in (870, 890, 920)])
    (out,) = backend.generate([_window(tokenizer, long_clip)])
    assert out.finished
    assert len(out.token_ids) > 32
    assert "more respectable than he was" in tokenizer.decode(out.token_ids).lower()


def test_max_tokens_is_capped_by_the_decoder_context(backend, tokenizer):
    backend.sent.clear()
    window = _window(tokenizer, _clip("librivox-0880.wav"), max_new_tokens=10_000)
    backend.generate([window])
    window_params = backend.sent[0][1]
    assert window_params.max_tokens == 448 - len(window.prompt_ids)


def test_timestamp_mode_follows_the_timestamp_rules(backend, tokenizer):
    (out,) = backend.generate([_window(tokenizer, _clip("jfk.wav"), timestamps=True)])
    begin = tokenizer.special.timestamp_begin
    stamps = [t for t in out.token_ids if t >= begin]
    assert out.token_ids[0] >= begin and out.token_ids[-1] >= begin
    assert stamps == sorted(stamps) and len(stamps) >= 2
    assert "ask not what your country" in tokenizer.decode(out.token_ids).lower()


def test_previous_text_prompt_is_refused(backend, tokenizer):
    prompt = tokenizer.decoder_prompt("en", "transcribe", False, previous_text="Kennedy")
    with pytest.raises(InvalidOption, match="not supported by the trtllm backend") as info:
        backend.generate([_window(tokenizer, _clip("jfk.wav"), prompt=prompt)])
    assert info.value.param == "prompt"


def test_language_detection_probe_picks_english(backend, tokenizer):
    languages = tokenizer.special.languages
    codes = list(languages)
    rows = backend.next_token_logprobs(
        [_clip("jfk.wav")], (tokenizer.special.sot,), [languages[c] for c in codes]
    )
    assert rows.shape == (1, len(codes))
    assert codes[int(np.argmax(rows[0]))] == "en"
    finite = rows[0][np.isfinite(rows[0])]
    assert math.isclose(float(np.exp(finite).sum()), 1.0, rel_tol=1e-4)


def test_no_speech_probability_is_higher_for_silence(backend, tokenizer):
    silence = np.zeros(5 * 16_000, dtype=np.float32)
    speech, quiet = backend.generate(
        [_window(tokenizer, _clip("jfk.wav")), _window(tokenizer, silence)]
    )
    assert quiet.no_speech_prob > speech.no_speech_prob


def test_guard_refuses_block_reuse_before_loading(trtllm, checkpoint, tokenizer):
    with pytest.raises(InvalidOption, match=r"bad optional access.*#19450") as info:
        TrtllmBackend(
            checkpoint,
            tokenizer,
            engine_overrides={"kv_cache_config": {"enable_block_reuse": True}},
        )
    assert info.value.param == "kv_cache_config.enable_block_reuse"


def test_close_shuts_the_llm_down(trtllm, checkpoint, tokenizer):
    engine = TrtllmBackend(checkpoint, tokenizer, max_batch_size=1)
    assert not engine.llm.is_shut_down
    engine.close()
    assert engine.llm.is_shut_down
    engine.close()  # a second close is harmless


def test_missing_library_is_a_clear_load_error(checkpoint, tokenizer, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)
    with pytest.raises(ModelLoadError, match="needs TensorRT-LLM"):
        TrtllmBackend(checkpoint, tokenizer)


def test_library_without_version_is_refused(trtllm, monkeypatch):
    monkeypatch.delattr(trtllm, "__version__")
    with pytest.raises(ModelLoadError, match="__version__"):
        check_library(trtllm)
