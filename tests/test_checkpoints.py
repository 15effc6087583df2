"""Checkpoint resolution and the CTranslate2 -> Hugging Face conversion, on the real model."""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
import transformers
from safetensors.numpy import load_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from whisper_engine.checkpoints import EMBEDDED_MODEL_ID, EMBEDDED_MODEL_SHA256, resolve_checkpoint
from whisper_engine.checkpoints.cache import publish_directory
from whisper_engine.checkpoints.ctranslate2 import read_ct2_model, write_ct2_model
from whisper_engine.checkpoints.embedded import embedded_checkpoint
from whisper_engine.errors import ModelLoadError

REPO = Path(__file__).parent.parent
DATA = REPO / "tests" / "data"
JFK = DATA / "speech" / "jfk.wav"
REFERENCE_BASE_CONFIG = DATA / "model_configs" / "whisper-base.json"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("model-cache")


@pytest.fixture(scope="module")
def embedded(cache_dir: Path) -> Path:
    return resolve_checkpoint(None, cache_dir=cache_dir)


@pytest.fixture(scope="module")
def embedded_model(embedded: Path) -> transformers.WhisperForConditionalGeneration:
    model, info = transformers.WhisperForConditionalGeneration.from_pretrained(
        embedded, output_loading_info=True
    )
    assert {k: v for k, v in info.items() if v} == {}
    return model.eval()


# --- the embedded model ----------------------------------------------------------------


def test_embedded_model_is_converted_with_provenance(embedded: Path, cache_dir: Path) -> None:
    assert embedded.parent == cache_dir
    assert EMBEDDED_MODEL_SHA256 in embedded.name
    provenance = json.loads((embedded / "whisper-serve.json").read_text())
    assert provenance["sha256"] == EMBEDDED_MODEL_SHA256
    assert provenance["source"] == f"embedded:{EMBEDDED_MODEL_ID}"
    expected = {
        "model.safetensors",
        "config.json",
        "generation_config.json",
        "preprocessor_config.json",
        "tokenizer.json",
        "whisper-serve.json",
    }
    assert {p.name for p in embedded.iterdir()} == expected
    # readable by another user (a cache filled at image build time)
    assert all(p.stat().st_mode & 0o044 == 0o044 for p in [embedded, *embedded.iterdir()])


