"""CTranslate2 Whisper ``model.bin``: read it with numpy and map it onto transformers' names.

Layout (little-endian): ``uint32 version`` · string spec name · ``uint32 revision`` ·
``uint32 n_variables`` then per variable: string name · ``uint8 rank`` · ``uint32`` dims ·
``uint8 dtype`` · ``uint32 n_bytes`` · raw bytes; then ``uint32 n_aliases`` and
(alias, target) string pairs. A string is a ``uint16`` length counting a trailing NUL, then
the bytes. Tensors are views of a read-only memory map: nothing is copied until written.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from whisper_engine.errors import ModelLoadError

FORMAT_VERSION = 6
WHISPER_SPEC = "WhisperSpec"
WHISPER_SPEC_REVISION = 3
BF16 = 5
DTYPES: dict[int, np.dtype] = {
    0: np.dtype("<f4"),
    1: np.dtype("i1"),
    2: np.dtype("<i2"),
    3: np.dtype("<i4"),
    4: np.dtype("<f2"),
    BF16: np.dtype("<u2"),  # widened to float32 on read: numpy has no bfloat16
}
DTYPE_CODES = {np.dtype("<f4"): 0, np.dtype("i1"): 1, np.dtype("<i2"): 2, np.dtype("<i4"): 3}
DTYPE_CODES[np.dtype("<f2")] = 4
TIED_PROJECTION = ("decoder/projection/weight", "decoder/embeddings/weight")
# Scalars the converted model relies on, with the only values transformers' Whisper supports.
# CTranslate2's activation code 3 is exact (erf) GELU.
FIXED_SCALARS = {
    "decoder/activation": 3,
    "decoder/alibi": 0,
    "decoder/pre_norm": 1,
    "decoder/scale_embeddings": 0,
    "decoder/start_from_zero_embedding": 0,
}
# Generic transformer-decoder scalars that Whisper's spec carries but does not use.
IGNORED_SCALARS = frozenset({"decoder/alignment_heads", "decoder/alignment_layer"})
HEAD_SCALARS = ("encoder/num_heads", "decoder/num_heads")


@dataclass(frozen=True)
class CT2Model:
    spec: str
    revision: int
    variables: dict[str, np.ndarray]
    aliases: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class WhisperDims:
    n_mels: int
    vocab_size: int
    d_model: int
    encoder_layers: int
    decoder_layers: int
    encoder_heads: int
    decoder_heads: int
    encoder_ffn: int
    decoder_ffn: int
    n_audio_ctx: int
    n_text_ctx: int


class _Cursor:
    def __init__(self, buf: np.ndarray, path: Path) -> None:
        self.buf = buf
        self.pos = 0
        self.path = path

    def take(self, n_bytes: int, what: str) -> int:
        start = self.pos
        if start + n_bytes > len(self.buf):
            raise ModelLoadError(
                f"{self.path} is truncated or corrupted: {what} at byte {start} needs "
                f"{n_bytes} bytes but the file has {len(self.buf)}"
            )
        self.pos += n_bytes
        return start

    def unpack(self, fmt: str, what: str) -> int:
        size = struct.calcsize("<" + fmt)
        start = self.take(size, what)
        return struct.unpack_from("<" + fmt, self.buf[start : self.pos].tobytes())[0]

    def string(self, what: str) -> str:
        length = self.unpack("H", what)
        raw = bytes(self.buf[self.take(length, what) : self.pos])
        if length == 0 or raw[-1] != 0:
            raise ModelLoadError(f"{self.path} is corrupted: {what} is not a NUL-ended string")
        try:
            return raw[:-1].decode("ascii")
        except UnicodeDecodeError as exc:
            raise ModelLoadError(f"{self.path} is corrupted: {what} is not ASCII") from exc


def read_ct2_model(path: Path) -> CT2Model:
    """Parse a CTranslate2 ``model.bin``; every structural surprise is a ModelLoadError."""
    try:
        buf = np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"Cannot read CTranslate2 model {path}: {exc}") from exc
    cur = _Cursor(buf, path)
    version = cur.unpack("I", "format version")
    if version != FORMAT_VERSION:
        raise ModelLoadError(
            f"{path}: CTranslate2 model format version {version} is not supported "
            f"(expected {FORMAT_VERSION}); re-convert it with a current ct2-transformers-converter"
        )
    spec = cur.string("spec name")
    revision = cur.unpack("I", "spec revision")
    if spec != WHISPER_SPEC or revision != WHISPER_SPEC_REVISION:
        raise ModelLoadError(
            f"{path} holds a {spec!r} revision {revision} model; only {WHISPER_SPEC!r} "
            f"revision {WHISPER_SPEC_REVISION} (Whisper) is supported"
        )
    variables = {}
    for _ in range(cur.unpack("I", "variable count")):
        name, array = _read_variable(cur)
        variables[name] = array
    aliases = {}
    for _ in range(cur.unpack("I", "alias count")):
        alias = cur.string("alias name")
        aliases[alias] = cur.string("alias target")
    if cur.pos != len(buf):
        raise ModelLoadError(
            f"{path} is corrupted: {len(buf) - cur.pos} unexpected bytes after the last entry"
        )
    return CT2Model(spec=spec, revision=revision, variables=variables, aliases=aliases)


def _read_variable(cur: _Cursor) -> tuple[str, np.ndarray]:
    name = cur.string("variable name")
    rank = cur.unpack("B", f"rank of {name}")
    shape = tuple(cur.unpack("I", f"shape of {name}") for _ in range(rank))
    code = cur.unpack("B", f"dtype of {name}")
    n_bytes = cur.unpack("I", f"size of {name}")
    if code not in DTYPES:
        raise ModelLoadError(f"{cur.path} is corrupted: {name} has unknown dtype code {code}")
    dtype = DTYPES[code]
    if n_bytes != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
        raise ModelLoadError(
            f"{cur.path} is corrupted: {name} of shape {shape} ({dtype}) declares {n_bytes} bytes"
        )
    start = cur.take(n_bytes, f"data of {name}")
    array = np.frombuffer(cur.buf, dtype=dtype, count=n_bytes // dtype.itemsize, offset=start)
    array = array.reshape(shape)
    if code == BF16:
        array = (array.astype(np.uint32) << 16).view(np.float32)
    return name, array


def write_ct2_model(
    path: Path,
    variables: Mapping[str, np.ndarray],
    aliases: Mapping[str, str] | None = None,
    *,
    spec: str = WHISPER_SPEC,
    revision: int = WHISPER_SPEC_REVISION,
) -> None:
    """Write the same layout (used to build small test models and to check the reader)."""

    def string(text: str) -> bytes:
        raw = text.encode("ascii") + b"\0"
        return struct.pack("<H", len(raw)) + raw

    with open(path, "wb") as out:
        out.write(struct.pack("<I", FORMAT_VERSION) + string(spec) + struct.pack("<I", revision))
        out.write(struct.pack("<I", len(variables)))
        for name, value in variables.items():
            array = np.asarray(value, order="C")  # keeps scalars 0-d
            dtype = array.dtype.newbyteorder("<")
            out.write(string(name) + struct.pack("<B", array.ndim))
            out.write(struct.pack(f"<{array.ndim}I", *array.shape))
            out.write(struct.pack("<BI", DTYPE_CODES[dtype], array.nbytes))
            out.write(array.astype(dtype, copy=False).tobytes())
        out.write(struct.pack("<I", len(aliases or {})))
        for alias, target in (aliases or {}).items():
            out.write(string(alias) + string(target))


_LAYER = re.compile(r"^(encoder|decoder)/layer_(\d+)/(.+)$")
_NORM_PARAM = {"gamma": "weight", "beta": "bias"}
_LAYER_MODULES = {
    "self_attention/layer_norm": "self_attn_layer_norm",
    "self_attention/linear_1": "self_attn.out_proj",
    "attention/layer_norm": "encoder_attn_layer_norm",
    "attention/linear_0": "encoder_attn.q_proj",
    "attention/linear_2": "encoder_attn.out_proj",
    "ffn/layer_norm": "final_layer_norm",
    "ffn/linear_0": "fc1",
    "ffn/linear_1": "fc2",
}
_FUSED = {
    "self_attention/linear_0": ("self_attn", ("q_proj", "k_proj", "v_proj")),
    "attention/linear_1": ("encoder_attn", ("k_proj", "v_proj")),
}
_TOP_LEVEL = {
    "encoder/conv1": "model.encoder.conv1",
    "encoder/conv2": "model.encoder.conv2",
    "encoder/position_encodings/encodings": "model.encoder.embed_positions.weight",
    "decoder/position_encodings/encodings": "model.decoder.embed_positions.weight",
    "decoder/embeddings/weight": "model.decoder.embed_tokens.weight",
    "encoder/layer_norm": "model.encoder.layer_norm",
    "decoder/layer_norm": "model.decoder.layer_norm",
}


def to_hf_state_dict(model: CT2Model) -> tuple[dict[str, np.ndarray], WhisperDims]:
    """Map CTranslate2 Whisper variables onto WhisperForConditionalGeneration's state dict.

    ``proj_out`` is tied to the token embedding in transformers, so it is not written.
    """
    _check_aliases(model)
    tensors = {n: a for n, a in model.variables.items() if a.ndim > 0}
    scalars = {n: int(a) for n, a in model.variables.items() if a.ndim == 0}
    _check_scalars(scalars)
    quantized = sorted(n for n, a in tensors.items() if a.dtype.kind != "f")
    if quantized:
        raise ModelLoadError(
            f"The CTranslate2 model is quantized ({quantized[0]} is "
            f"{tensors[quantized[0]].dtype}); only float16/float32/bfloat16 models convert"
        )
    state: dict[str, np.ndarray] = {}
    for name, array in tensors.items():
        if name == TIED_PROJECTION[0]:
            continue  # a stored copy of the tied projection; checked in _check_aliases
        state.update(_map_variable(name, array))
    dims = _infer_dims(tensors, scalars)
    _check_shapes(state, dims)
    return state, dims


def _check_aliases(model: CT2Model) -> None:
    for alias, target in model.aliases.items():
        if (alias, target) != TIED_PROJECTION:
            raise ModelLoadError(f"Unexpected alias {alias!r} -> {target!r} in the model")
    stored = model.variables.get(TIED_PROJECTION[0])
    if stored is not None and not np.array_equal(stored, model.variables[TIED_PROJECTION[1]]):
        raise ModelLoadError(
            "The model's output projection differs from its token embedding; "
            "transformers' Whisper ties them, so it cannot be converted"
        )


def _check_scalars(scalars: dict[str, int]) -> None:
    for name, value in scalars.items():
        if name in IGNORED_SCALARS or name in HEAD_SCALARS:
            continue
        if name not in FIXED_SCALARS:
            raise ModelLoadError(f"Unknown scalar {name!r} in the CTranslate2 Whisper model")
        if value != FIXED_SCALARS[name]:
            raise ModelLoadError(
                f"{name} = {value} is not supported (Whisper uses {FIXED_SCALARS[name]})"
            )
    missing = [n for n in HEAD_SCALARS if n not in scalars]
    if missing:
        raise ModelLoadError(f"The CTranslate2 Whisper model lacks {missing}")


def _map_variable(name: str, array: np.ndarray) -> dict[str, np.ndarray]:
    prefix, _, param = name.rpartition("/")
    if name in _TOP_LEVEL:
        return {_TOP_LEVEL[name]: array}
    if prefix in _TOP_LEVEL and param in ("weight", "bias", "gamma", "beta"):
        return {f"{_TOP_LEVEL[prefix]}.{_NORM_PARAM.get(param, param)}": array}
    match = _LAYER.match(prefix)
    if match is None or param not in ("weight", "bias", "gamma", "beta"):
        raise ModelLoadError(f"Unknown variable {name!r} in the CTranslate2 Whisper model")
    stack, index, module = match.groups()
    base = f"model.{stack}.layers.{index}"
    hf_param = _NORM_PARAM.get(param, param)
    fused = _FUSED.get(module)
    cross_attention_module = module.startswith("attention/")
    if cross_attention_module and stack != "decoder":
        raise ModelLoadError(f"Unknown variable {name!r}: only the decoder has cross-attention")
    if fused is not None:
        return _split_fused(name, array, f"{base}.{fused[0]}", fused[1], hf_param)
    if module in _LAYER_MODULES:
        return {f"{base}.{_LAYER_MODULES[module]}.{hf_param}": array}
    raise ModelLoadError(f"Unknown variable {name!r} in the CTranslate2 Whisper model")


def _split_fused(
    name: str, array: np.ndarray, base: str, parts: tuple[str, ...], param: str
) -> dict[str, np.ndarray]:
    """Split row-stacked projections (Q;K;V or K;V); the K bias is zero and dropped."""
    if array.shape[0] % len(parts):
        raise ModelLoadError(f"{name} of shape {array.shape} cannot be split into {parts}")
    chunks = np.split(array, len(parts), axis=0)
    out = {}
    for part, chunk in zip(parts, chunks, strict=True):
        if part == "k_proj" and param == "bias":
            if np.any(chunk != 0):
                raise ModelLoadError(
                    f"{name}: the key bias is not zero; transformers' Whisper has no key bias"
                )
            continue
        out[f"{base}.{part}.{param}"] = chunk
    return out


def _infer_dims(tensors: dict[str, np.ndarray], scalars: dict[str, int]) -> WhisperDims:
    def shape(name: str) -> tuple[int, ...]:
        if name not in tensors:
            raise ModelLoadError(f"The CTranslate2 Whisper model lacks {name!r}")
        return tensors[name].shape

    def count_layers(stack: str) -> int:
        found = {int(m.group(2)) for n in tensors if (m := _LAYER.match(n)) and m[1] == stack}
        return max(found) + 1 if found else 0

    d_model, n_mels, _ = shape("encoder/conv1/weight")
    return WhisperDims(
        n_mels=n_mels,
        vocab_size=shape("decoder/embeddings/weight")[0],
        d_model=d_model,
        encoder_layers=count_layers("encoder"),
        decoder_layers=count_layers("decoder"),
        encoder_heads=scalars["encoder/num_heads"],
        decoder_heads=scalars["decoder/num_heads"],
        encoder_ffn=shape("encoder/layer_0/ffn/linear_0/weight")[0],
        decoder_ffn=shape("decoder/layer_0/ffn/linear_0/weight")[0],
        n_audio_ctx=shape("encoder/position_encodings/encodings")[0],
        n_text_ctx=shape("decoder/position_encodings/encodings")[0],
    )


def expected_hf_shapes(dims: WhisperDims) -> dict[str, tuple[int, ...]]:
    """Every key of WhisperForConditionalGeneration's state dict (without tied proj_out)."""
    d = dims.d_model
    shapes: dict[str, tuple[int, ...]] = {
        "model.encoder.conv1.weight": (d, dims.n_mels, 3),
        "model.encoder.conv1.bias": (d,),
        "model.encoder.conv2.weight": (d, d, 3),
        "model.encoder.conv2.bias": (d,),
        "model.encoder.embed_positions.weight": (dims.n_audio_ctx, d),
        "model.decoder.embed_positions.weight": (dims.n_text_ctx, d),
        "model.decoder.embed_tokens.weight": (dims.vocab_size, d),
    }
    for stack, layers, ffn in (
        ("encoder", dims.encoder_layers, dims.encoder_ffn),
        ("decoder", dims.decoder_layers, dims.decoder_ffn),
    ):
        shapes[f"model.{stack}.layer_norm.weight"] = (d,)
        shapes[f"model.{stack}.layer_norm.bias"] = (d,)
        attentions = ["self_attn", "encoder_attn"] if stack == "decoder" else ["self_attn"]
        for i in range(layers):
            base = f"model.{stack}.layers.{i}"
            norms = [f"{a}_layer_norm" for a in attentions] + ["final_layer_norm"]
            for module in norms:
                shapes[f"{base}.{module}.weight"] = (d,)
                shapes[f"{base}.{module}.bias"] = (d,)
            for attn in attentions:
                for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
                    shapes[f"{base}.{attn}.{proj}.weight"] = (d, d)
                    if proj != "k_proj":
                        shapes[f"{base}.{attn}.{proj}.bias"] = (d,)
            shapes[f"{base}.fc1.weight"] = (ffn, d)
            shapes[f"{base}.fc1.bias"] = (ffn,)
            shapes[f"{base}.fc2.weight"] = (d, ffn)
            shapes[f"{base}.fc2.bias"] = (d,)
    return shapes


def _check_shapes(state: dict[str, np.ndarray], dims: WhisperDims) -> None:
    expected = expected_hf_shapes(dims)
    missing = sorted(set(expected) - set(state))
    extra = sorted(set(state) - set(expected))
    if missing or extra:
        raise ModelLoadError(
            f"The CTranslate2 Whisper model does not match {dims}: "
            f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, unexpected {extra[:5]}"
        )
    for name, want in expected.items():
        if state[name].shape != want:
            raise ModelLoadError(f"{name} has shape {state[name].shape}, expected {want}")
    if dims.d_model % dims.encoder_heads or dims.d_model % dims.decoder_heads:
        raise ModelLoadError(f"d_model {dims.d_model} is not divisible by the head count")
