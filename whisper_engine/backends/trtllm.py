"""The TensorRT-LLM backend: Whisper on NVIDIA GPUs through the LLM API (PyTorch backend).

One ``tensorrt_llm.LLM`` per backend (per GPU); every window of a batch is submitted with
``generate_async`` so the library's in-flight batching stays full, then gathered.

What the library cannot give, and how this backend answers (docs/tensorrt-llm.md):
- logits at the prompt position (no-speech probability, language detection): a probe request
  with the prompt ``<|startoftranscript|>``, ``max_tokens=1`` and top-k logprobs. A token
  outside the returned top-k counts as probability ~0.
- Whisper's previous-text prompt (``<|startofprev|> text <|startoftranscript|> ...``): the
  library's processor requires the prompt to start with ``<|startoftranscript|>``, so such a
  request is refused with ``InvalidOption("prompt", ...)``.
- cross-attention weights (word timings): ``alignment_weights`` returns None; the engine
  core aligns words with a torch model of the same checkpoint instead.
- timestamp and suppression rules: applied by per-request logits processors
  (whisper_engine.backends.trtllm_rules).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from whisper_engine.backends.base import (
    SAMPLE_RATE,
    AlignmentRequest,
    WindowOutput,
    WindowRequest,
)
from whisper_engine.backends.trtllm_args import DEFAULT_MAX_BATCH_SIZE, trtllm_engine_args
from whisper_engine.errors import EngineFailure, InvalidOption, ModelLoadError
from whisper_engine.tokenizer import WhisperTokenizer

logger = logging.getLogger(__name__)

DEFAULT_PROBE_LOGPROBS = 20  # top-k logprobs asked of a probe request
REQUIRED_SAMPLING_FIELDS = ("max_tokens", "end_id", "logprobs", "logits_processor", "seed")


def _import_library() -> Any:
    try:
        import tensorrt_llm
    except ImportError as exc:
        raise ModelLoadError(
            "The trtllm backend needs TensorRT-LLM (NVIDIA's release container "
            "nvcr.io/nvidia/tensorrt-llm/release, 1.3.0rc25 or later): "
            f"{exc}"
        ) from exc
    return tensorrt_llm


def _field_names(cls: Any) -> set[str]:
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    return set(getattr(cls, "model_fields", {})) or set(dir(cls))


def check_library(trtllm: Any) -> bool:
    """Asserts what this backend relies on; returns whether the Python capacity scheduler
    can be selected (``SchedulerConfig.use_python_scheduler``)."""
    version = getattr(trtllm, "__version__", None)
    if not isinstance(version, str):
        raise ModelLoadError("tensorrt_llm has no __version__: not a TensorRT-LLM installation")
    from tensorrt_llm.llmapi import KvCacheConfig, SchedulerConfig

    problems = []
    if not hasattr(trtllm.LLM, "generate_async") or not hasattr(trtllm.LLM, "shutdown"):
        problems.append("LLM.generate_async / LLM.shutdown")
    missing = set(REQUIRED_SAMPLING_FIELDS) - _field_names(trtllm.SamplingParams)
    if missing:
        problems.append(f"SamplingParams fields {sorted(missing)}")
    if "cross_kv_cache_fraction" not in _field_names(KvCacheConfig):
        problems.append("KvCacheConfig.cross_kv_cache_fraction")
    if importlib.util.find_spec("tensorrt_llm._torch.models.modeling_whisper") is None:
        problems.append("the PyTorch-backend Whisper model (_torch/models/modeling_whisper.py)")
    if problems:
        raise ModelLoadError(
            f"TensorRT-LLM {version} lacks what the trtllm backend needs: "
            f"{'; '.join(problems)}. Use 1.3.0rc25 or later."
        )
    python_scheduler = "use_python_scheduler" in _field_names(SchedulerConfig)
    if not python_scheduler:
        logger.warning("TensorRT-LLM %s has no Python capacity scheduler option", version)
    return python_scheduler


class TrtllmBackend:
    """A Whisper checkpoint served by one ``tensorrt_llm.LLM``."""

    name = "trtllm"
    # the library requires every decoder prompt to start with <|startoftranscript|>
    supports_previous_text = False

    def __init__(
        self,
        checkpoint_dir: Path,
        tokenizer: WhisperTokenizer,
        *,
        device: str = "cuda:0",
        engine_overrides: dict[str, Any] | None = None,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        probe_logprobs: int = DEFAULT_PROBE_LOGPROBS,
        token_rules: bool = True,
    ) -> None:
        trtllm = _import_library()
        python_scheduler = check_library(trtllm)
        from tensorrt_llm.llmapi import KvCacheConfig, SchedulerConfig

        self._trtllm = trtllm
        self.tokenizer = tokenizer
        self.device = device
        self.checkpoint_dir = Path(checkpoint_dir)
        self._probe_logprobs = probe_logprobs
        self._token_rules = token_rules
        config = json.loads((self.checkpoint_dir / "config.json").read_text(encoding="utf-8"))
        self.max_target_positions = int(config["max_target_positions"])
        args = trtllm_engine_args(
            config,
            max_batch_size=max_batch_size,
            overrides=engine_overrides,
            installed_version=trtllm.__version__,
            python_scheduler=python_scheduler,
        )
        args["kv_cache_config"] = KvCacheConfig(**args["kv_cache_config"])
        if "scheduler_config" in args:
            args["scheduler_config"] = SchedulerConfig(**args["scheduler_config"])
        self.engine_args = args
        _select_device(device)
        try:
            self.llm = trtllm.LLM(model=str(self.checkpoint_dir), **args)
        except Exception as exc:
            raise ModelLoadError(f"TensorRT-LLM could not load {checkpoint_dir}: {exc}") from exc
        self._closed = False

    # -- decoding ---------------------------------------------------------------------------
    def generate(self, requests: Sequence[WindowRequest]) -> list[WindowOutput]:
        submitted = []
        for request in requests:
            self._check_prompt(request.prompt_ids)
            window = self._submit(request.audio, request.prompt_ids, self._window_params(request))
            probe = self._submit(request.audio, (self.tokenizer.special.sot,), self._probe_params())
            submitted.append((window, probe))
        return [
            self._window_output(self._gather(window), self._gather(probe))
            for window, probe in submitted
        ]

    def next_token_logprobs(
        self, audios: Sequence[np.ndarray], prompt_ids: tuple[int, ...], candidates: Sequence[int]
    ) -> np.ndarray:
        self._check_prompt(prompt_ids)
        from whisper_engine.backends.trtllm_rules import KeepOnly

        params = self._probe_params(KeepOnly(tuple(candidates)))
        pending = [self._submit(audio, prompt_ids, params) for audio in audios]
        rows = [self._candidate_row(self._gather(p), candidates) for p in pending]
        return np.stack(rows) if rows else np.zeros((0, len(candidates)), dtype=np.float32)

    def alignment_weights(self, requests: Sequence[AlignmentRequest]) -> list[np.ndarray] | None:
        return None  # the LLM API exposes no cross-attention

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.llm.shutdown()

    # -- requests ---------------------------------------------------------------------------
    def _check_prompt(self, prompt_ids: tuple[int, ...]) -> None:
        special = self.tokenizer.special
        if prompt_ids and prompt_ids[0] == special.sot_prev:
            raise InvalidOption(
                "prompt",
                "A previous-text prompt is not supported by the trtllm backend: TensorRT-LLM "
                "requires the decoder prompt to start with <|startoftranscript|>, and moving "
                "the text after the task tokens would make the model treat it as already "
                "spoken. Leave the prompt out, or use the torch backend.",
            )
        if not prompt_ids or prompt_ids[0] != special.sot:
            raise InvalidOption(
                "prompt", "The decoder prompt must start with <|startoftranscript|>"
            )
        if len(prompt_ids) >= self.max_target_positions:
            raise InvalidOption(
                "prompt", f"The decoder prompt is longer than {self.max_target_positions - 1}"
            )

    def _window_params(self, request: WindowRequest) -> Any:
        budget = self.max_target_positions - len(request.prompt_ids)
        processor = None
        if self._token_rules:
            from whisper_engine.backends.trtllm_rules import WhisperTokenRules

            processor = WhisperTokenRules(
                request.rules, len(request.prompt_ids), request.timestamps
            )
        return self._sampling_params(
            max_tokens=max(1, min(request.max_new_tokens, budget)),
            temperature=request.temperature,
            logprobs=1,
            seed=request.seed,
            logits_processor=processor,
        )

    def _probe_params(self, processor: Any = None) -> Any:
        return self._sampling_params(
            max_tokens=1, temperature=0.0, logprobs=self._probe_logprobs, logits_processor=processor
        )

    def _sampling_params(self, *, temperature: float, **fields: Any) -> Any:
        eot = self.tokenizer.special.eot
        if temperature > 0:  # plain sampling over the whole vocabulary
            choice = {"temperature": temperature, "top_k": 0, "top_p": 1.0}
        else:
            choice = {"top_k": 1}  # greedy
        return self._trtllm.SamplingParams(
            end_id=eot, pad_id=eot, detokenize=False, **choice, **fields
        )

    def _submit(self, audio: np.ndarray, prompt_ids: tuple[int, ...], params: Any) -> Any:
        # Only ever an in-memory array: a path or URL would make the library read files or
        # fetch URLs on the server's behalf.
        waveform = np.ascontiguousarray(audio, dtype=np.float32)
        request = {
            "prompt": self.tokenizer.prompt_text(prompt_ids),
            "multi_modal_data": {"audio": [(waveform, SAMPLE_RATE)]},
        }
        try:
            return self.llm.generate_async(request, sampling_params=params)
        except (ValueError, TypeError) as exc:
            raise EngineFailure(f"TensorRT-LLM refused a window: {exc}") from exc

    @staticmethod
    def _gather(pending: Any) -> Any:
        try:
            return pending.result()
        except Exception as exc:
            raise EngineFailure(f"TensorRT-LLM failed while decoding: {exc!r}") from exc

    # -- outputs ----------------------------------------------------------------------------
    def _window_output(self, result: Any, probe: Any) -> WindowOutput:
        completion = result.outputs[0]
        eot = self.tokenizer.special.eot
        token_ids = list(completion.token_ids)
        if len(completion.logprobs or []) != len(token_ids):
            raise EngineFailure("TensorRT-LLM returned no logprob for some generated tokens")
        steps = zip(completion.logprobs, token_ids, strict=True)
        logprobs = [_token_logprob(entry, token) for entry, token in steps]
        finished = bool(token_ids) and token_ids[-1] == eot
        sum_logprob = float(sum(logprobs))
        if finished:
            token_ids, logprobs = token_ids[:-1], logprobs[:-1]
        return WindowOutput(
            token_ids=tuple(token_ids),
            logprobs=tuple(logprobs),
            sum_logprob=sum_logprob,
            finished=finished or completion.finish_reason == "stop",
            no_speech_prob=self._no_speech_prob(probe),
        )

    def _no_speech_prob(self, probe: Any) -> float:
        entries = _first_step(probe)
        entry = entries.get(self.tokenizer.special.no_speech)
        return math.exp(_logprob_value(entry)) if entry is not None else 0.0

    @staticmethod
    def _candidate_row(result: Any, candidates: Sequence[int]) -> np.ndarray:
        entries = _first_step(result)
        row = np.array(
            [_logprob_value(entries[c]) if c in entries else -np.inf for c in candidates],
            dtype=np.float64,
        )
        finite = row[np.isfinite(row)]
        if finite.size:
            row = row - (finite.max() + np.log(np.exp(finite - finite.max()).sum()))
        return row.astype(np.float32)


def _first_step(result: Any) -> dict[int, Any]:
    logprobs = result.outputs[0].logprobs
    if not logprobs or not isinstance(logprobs[0], dict):
        raise EngineFailure("TensorRT-LLM returned no top-k logprobs for a probe request")
    return logprobs[0]


def _logprob_value(entry: Any) -> float:
    return float(getattr(entry, "logprob", entry))


def _token_logprob(entry: Any, token: int) -> float:
    """One step of ``CompletionOutput.logprobs``: a dict token -> Logprob, or a float."""
    if isinstance(entry, dict):
        return _logprob_value(entry[token])
    return float(entry)


def _select_device(device: str) -> None:
    """Makes ``cuda:N`` the current device before the LLM starts (it uses the current one)."""
    if not device.startswith("cuda:") or device == "cuda:0":
        return
    import torch

    torch.cuda.set_device(int(device.split(":", 1)[1]))