def test_the_package_imports_no_model_library() -> None:
    code = (
        "import sys, whisper_engine.checkpoints; "
        "print(sorted({'torch', 'transformers', 'tensorrt_llm'} & set(sys.modules)))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert run.stdout.strip() == "[]"


def test_second_resolve_reuses_the_cached_conversion(embedded: Path, cache_dir: Path) -> None:
    weights = (embedded / "model.safetensors").stat()
    for name in (None, "", EMBEDDED_MODEL_ID):
        assert resolve_checkpoint(name, cache_dir=cache_dir) == embedded
    again = (embedded / "model.safetensors").stat()
    assert (again.st_ino, again.st_mtime_ns) == (weights.st_ino, weights.st_mtime_ns)
    converted = [p for p in cache_dir.iterdir() if not p.name.startswith(".")]
    assert converted == [embedded]
    assert not [p for p in cache_dir.iterdir() if p.name.startswith(f".{embedded.name}")]


def test_config_matches_the_published_whisper_base_config(embedded: Path) -> None:
    ours = json.loads((embedded / "config.json").read_text())
    reference = json.loads(REFERENCE_BASE_CONFIG.read_text())
    architecture = [
        "vocab_size", "num_mel_bins", "d_model", "encoder_layers", "decoder_layers",
        "encoder_attention_heads", "decoder_attention_heads", "encoder_ffn_dim",
        "decoder_ffn_dim", "max_source_positions", "max_target_positions",
        "decoder_start_token_id", "eos_token_id", "pad_token_id", "begin_suppress_tokens",
        "activation_function", "scale_embedding", "model_type",
    ]  # fmt: skip
    assert {k: ours[k] for k in architecture} == {k: reference[k] for k in architecture}


def test_generation_config_has_the_whisper_decoding_fields(embedded: Path) -> None:
    generation = transformers.GenerationConfig.from_pretrained(embedded)
    heads = [[3, 1], [4, 2], [4, 3], [4, 7], [5, 1], [5, 2], [5, 4], [5, 6]]
    assert generation.alignment_heads == heads
    assert generation.is_multilingual is True
    assert generation.lang_to_id["<|en|>"] == 50259
    assert len(generation.lang_to_id) == 99
    assert generation.task_to_id == {"transcribe": 50359, "translate": 50358}
    assert generation.no_timestamps_token_id == 50363
    assert generation.decoder_start_token_id == 50258
    assert generation.begin_suppress_tokens == [220, 50257]
    assert 50362 in generation.suppress_tokens


def test_float32_load_computes_like_the_default_load(
    embedded: Path, embedded_model: transformers.WhisperForConditionalGeneration
) -> None:
    explicit = transformers.WhisperForConditionalGeneration.from_pretrained(
        embedded, dtype=torch.float32
    ).eval()
    assert embedded_model.dtype == explicit.dtype == torch.float32
    assert embedded_model.proj_out.weight is embedded_model.model.decoder.embed_tokens.weight
    features = torch.randn(1, 80, 3000, generator=torch.Generator().manual_seed(0))
    tokens = torch.tensor([[50258, 50259, 50359, 50363]])
    with torch.inference_mode():
        a = embedded_model(input_features=features, decoder_input_ids=tokens).logits
        b = explicit(input_features=features, decoder_input_ids=tokens).logits
    assert torch.equal(a, b)


def test_converted_model_transcribes_real_speech(
    embedded: Path, embedded_model: transformers.WhisperForConditionalGeneration
) -> None:
    audio, rate = sf.read(JFK, dtype="float32")
    assert rate == 16000 and audio.ndim == 1
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(embedded)
    features = extractor(audio, sampling_rate=rate, return_tensors="pt").input_features
    with torch.inference_mode():
        tokens = embedded_model.generate(features, language="en", task="transcribe")
    text = Tokenizer.from_file(str(embedded / "tokenizer.json")).decode(tokens[0].tolist())
    words = re.sub(r"[^a-z ]", "", text.lower())
    assert "ask not what your country can do for you" in words


def test_tokenizer_knows_the_timestamp_tokens(embedded: Path) -> None:
    tokenizer = Tokenizer.from_file(str(embedded / "tokenizer.json"))
    no_timestamps = tokenizer.token_to_id("<|notimestamps|>")
    assert no_timestamps == 50363
    assert tokenizer.id_to_token(no_timestamps + 1) == "<|0.00|>"
    assert tokenizer.id_to_token(no_timestamps + 1501) == "<|30.00|>"
    assert tokenizer.get_vocab_size() == 51865
    decoded = tokenizer.decode([50364, 50365, 51864], skip_special_tokens=False)
    assert decoded == "<|0.00|><|0.02|><|30.00|>"
    assert tokenizer.decode(tokenizer.encode(" Hello world").ids) == " Hello world"


def test_a_changed_embedded_model_is_refused(cache_dir: Path) -> None:
    with pytest.raises(ModelLoadError) as error:
        embedded_checkpoint(cache_dir, expected_sha256="0" * 64)
    assert "0" * 64 in str(error.value) and EMBEDDED_MODEL_SHA256 in str(error.value)


# --- other sources ---------------------------------------------------------------------


def test_a_hugging_face_directory_is_returned_as_is(embedded: Path, tmp_path: Path) -> None:
    assert resolve_checkpoint(str(embedded), cache_dir=tmp_path) == embedded
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_hub_id_fails_fast_when_offline(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="could not be fetched from the Hugging Face hub"):
        resolve_checkpoint("nobody-here/no-such-whisper", cache_dir=tmp_path, offline=True)


@pytest.mark.parametrize("name", ["/nonexistent/whisper", "./no-such-dir"])
def test_a_missing_directory_is_reported(name: str, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve_checkpoint(name, cache_dir=tmp_path)


def test_a_directory_of_another_kind_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="neither"):
        resolve_checkpoint(str(tmp_path), cache_dir=tmp_path / "cache")


def test_a_concurrent_publisher_wins_the_race(tmp_path: Path) -> None:
    final = tmp_path / "converted"

    def build(tmp: Path) -> None:
        (tmp / "mine").write_text("late")
        final.mkdir()  # another process publishes first
        (final / "theirs").write_text("first")

    assert publish_directory(final, build) == final
    assert [p.name for p in final.iterdir()] == ["theirs"]
    assert [p.name for p in tmp_path.iterdir()] == ["converted"]


# --- a small synthetic CTranslate2 model with an English-only-style vocabulary ----------

D_MODEL, HEADS, FFN, MELS, AUDIO_CTX, TEXT_CTX = 16, 2, 32, 80, 1500, 448
SPECIALS = [
    "<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|de|>", "<|translate|>",
    "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nocaptions|>", "<|notimestamps|>",
]  # fmt: skip
TIMESTAMPS = [f"<|{i * 0.02:.2f}|>" for i in range(1501)]


def english_only_vocabulary() -> tuple[Tokenizer, list[str]]:
    """Byte-level BPE whose special tokens follow the text tokens, as in tiny.en."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(SPECIALS)
    return tokenizer, [*alphabet, *SPECIALS, *TIMESTAMPS]


def random_hf_state(vocab_size: int, layers: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)

    def t(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float16)

    d = D_MODEL
    state = {
        "model.encoder.conv1.weight": t(d, MELS, 3),
        "model.encoder.conv1.bias": t(d),
        "model.encoder.conv2.weight": t(d, d, 3),
        "model.encoder.conv2.bias": t(d),
        "model.encoder.embed_positions.weight": t(AUDIO_CTX, d),
        "model.decoder.embed_positions.weight": t(TEXT_CTX, d),
        "model.decoder.embed_tokens.weight": t(vocab_size, d),
    }
    for stack in ("encoder", "decoder"):
        state |= {f"model.{stack}.layer_norm.weight": t(d), f"model.{stack}.layer_norm.bias": t(d)}
        attentions = ["self_attn", "encoder_attn"] if stack == "decoder" else ["self_attn"]
        for i in range(layers):
            base = f"model.{stack}.layers.{i}"
            for module in [*(f"{a}_layer_norm" for a in attentions), "final_layer_norm"]:
                state |= {f"{base}.{module}.weight": t(d), f"{base}.{module}.bias": t(d)}
            for attn in attentions:
                for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
                    state[f"{base}.{attn}.{proj}.weight"] = t(d, d)
                    if proj != "k_proj":
                        state[f"{base}.{attn}.{proj}.bias"] = t(d)
            state |= {f"{base}.fc1.weight": t(FFN, d), f"{base}.fc1.bias": t(FFN)}
            state |= {f"{base}.fc2.weight": t(d, FFN), f"{base}.fc2.bias": t(d)}
    return state


def ct2_variables(hf: dict[str, np.ndarray], layers: int) -> dict[str, np.ndarray]:
    """The CTranslate2 names for ``hf``: fused projections with a zero key bias."""
    zero = np.zeros(D_MODEL, np.float16)
    v = {
        "decoder/activation": np.int8(3),
        "decoder/alibi": np.int8(0),
        "decoder/alignment_heads": np.int16(1),
        "decoder/alignment_layer": np.int16(-1),
        "decoder/embeddings/weight": hf["model.decoder.embed_tokens.weight"],
        "decoder/num_heads": np.int16(HEADS),
        "decoder/position_encodings/encodings": hf["model.decoder.embed_positions.weight"],
        "decoder/pre_norm": np.int8(1),
        "decoder/scale_embeddings": np.int8(0),
        "decoder/start_from_zero_embedding": np.int8(0),
        "encoder/num_heads": np.int16(HEADS),
        "encoder/position_encodings/encodings": hf["model.encoder.embed_positions.weight"],
    }
    for conv in ("conv1", "conv2"):
        for p in ("weight", "bias"):
            v[f"encoder/{conv}/{p}"] = hf[f"model.encoder.{conv}.{p}"]

    def norm(ct2: str, hf_name: str) -> None:
        v[f"{ct2}/gamma"], v[f"{ct2}/beta"] = hf[f"{hf_name}.weight"], hf[f"{hf_name}.bias"]

    def linear(ct2: str, hf_names: list[str]) -> None:
        v[f"{ct2}/weight"] = np.concatenate([hf[f"{n}.weight"] for n in hf_names])
        biases = [hf.get(f"{n}.bias", zero) for n in hf_names]
        v[f"{ct2}/bias"] = np.concatenate(biases)

    for stack in ("encoder", "decoder"):
        norm(f"{stack}/layer_norm", f"model.{stack}.layer_norm")
        for i in range(layers):
            c, h = f"{stack}/layer_{i}", f"model.{stack}.layers.{i}"
            norm(f"{c}/self_attention/layer_norm", f"{h}.self_attn_layer_norm")
            linear(f"{c}/self_attention/linear_0", [f"{h}.self_attn.{p}_proj" for p in "qkv"])
            linear(f"{c}/self_attention/linear_1", [f"{h}.self_attn.out_proj"])
            if stack == "decoder":
                norm(f"{c}/attention/layer_norm", f"{h}.encoder_attn_layer_norm")
                linear(f"{c}/attention/linear_0", [f"{h}.encoder_attn.q_proj"])
                linear(f"{c}/attention/linear_1", [f"{h}.encoder_attn.{p}_proj" for p in "kv"])
                linear(f"{c}/attention/linear_2", [f"{h}.encoder_attn.out_proj"])
            norm(f"{c}/ffn/layer_norm", f"{h}.final_layer_norm")
            linear(f"{c}/ffn/linear_0", [f"{h}.fc1"])
            linear(f"{c}/ffn/linear_1", [f"{h}.fc2"])
    return v


ALIASES = {"decoder/projection/weight": "decoder/embeddings/weight"}


@pytest.fixture
def synthetic(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A CTranslate2 directory (2 layers) plus its HF-named and CT2-named tensors."""
    tokenizer, vocabulary = english_only_vocabulary()
    hf = random_hf_state(len(vocabulary), layers=2)
    variables = ct2_variables(hf, layers=2)
    directory = tmp_path / "tiny-ct2"
    directory.mkdir()
    write_ct2_model(directory / "model.bin", variables, ALIASES)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "vocabulary.txt").write_text("\n".join(vocabulary) + "\n", encoding="utf-8")
    config = {
        "alignment_heads": [[1, 0], [1, 1]],
        "lang_ids": [50259, 50260],  # multilingual numbering, as tiny.en ships: ignored
        "suppress_ids": [1, 2, 7],
        "suppress_ids_begin": [220, SPECIALS.index("<|endoftext|>") + 256],
    }
    (directory / "config.json").write_text(json.dumps(config))
    return directory, hf, variables


