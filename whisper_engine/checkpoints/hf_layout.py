"""Write a converted CTranslate2 Whisper model in the Hugging Face layout.

The directory holds ``model.safetensors`` (weights kept in their stored dtype),
``config.json``, ``generation_config.json``, ``preprocessor_config.json``, a
``tokenizer.json`` that knows the timestamp tokens, and ``whisper-serve.json`` (provenance).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors.numpy import save_file

from whisper_engine.checkpoints.ctranslate2 import WhisperDims, read_ct2_model, to_hf_state_dict
from whisper_engine.errors import ModelLoadError
from whisper_engine.languages import LANGUAGES

N_TIMESTAMPS = 1501  # <|0.00|> ... <|30.00|> in steps of 0.02 s
PROVENANCE_FILE = "whisper-serve.json"
MULTILINGUAL_MIN_VOCAB = 51865  # openai-whisper's own rule for telling the two vocabularies apart


@dataclass(frozen=True)
class CT2Files:
    """The files of a CTranslate2 / faster-whisper model directory."""

    model_bin: Path
    config: Path
    tokenizer: Path
    vocabulary: Path | None  # vocabulary.txt or vocabulary.json; optional

    @classmethod
    def in_directory(cls, directory: Path, model_bin: Path | None = None) -> CT2Files:
        vocabulary = next(
            (
                p
                for p in (directory / "vocabulary.txt", directory / "vocabulary.json")
                if p.is_file()
            ),
            None,
        )
        return cls(
            model_bin=model_bin or directory / "model.bin",
            config=directory / "config.json",
            tokenizer=directory / "tokenizer.json",
            vocabulary=vocabulary,
        )


@dataclass(frozen=True)
class SpecialIds:
    eot: int
    sot: int
    sot_prev: int
    no_timestamps: int
    transcribe: int
    translate: int
    languages: dict[str, int]  # "<|en|>" -> id


def write_hf_checkpoint(files: CT2Files, out_dir: Path, provenance: dict[str, Any]) -> None:
    """Convert ``files`` into ``out_dir`` (which must exist and be empty)."""
    ct2_config = _read_json(files.config)
    tokenizer = _read_json(files.tokenizer)
    state, dims = to_hf_state_dict(read_ct2_model(files.model_bin))
    ids = read_special_ids(tokenizer)
    tokenizer = add_timestamp_tokens(tokenizer, _read_vocabulary(files.vocabulary), ids, dims)
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    multilingual = dims.vocab_size >= MULTILINGUAL_MIN_VOCAB
    _write_json(out_dir / "config.json", whisper_config(dims, ids, ct2_config))
    _write_json(
        out_dir / "generation_config.json", generation_config(ids, ct2_config, multilingual)
    )
    _write_json(out_dir / "preprocessor_config.json", preprocessor_config(dims.n_mels))
    _write_json(out_dir / "tokenizer.json", tokenizer)
    _write_json(out_dir / PROVENANCE_FILE, provenance)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"Cannot read {path}: {exc}") from exc


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _read_vocabulary(path: Path | None) -> list[str] | None:
    if path is None:
        return None
    if path.suffix == ".json":
        vocabulary = _read_json(path)
        if not isinstance(vocabulary, list):
            raise ModelLoadError(f"{path} is not a JSON list of tokens")
        return vocabulary
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"Cannot read {path}: {exc}") from exc


def read_special_ids(tokenizer: dict[str, Any]) -> SpecialIds:
    added = {t["content"]: t["id"] for t in tokenizer.get("added_tokens", [])}

    def require(*names: str) -> int:
        for name in names:
            if name in added:
                return added[name]
        raise ModelLoadError(f"tokenizer.json has none of the special tokens {list(names)}")

    return SpecialIds(
        eot=require("<|endoftext|>"),
        sot=require("<|startoftranscript|>"),
        sot_prev=require("<|startofprev|>"),
        no_timestamps=require("<|notimestamps|>"),
        transcribe=require("<|transcribe|>"),
        translate=require("<|translate|>"),
        languages={f"<|{c}|>": added[f"<|{c}|>"] for c in LANGUAGES if f"<|{c}|>" in added},
    )


def timestamp_token(index: int) -> str:
    return f"<|{index * 0.02:.2f}|>"


def add_timestamp_tokens(
    tokenizer: dict[str, Any], vocabulary: list[str] | None, ids: SpecialIds, dims: WhisperDims
) -> dict[str, Any]:
    """Add ``<|0.00|>`` ... ``<|30.00|>`` as special tokens after ``<|notimestamps|>``."""
    first = ids.no_timestamps + 1
    expected = [timestamp_token(i) for i in range(N_TIMESTAMPS)]
    if vocabulary is not None:
        if len(vocabulary) != dims.vocab_size:
            raise ModelLoadError(
                f"The vocabulary has {len(vocabulary)} tokens but the model {dims.vocab_size}"
            )
        if vocabulary[first : first + N_TIMESTAMPS] != expected:
            raise ModelLoadError(
                "The vocabulary does not list the timestamp tokens <|0.00|> ... <|30.00|> "
                "right after <|notimestamps|>"
            )
    if first + N_TIMESTAMPS > dims.vocab_size:
        raise ModelLoadError(
            f"<|notimestamps|> is id {ids.no_timestamps}: the {N_TIMESTAMPS} timestamp tokens "
            f"do not fit the model's {dims.vocab_size}-token vocabulary"
        )
    present = {t["content"] for t in tokenizer.get("added_tokens", [])}
    new_tokens = [
        {
            "id": first + i,
            "content": token,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, token in enumerate(expected)
        if token not in present
    ]
    return {**tokenizer, "added_tokens": [*tokenizer.get("added_tokens", []), *new_tokens]}


def whisper_config(dims: WhisperDims, ids: SpecialIds, ct2_config: dict) -> dict[str, Any]:
    return {
        "architectures": ["WhisperForConditionalGeneration"],
        "model_type": "whisper",
        "vocab_size": dims.vocab_size,
        "num_mel_bins": dims.n_mels,
        "d_model": dims.d_model,
        "encoder_layers": dims.encoder_layers,
        "encoder_attention_heads": dims.encoder_heads,
        "encoder_ffn_dim": dims.encoder_ffn,
        "decoder_layers": dims.decoder_layers,
        "decoder_attention_heads": dims.decoder_heads,
        "decoder_ffn_dim": dims.decoder_ffn,
        "num_hidden_layers": dims.encoder_layers,
        "max_source_positions": dims.n_audio_ctx,
        "max_target_positions": dims.n_text_ctx,
        "activation_function": "gelu",
        "scale_embedding": False,
        "tie_word_embeddings": True,
        "is_encoder_decoder": True,
        "use_cache": True,
        "dropout": 0.0,
        "attention_dropout": 0.0,
        "activation_dropout": 0.0,
        "encoder_layerdrop": 0.0,
        "decoder_layerdrop": 0.0,
        "init_std": 0.02,
        "apply_spec_augment": False,
        "use_weighted_layer_sum": False,
        "median_filter_width": 7,
        "bos_token_id": ids.eot,
        "eos_token_id": ids.eot,
        "pad_token_id": ids.eot,
        "decoder_start_token_id": ids.sot,
        "suppress_tokens": list(ct2_config.get("suppress_ids", [])),
        "begin_suppress_tokens": list(ct2_config.get("suppress_ids_begin", [220, ids.eot])),
        # Weights stay float16 on disk; a plain load computes in float32.
        "dtype": "float32",
    }


def generation_config(ids: SpecialIds, ct2_config: dict, multilingual: bool) -> dict[str, Any]:
    config: dict[str, Any] = {
        "alignment_heads": [list(pair) for pair in ct2_config.get("alignment_heads", [])],
        "begin_suppress_tokens": list(ct2_config.get("suppress_ids_begin", [220, ids.eot])),
        "suppress_tokens": list(ct2_config.get("suppress_ids", [])),
        "bos_token_id": ids.eot,
        "eos_token_id": ids.eot,
        "pad_token_id": ids.eot,
        "decoder_start_token_id": ids.sot,
        "no_timestamps_token_id": ids.no_timestamps,
        "prev_sot_token_id": ids.sot_prev,
        "max_initial_timestamp_index": 50,
        "max_length": 448,
        "return_timestamps": False,
        "is_multilingual": multilingual,
    }
    if multilingual:
        # English-only models carry multilingual-numbered lang_ids in config.json: not used.
        config["lang_to_id"] = ids.languages
        config["task_to_id"] = {"transcribe": ids.transcribe, "translate": ids.translate}
    return config


def preprocessor_config(n_mels: int) -> dict[str, Any]:
    return {
        "feature_extractor_type": "WhisperFeatureExtractor",
        "feature_size": n_mels,
        "sampling_rate": 16000,
        "hop_length": 160,
        "n_fft": 400,
        "chunk_length": 30,
        "n_samples": 480000,
        "nb_max_frames": 3000,
        "padding_side": "right",
        "padding_value": 0.0,
        "return_attention_mask": False,
    }
