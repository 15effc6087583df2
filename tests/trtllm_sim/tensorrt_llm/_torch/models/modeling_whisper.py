"""Stand-in of ``tensorrt_llm/_torch/models/modeling_whisper.py`` (test package, not NVIDIA's
library): the Whisper input processor, with the real checks and messages, and a CPU decoder
built on the Hugging Face transformers model instead of TensorRT-LLM's kernels."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer
from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration
from transformers.utils import logging as hf_logging

from tensorrt_llm.executor.result import Logprob
from tensorrt_llm.sampling_params import SamplingParams

logger = logging.getLogger("tensorrt_llm")


class WhisperInputProcessor:
    """Audio -> log-mel features, text prompt -> decoder prompt ids (real rules)."""

    requires_encoder_features = True
    MAX_AUDIO_SECONDS = 30.0
    SAMPLING_RATE = 16000

    def __init__(self, model_path: Path) -> None:
        self.config = json.loads((model_path / "config.json").read_text())
        self.tokenizer = Tokenizer.from_file(str(model_path / "tokenizer.json"))
        self.feature_extractor = WhisperFeatureExtractor.from_pretrained(str(model_path))
        self.audio_sources_read: list[str] = []  # path/URL items a caller sent
        self._decoder_prompt = self._build_decoder_prompt()

    def _build_decoder_prompt(self) -> list[int]:
        start_id = self.config.get("decoder_start_token_id")
        if start_id is None:
            raise ValueError(
                "Whisper requires config.decoder_start_token_id to build the decoder prompt."
            )
        tid = self.tokenizer.token_to_id
        if tid("<|de|>") is not None:  # multilingual: English transcription is hard-coded
            forced = [tid("<|en|>"), tid("<|transcribe|>"), tid("<|notimestamps|>")]
        else:
            forced = [tid("<|notimestamps|>")]
        return [int(start_id), *forced]

    def resolve_decoder_prompt(self, prompt_text: str | None) -> list[int]:
        prompt_text = (prompt_text or "").strip()
        if not prompt_text:
            return list(self._decoder_prompt)
        decoder_prompt = self.tokenizer.encode(prompt_text, add_special_tokens=False).ids
        start_id = int(self.config["decoder_start_token_id"])
        if not decoder_prompt or decoder_prompt[0] != start_id:
            raise ValueError(
                "A Whisper text prompt overrides the decoder prompt and must "
                f"start with <|startoftranscript|> (token {start_id}), e.g. "
                "'<|startoftranscript|><|de|><|transcribe|><|notimestamps|>'; "
                f"got {prompt_text[:80]!r}."
            )
        max_prompt = int(self.config["max_target_positions"]) - 1
        if len(decoder_prompt) > max_prompt:
            raise ValueError(
                f"Whisper decoder prompt has {len(decoder_prompt)} tokens; at "
                f"most {max_prompt} fit the decoder position table."
            )
        return [int(token) for token in decoder_prompt]

    def load_waveform(self, item: Any) -> np.ndarray:
        if isinstance(item, str):
            # The real library reads the file or fetches the URL here. The stand-in records
            # it (tests prove the adapter never sends one) and refuses.
            self.audio_sources_read.append(item)
            raise ValueError(f"test stand-in: refusing to read audio from {item!r}")
        if isinstance(item, dict) and "array" in item:
            waveform = item["array"]
            sample_rate = item.get("sampling_rate", self.SAMPLING_RATE)
        elif isinstance(item, (tuple, list)) and len(item) == 2:
            waveform, sample_rate = item
        else:
            raise TypeError(
                "Unsupported audio item for Whisper: expected a file "
                "path/URL, an (array, sample_rate) tuple, or a dict with "
                f"'array'/'sampling_rate'; got {type(item).__name__}."
            )
        if int(sample_rate) != self.SAMPLING_RATE:
            raise ValueError(
                f"Whisper expects {self.SAMPLING_RATE} Hz audio; got "
                f"{sample_rate} Hz. Resample on the client side."
            )
        waveform = np.asarray(waveform, dtype=np.float32)
        if waveform.ndim == 2:
            waveform = waveform.mean(axis=1)
        duration = waveform.shape[0] / float(self.SAMPLING_RATE)
        if duration > self.MAX_AUDIO_SECONDS:
            raise ValueError(
                f"Audio is {duration:.2f}s long, but Whisper supports at "
                f"most {self.MAX_AUDIO_SECONDS:.0f}s per request; chunk the "
                "input on the client side."
            )
        return waveform

    def __call__(
        self, inputs: dict[str, Any], sampling_params: SamplingParams
    ) -> tuple[list[int], torch.Tensor]:
        mm_data = inputs.get("multi_modal_data") or {}
        audio_items = mm_data.get("audio")
        if audio_items is None:
            raise ValueError(
                "Whisper requires multi_modal_data['audio'] (the text prompt "
                "carries no encoder input)."
            )
        if not isinstance(audio_items, list):
            audio_items = [audio_items]
        if len(audio_items) != 1:
            raise ValueError(
                f"Whisper supports exactly one audio clip per request; got {len(audio_items)}."
            )
        decoder_prompt = self.resolve_decoder_prompt(inputs.get("prompt"))
        decoder_budget = int(self.config["max_target_positions"]) - len(decoder_prompt)
        if sampling_params.max_tokens is None or sampling_params.max_tokens > decoder_budget:
            if sampling_params.max_tokens is not None:
                logger.warning(
                    f"Capping max_tokens from {sampling_params.max_tokens} to {decoder_budget}"
                )
            sampling_params.max_tokens = decoder_budget
        waveform = self.load_waveform(audio_items[0])
        features = self.feature_extractor(
            waveform, sampling_rate=self.SAMPLING_RATE, return_tensors="pt"
        ).input_features
        return decoder_prompt, features


@dataclass
class Decoded:
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None
    cumulative_logprob: float
    finish_reason: str


class WhisperDecoder:
    """Decodes one request on the CPU with the Hugging Face model (fp32)."""

    def __init__(self, model_path: Path) -> None:
        hf_logging.disable_progress_bar()
        self.model = WhisperForConditionalGeneration.from_pretrained(
            str(model_path), dtype=torch.float32
        ).eval()

    @torch.inference_mode()
    def encode(self, features: torch.Tensor) -> torch.Tensor:
        return self.model.model.encoder(features).last_hidden_state

    @torch.inference_mode()
    def decode(
        self, req_id: int, encoded: torch.Tensor, prompt: list[int], params: SamplingParams
    ) -> Decoded:
        processors = params.logits_processor or []
        if not isinstance(processors, list):
            processors = [processors]
        greedy = params._greedy_decoding or params.temperature == 0
        generator = torch.Generator().manual_seed(params.seed or 0)
        tokens, logprobs, cumulative = list(prompt), [], 0.0
        cache, step_input, finish = None, torch.tensor([prompt]), "length"
        for _ in range(params.max_tokens):
            out = self.model(
                encoder_outputs=(encoded,),
                decoder_input_ids=step_input,
                cache=cache,
                use_cache=True,
            )
            cache = out.cache
            logits = out.logits[:, -1, :].float().clone()  # [1, vocab]
            for processor in processors:
                processor(req_id, logits, [list(tokens)], None, None)
            step_logprobs = torch.log_softmax(logits[0], dim=-1)
            token = self._choose(logits[0], params, greedy, generator)
            cumulative += float(step_logprobs[token])
            if params.logprobs:
                logprobs.append(_top_logprobs(step_logprobs, token, params.logprobs))
            tokens.append(token)
            if token == params.end_id and not params.ignore_eos:
                finish = "stop"
                break
            step_input = torch.tensor([[token]])
        return Decoded(tokens[len(prompt) :], logprobs or None, cumulative, finish)

    @staticmethod
    def _choose(
        logits: torch.Tensor, params: SamplingParams, greedy: bool, generator: torch.Generator
    ) -> int:
        if greedy:
            return int(torch.argmax(logits))
        scaled = logits / (params.temperature if params.temperature is not None else 1.0)
        if params.top_k and params.top_k > 0:
            kth = torch.topk(scaled, params.top_k).values[-1]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        probs = torch.softmax(scaled, dim=-1)
        if params.top_p is not None and 0.0 < params.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < params.top_p
            probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
        return int(torch.multinomial(probs, 1, generator=generator))


def _top_logprobs(step: torch.Tensor, token: int, k: int) -> dict[int, Logprob]:
    values, ids = torch.topk(step, k)
    entries = {
        int(t): Logprob(float(v), rank + 1)
        for rank, (v, t) in enumerate(zip(values, ids, strict=True))
    }
    if token not in entries:
        rank = int((step > step[token]).sum()) + 1
        entries[token] = Logprob(float(step[token]), rank)
    return entries