def test_ct2_writer_and_reader_roundtrip(synthetic, tmp_path: Path) -> None:
    directory, _, variables = synthetic
    model = read_ct2_model(directory / "model.bin")
    assert model.spec == "WhisperSpec" and model.revision == 3
    assert model.aliases == ALIASES
    assert list(model.variables) == list(variables)
    for name, value in variables.items():
        assert model.variables[name].dtype == value.dtype, name
        assert np.array_equal(model.variables[name], value), name


def test_synthetic_english_only_model_converts_exactly(synthetic, tmp_path: Path) -> None:
    directory, hf, _ = synthetic
    converted = resolve_checkpoint(str(directory), cache_dir=tmp_path / "cache")
    assert converted.parent == tmp_path / "cache"
    weights = load_file(str(converted / "model.safetensors"))
    assert set(weights) == set(hf)
    for name, value in hf.items():
        assert weights[name].shape == value.shape, name
        assert np.array_equal(weights[name], value), name

    model, info = transformers.WhisperForConditionalGeneration.from_pretrained(
        converted, output_loading_info=True
    )
    assert {k: v for k, v in info.items() if v} == {}
    for name, value in model.state_dict().items():
        source = hf["model.decoder.embed_tokens.weight" if name == "proj_out.weight" else name]
        assert torch.equal(value, torch.from_numpy(source.astype(np.float32))), name

    eot = 256
    config = json.loads((converted / "config.json").read_text())
    assert (config["eos_token_id"], config["decoder_start_token_id"]) == (eot, eot + 1)
    assert config["encoder_attention_heads"] == config["decoder_attention_heads"] == HEADS
    assert config["vocab_size"] == len(weights["model.decoder.embed_tokens.weight"])
    generation = json.loads((converted / "generation_config.json").read_text())
    assert generation["is_multilingual"] is False and "lang_to_id" not in generation
    assert generation["no_timestamps_token_id"] == eot + len(SPECIALS) - 1
    assert generation["alignment_heads"] == [[1, 0], [1, 1]]
    tokenizer = Tokenizer.from_file(str(converted / "tokenizer.json"))
    first = generation["no_timestamps_token_id"] + 1
    assert tokenizer.decode([first, first + 1500], skip_special_tokens=False) == "<|0.00|><|30.00|>"
    assert resolve_checkpoint(str(directory), cache_dir=tmp_path / "cache") == converted


