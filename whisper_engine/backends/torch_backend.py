"""The PyTorch backend: Hugging Face transformers' Whisper weights, our own decode loop.

The encoder is transformers' module as is. The decoder is driven here, layer by layer, over
the same modules' weights: a preallocated self-attention cache, cross-attention keys and
values computed once per window, Whisper's token rules applied on the device, and
cross-attention probabilities on demand for word alignment. Owning the loop keeps the seam's
contract (tokens, log-probabilities, no-speech probability) independent of transformers'
``generate`` and its changing cache API.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

from whisper_engine.backends.base import (
    WINDOW_SAMPLES,
    AlignmentRequest,
    WindowOutput,
    WindowRequest,
)
from whisper_engine.backends.torch_rules import RuleMasks, TimestampState, apply_rules
from whisper_engine.errors import ModelLoadError

log = logging.getLogger(__name__)

N_FFT = 400
HOP_LENGTH = 160


def pick_device(device: str | None) -> str:
    if device:
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


class TorchBackend:
    name = "torch"
    supports_previous_text = True

    def __init__(
        self,
        checkpoint_dir: str | Path,
        *,
        device: str | None = None,
        dtype: str | None = None,
        max_batch_size: int = 32,
        quantize_int8: bool = False,
    ) -> None:
        self.device = pick_device(device)
        # int8 layers compute in float32 around their int8 weights: no bfloat16 parts then
        float32 = Precision.uniform(torch.float32)
        self.precision = float32 if quantize_int8 else pick_precision(self.device, dtype)
        self.dtype = self.precision.weights
        self.max_batch_size = max_batch_size
        self.model = _load_model(Path(checkpoint_dir), self.device, self.dtype, quantize_int8)
        self.model.model.encoder.to(self.precision.encoder)
        config = self.model.config
        self.max_target_positions = int(config.max_target_positions)
        self.n_mels = int(config.num_mel_bins)
        extractor = WhisperFeatureExtractor.from_pretrained(str(checkpoint_dir))
        self._mel_filters = torch.tensor(extractor.mel_filters, dtype=torch.float32).T.to(
            self.device
        )
        self._window = torch.hann_window(N_FFT, device=self.device)
        self._alignment_heads = _alignment_heads(self.model)
        self._decoder = self.model.model.decoder
        for layer in self._decoder.layers:
            # used only to make the stored cross-attention keys and values: computed in the
            # format they are stored in
            layer.encoder_attn.k_proj.to(self.precision.cross_kv)
            layer.encoder_attn.v_proj.to(self.precision.cross_kv)
        self._vocabulary = self.model.proj_out.weight.to(self.precision.logits)
        # on CPUs, for one query row, two plain products beat the fused attention kernel
        # (3-5x in bfloat16); they also serve keys stored narrower than the decoder. Their
        # keys are stored transposed, so no step has to transpose 1500 of them again.
        self._cross_by_products = (
            self.device == "cpu" or self.precision.cross_kv != self.precision.weights
        )

    # ----- the seam -----

    @torch.inference_mode()
    def generate(self, requests: Sequence[WindowRequest]) -> list[WindowOutput]:
        outputs: dict[int, WindowOutput] = {}
        for indices in self._batches(requests):
            batch = [requests[i] for i in indices]
            for i, out in zip(indices, self._generate_batch(batch), strict=True):
                outputs[i] = out
        return [outputs[i] for i in range(len(requests))]

    @torch.inference_mode()
    def next_token_logprobs(
        self, audios: Sequence[np.ndarray], prompt_ids: tuple[int, ...], candidates: Sequence[int]
    ) -> np.ndarray:
        rows = []
        for start in range(0, len(audios), self.max_batch_size):
            chunk = audios[start : start + self.max_batch_size]
            cross = self._cross_kv(self._encode(chunk))
            tokens = torch.tensor([prompt_ids] * len(chunk), device=self.device)
            cache = self._new_cache(len(chunk), len(prompt_ids))
            logits = self._forward(tokens, 0, cache, cross)[:, -1].float()
            picked = logits[:, list(candidates)]
            rows.append(torch.log_softmax(picked, dim=-1).cpu().numpy())
        return np.concatenate(rows)

    @torch.inference_mode()
    def alignment_weights(self, requests: Sequence[AlignmentRequest]) -> list[np.ndarray] | None:
        results: list[np.ndarray] = []
        for request in requests:
            cross = self._cross_kv(self._encode([request.audio]))
            tokens = torch.tensor([request.token_ids], device=self.device)
            cache = self._new_cache(1, len(request.token_ids))
            collected: dict[int, torch.Tensor] = {}
            self._forward(tokens, 0, cache, cross, collect_attention=collected)
            heads = [collected[layer][0, head] for layer, head in self._alignment_heads]
            results.append(torch.stack(heads).float().cpu().numpy())
        return results

    def close(self) -> None:
        self.model = None  # type: ignore[assignment]
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()

    # ----- features and encoder -----

    def _batches(self, requests: Sequence[WindowRequest]) -> list[list[int]]:
        """Indices grouped by prompt length (one cache layout per batch), then by size."""
        by_length: dict[int, list[int]] = {}
        for i, request in enumerate(requests):
            by_length.setdefault(len(request.prompt_ids), []).append(i)
        return [
            group[start : start + self.max_batch_size]
            for group in by_length.values()
            for start in range(0, len(group), self.max_batch_size)
        ]

    def _log_mel(self, audios: Sequence[np.ndarray]) -> torch.Tensor:
        padded = np.zeros((len(audios), WINDOW_SAMPLES), dtype=np.float32)
        for row, audio in zip(padded, audios, strict=True):
            row[: len(audio)] = audio[:WINDOW_SAMPLES]
        wave = torch.from_numpy(padded).to(self.device)
        stft = torch.stft(wave, N_FFT, HOP_LENGTH, window=self._window, return_complex=True)
        power = stft[..., :-1].abs() ** 2
        log_spec = torch.clamp(self._mel_filters @ power, min=1e-10).log10()
        floor = log_spec.amax(dim=(1, 2), keepdim=True) - 8.0
        return ((torch.maximum(log_spec, floor) + 4.0) / 4.0).to(self.precision.encoder)

    def _encode(self, audios: Sequence[np.ndarray]) -> torch.Tensor:
        features = self._log_mel(audios)
        return self.model.model.encoder(input_features=features).last_hidden_state

    def _cross_kv(self, encoded: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        encoded = encoded.to(self.precision.cross_kv)
        kv = []
        for layer in self._decoder.layers:
            attn = layer.encoder_attn
            key = _heads(attn.k_proj(encoded), attn)
            if self._cross_by_products:
                key = key.transpose(-1, -2).contiguous()
            # contiguous: a strided value would be copied again at every decoding step
            kv.append((key, _heads(attn.v_proj(encoded), attn).contiguous()))
        return kv

    # ----- decoder -----

    def _new_cache(self, batch: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        attn = self._decoder.layers[0].self_attn
        shape = (batch, attn.num_heads, length, attn.head_dim)
        return [
            (
                torch.empty(shape, device=self.device, dtype=self.dtype),
                torch.empty(shape, device=self.device, dtype=self.dtype),
            )
            for _ in self._decoder.layers
        ]

    def _forward(
        self,
        tokens: torch.Tensor,
        offset: int,
        cache: list[tuple[torch.Tensor, torch.Tensor]],
        cross: list[tuple[torch.Tensor, torch.Tensor]],
        collect_attention: dict[int, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Logits for ``tokens`` placed at positions ``offset...``; fills the cache there."""
        decoder = self._decoder
        length = tokens.shape[1]
        positions = torch.arange(offset, offset + length, device=self.device)
        hidden = decoder.embed_tokens(tokens) + decoder.embed_positions.weight[positions]
        wanted = (
            {layer for layer, _ in self._alignment_heads} if collect_attention is not None else ()
        )
        for index, layer in enumerate(decoder.layers):
            hidden = hidden + self._self_attention(layer, hidden, cache[index], offset)
            normed = layer.encoder_attn_layer_norm(hidden)
            attn = layer.encoder_attn
            query = _heads(attn.q_proj(normed), attn)
            mixed, weights = self._cross_attention(
                query, cross[index], attn.scaling, keep_weights=index in wanted
            )
            if weights is not None and collect_attention is not None:
                collect_attention[index] = weights
            hidden = hidden + attn.out_proj(_merge(mixed))
            normed = layer.final_layer_norm(hidden)
            hidden = hidden + layer.fc2(layer.activation_fn(layer.fc1(normed)))
        hidden = decoder.layer_norm(hidden)
        return F.linear(hidden.to(self._vocabulary.dtype), self._vocabulary)

    def _cross_attention(
        self,
        query: torch.Tensor,
        key_value: tuple[torch.Tensor, torch.Tensor],
        scaling: float,
        keep_weights: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention over the 1500 encoder positions, and its weights when asked."""
        key, value = key_value
        if self._cross_by_products:
            key_t = key  # stored transposed
        elif keep_weights:
            key_t = key.transpose(-1, -2)
        else:
            return F.scaled_dot_product_attention(query, key, value, scale=scaling), None
        scores = (query.to(key_t.dtype) @ key_t).float() * scaling
        weights = scores.softmax(dim=-1)
        mixed = (weights.to(value.dtype) @ value).to(query.dtype)
        return mixed, (weights if keep_weights else None)

    def _self_attention(
        self, layer, hidden: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor], offset: int
    ) -> torch.Tensor:
        attn = layer.self_attn
        normed = layer.self_attn_layer_norm(hidden)
        length = hidden.shape[1]
        key_cache, value_cache = cache
        key_cache[:, :, offset : offset + length] = _heads(attn.k_proj(normed), attn)
        value_cache[:, :, offset : offset + length] = _heads(attn.v_proj(normed), attn)
        query = _heads(attn.q_proj(normed), attn)
        end = offset + length
        mixed = F.scaled_dot_product_attention(
            query,
            key_cache[:, :, :end],
            value_cache[:, :, :end],
            is_causal=length > 1 and offset == 0,
            scale=attn.scaling,
        )
        return attn.out_proj(_merge(mixed))

    def _generate_batch(self, batch: list[WindowRequest]) -> list[WindowOutput]:
        size = len(batch)
        prompt_length = len(batch[0].prompt_ids)
        budget = [min(r.max_new_tokens, self.max_target_positions - prompt_length) for r in batch]
        steps = max(budget)
        cross = self._cross_kv(self._encode([r.audio for r in batch]))
        cache = self._new_cache(size, prompt_length + steps)
        prompts = torch.tensor([r.prompt_ids for r in batch], device=self.device)
        logits = self._forward(prompts, 0, cache, cross)
        no_speech = _no_speech_probs(logits, batch)
        next_logits = logits[:, -1].float()

        rules = batch[0].rules
        sampler = _Sampler(batch, self.device)
        state = TimestampState.start(batch, self.device)
        masks = RuleMasks.build(rules, next_logits.shape[1], self.device)
        limit = torch.tensor(budget, device=self.device)
        tokens = torch.full((size, steps), rules.eot, device=self.device, dtype=torch.long)
        logprobs = torch.zeros((size, steps), device=self.device)
        eot_logprob = torch.zeros(size, device=self.device)
        done = torch.zeros(size, dtype=torch.bool, device=self.device)
        rows = torch.arange(size, device=self.device)  # the batch row of each decoding row
        for step in range(steps):
            filtered = apply_rules(next_logits, rules, state, step, masks)
            step_logprobs = torch.log_softmax(filtered, dim=-1)
            chosen = sampler.pick(filtered)
            chosen = torch.where(done, torch.full_like(chosen, rules.eot), chosen)
            chosen_logprob = step_logprobs.gather(1, chosen[:, None])[:, 0]
            ends = (chosen == rules.eot) & ~done
            eot_logprob[rows] = torch.where(ends, chosen_logprob, eot_logprob[rows])
            tokens[rows, step] = chosen
            logprobs[rows, step] = torch.where(done | ends, 0.0, chosen_logprob)
            done = done | ends | (step + 1 >= limit)
            state.advance(chosen, done)
            finished = int(done.sum())  # the step's one wait for the device
            if finished == len(done):
                break
            if finished * 4 >= len(done):
                # finished rows would still pay for every step (the cross-attention keys and
                # values are read in full): once a quarter of the batch is done, copying the
                # rest into a smaller batch is cheaper than carrying them
                keep = (~done).nonzero()[:, 0]
                rows, done, limit, chosen = rows[keep], done[keep], limit[keep], chosen[keep]
                cache = [(k[keep], v[keep]) for k, v in cache]
                cross = [(k[keep], v[keep]) for k, v in cross]
                state.select(keep)
                sampler.select(keep)
            next_logits = self._forward(chosen[:, None], prompt_length + step, cache, cross)[
                :, -1
            ].float()
        return _window_outputs(tokens, logprobs, eot_logprob, no_speech, rules.eot)


class _Sampler:
    """Greedy rows take the argmax; sampling rows draw at their temperature, seeded per row."""

    def __init__(self, batch: list[WindowRequest], device: str) -> None:
        self.temperatures = torch.tensor([r.temperature for r in batch], device=device)
        self.greedy = bool((self.temperatures == 0).all())
        self.generators = []
        if not self.greedy:
            for i, request in enumerate(batch):
                generator = torch.Generator(device=device)
                generator.manual_seed(request.seed if request.seed is not None else 1234 + i)
                self.generators.append(generator)

    def select(self, keep: torch.Tensor) -> None:
        self.temperatures = self.temperatures[keep]
        if self.generators:
            self.generators = [self.generators[i] for i in keep.tolist()]

    def pick(self, logits: torch.Tensor) -> torch.Tensor:
        best = logits.argmax(dim=-1)
        if self.greedy:
            return best
        picks = []
        for row, generator in enumerate(self.generators):
            temperature = float(self.temperatures[row])
            if temperature == 0:
                picks.append(best[row])
                continue
            probs = torch.softmax(logits[row] / temperature, dim=-1)
            picks.append(torch.multinomial(probs, 1, generator=generator)[0])
        return torch.stack(picks)


def _no_speech_probs(logits: torch.Tensor, batch: list[WindowRequest]) -> list[float]:
    """P(<|nospeech|>) at the position right after <|startoftranscript|>, as Whisper has it."""
    sot_index = _sot_index(batch[0])
    no_speech_id = batch[0].rules.no_speech
    probs = torch.softmax(logits[:, sot_index].float(), dim=-1)[:, no_speech_id]
    return [float(p) for p in probs.cpu()]


def _sot_index(request: WindowRequest) -> int:
    # the prompt ends with <|startoftranscript|> <|lang|> <|task|> [<|notimestamps|>]; the
    # start-of-transcript token is the first token after any previous-text prefix
    rules = request.rules
    return request.prompt_ids.index(rules.sot) if rules.sot in request.prompt_ids else 0


def _window_outputs(
    tokens: torch.Tensor,
    logprobs: torch.Tensor,
    eot_logprob: torch.Tensor,
    no_speech: list[float],
    eot: int,
) -> list[WindowOutput]:
    outputs = []
    for row_tokens, row_logprobs, end_logprob, nsp in zip(
        tokens.cpu().tolist(),
        logprobs.cpu().tolist(),
        eot_logprob.cpu().tolist(),
        no_speech,
        strict=True,
    ):
        finished = eot in row_tokens
        length = row_tokens.index(eot) if finished else len(row_tokens)
        kept = tuple(row_logprobs[:length])
        outputs.append(
            WindowOutput(
                token_ids=tuple(row_tokens[:length]),
                logprobs=kept,
                sum_logprob=sum(kept) + (end_logprob if finished else 0.0),
                finished=finished,
                no_speech_prob=nsp,
            )
        )
    return outputs


def _heads(x: torch.Tensor, attn) -> torch.Tensor:
    batch, length, _ = x.shape
    return x.view(batch, length, attn.num_heads, attn.head_dim).transpose(1, 2)


def _merge(x: torch.Tensor) -> torch.Tensor:
    batch, heads, length, dim = x.shape
    return x.transpose(1, 2).reshape(batch, length, heads * dim)


DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Precision:
    """Number formats of the parts of the model."""

    weights: torch.dtype  # the decoder's layers
    encoder: torch.dtype  # the encoder's weights and activations
    cross_kv: torch.dtype  # the cross-attention keys and values, read at every step
    logits: torch.dtype  # the vocabulary projection

    @classmethod
    def uniform(cls, dtype: torch.dtype) -> Precision:
        return cls(dtype, dtype, dtype, dtype)


def pick_precision(device: str, dtype: str | None) -> Precision:
    """A named dtype everywhere; else float16 on GPUs; on CPUs float32 where it counts.

    On a CPU that computes bfloat16 natively, the three memory- or compute-heavy parts run in
    bfloat16: the encoder (~1.8x faster), the cross-attention keys and values (every decoding
    step reads all of them) and the vocabulary projection (a 51865-row product per step,
    ~4x faster). The decoder's layers, which carry the step-to-step state, stay float32.
    """
    if dtype:
        return Precision.uniform(DTYPES[dtype])
    if device.startswith("cuda"):
        return Precision.uniform(torch.float16)
    if device == "cpu" and _cpu_has_native_bfloat16():
        return Precision(torch.float32, torch.bfloat16, torch.bfloat16, torch.bfloat16)
    return Precision.uniform(torch.float32)


def _cpu_has_native_bfloat16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def _load_model(
    checkpoint_dir: Path, device: str, dtype: torch.dtype, quantize_int8: bool
) -> WhisperForConditionalGeneration:
    try:
        model = WhisperForConditionalGeneration.from_pretrained(
            str(checkpoint_dir), dtype=dtype, attn_implementation="sdpa"
        )
    except Exception as exc:
        raise ModelLoadError(
            f"Cannot load the Whisper checkpoint at {checkpoint_dir}: {exc}"
        ) from exc
    # transformers types .to() as a decorated method that mypy cannot follow
    model = model.to(device).eval()  # type: ignore[arg-type]
    for attn in _attention_modules(model):
        # transformers' attention modules keep the head layout as attributes under names
        # that changed between versions; the decode loop needs them under one name
        attn.num_heads = getattr(attn, "num_heads", None) or model.config.decoder_attention_heads
        attn.head_dim = attn.q_proj.out_features // attn.num_heads
        attn.scaling = attn.head_dim**-0.5
    if quantize_int8:
        model = _quantize_linear_int8(model)
    return model


def _attention_modules(model: WhisperForConditionalGeneration) -> list:
    layers = model.model.decoder.layers
    return [layer.self_attn for layer in layers] + [layer.encoder_attn for layer in layers]


def _quantize_linear_int8(model: WhisperForConditionalGeneration):
    """Every nn.Linear to int8 weights with one scale per output channel (dynamic activations).

    Opt-in: on the base model over 250 s of real speech (bench/cpu_rtfx.py) per-tensor scales
    (quantize_dynamic's default) gave 11.3% WER, per-channel scales 5.2%, float32 1.1-1.6%.
    """
    import warnings

    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():
        # eager-mode quantization is deprecated in favour of torchao, which is not installed
        warnings.simplefilter("ignore", DeprecationWarning)
        return quantize_dynamic(model, {torch.nn.Linear: per_channel_dynamic_qconfig})


def _alignment_heads(model: WhisperForConditionalGeneration) -> list[tuple[int, int]]:
    heads = getattr(model.generation_config, "alignment_heads", None)
    if heads:
        return [(int(layer), int(head)) for layer, head in heads]
    # no published heads: openai-whisper's default, every head of the upper half of layers
    config = model.config
    return [
        (layer, head)
        for layer in range(config.decoder_layers // 2, config.decoder_layers)
        for head in range(config.decoder_attention_heads)
    ]