def test_a_ct2_model_without_vocabulary_file_gets_its_timestamps(synthetic, tmp_path) -> None:
    directory, _, _ = synthetic
    (directory / "vocabulary.txt").unlink()
    converted = resolve_checkpoint(str(directory), cache_dir=tmp_path / "cache")
    tokenizer = Tokenizer.from_file(str(converted / "tokenizer.json"))
    assert tokenizer.token_to_id("<|0.00|>") == tokenizer.token_to_id("<|notimestamps|>") + 1


def _flip_spec_name(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[data.index(b"WhisperSpec") + 10] = ord("X")  # WhisperSpeX
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-1000])


def _append_garbage(path: Path) -> None:
    path.write_bytes(path.read_bytes() + b"\0\0\0\0")


def _bad_version(path: Path) -> None:
    path.write_bytes(struct.pack("<I", 5) + path.read_bytes()[4:])


def _corrupt_a_name(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[data.index(b"encoder/conv1/weight")] = 0xC3  # not ASCII
    path.write_bytes(bytes(data))


def _oversize_a_tensor(path: Path) -> None:
    data = bytearray(path.read_bytes())
    name = b"encoder/conv2/bias\0"
    size_at = data.index(name) + len(name) + 1 + 4 + 1  # rank, one dim, dtype
    data[size_at : size_at + 4] = struct.pack("<I", 10**9)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (_flip_spec_name, "only 'WhisperSpec'"),
        (_truncate, "truncated"),
        (_append_garbage, "unexpected bytes"),
        (_bad_version, "format version 5"),
        (_corrupt_a_name, "not ASCII"),
        (_oversize_a_tensor, "declares 1000000000 bytes"),
    ],
)
def test_a_corrupted_model_bin_is_refused(synthetic, tmp_path, corrupt, message) -> None:
    directory, _, _ = synthetic
    corrupt(directory / "model.bin")
    with pytest.raises(ModelLoadError, match=message):
        resolve_checkpoint(str(directory), cache_dir=tmp_path / "cache")
    assert not [p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".sha")]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("unknown", "Unknown variable 'decoder/layer_0/ffn/linear_9/weight'"),
        ("key_bias", "key bias is not zero"),
        ("activation", "decoder/activation = 1 is not supported"),
        ("missing", "missing"),
        ("alias", "Unexpected alias"),
        ("int8", "is quantized"),
    ],
)
def test_an_unexpected_model_structure_is_refused(synthetic, tmp_path, change, message) -> None:
    directory, _, variables = synthetic
    aliases = dict(ALIASES)
    if change == "unknown":
        variables["decoder/layer_0/ffn/linear_9/weight"] = np.zeros((2, 2), np.float16)
    elif change == "key_bias":
        variables["encoder/layer_1/self_attention/linear_0/bias"][D_MODEL] = 1
    elif change == "activation":
        variables["decoder/activation"] = np.int8(1)
    elif change == "missing":
        del variables["decoder/layer_1/attention/linear_2/weight"]
    elif change == "int8":
        variables["decoder/layer_0/ffn/linear_0/weight"] = np.ones((FFN, D_MODEL), np.int8)
    else:
        aliases["decoder/other/weight"] = "decoder/embeddings/weight"
    write_ct2_model(directory / "model.bin", variables, aliases)
    with pytest.raises(ModelLoadError, match=message):
        resolve_checkpoint(str(directory), cache_dir=tmp_path / "cache")


def test_an_incomplete_ct2_directory_is_refused(synthetic, tmp_path: Path) -> None:
    directory, _, _ = synthetic
    (directory / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match="neither"):
        resolve_checkpoint(str(directory), cache_dir=tmp_path / "cache")
