"""Stand-in of ``tensorrt_llm.llmapi.llm`` (test package, not NVIDIA's library).

The engine-configuration failures are reproduced where the real library raises them:
- no ``kv_cache_config.cross_kv_cache_fraction`` for an encoder-decoder model: ValueError at
  construction;
- an explicit ``max_seq_len`` larger than ``max_input_len`` (2048 vs 1024 in the report):
  "No free block found. This shouldn't happen!" at construction (the exact trigger is
  inferred from the one reported row);
- block reuse on with the C++ capacity scheduler: RuntimeError("bad optional access") at the
  first request, after which the executor is dead;
- block reuse on with the Python scheduler and a repeated identical request: the #19515 error;
- the cross-KV pool sized from ``max_input_len`` (1024) for 1500 encoder positions: the
  RequestError is logged and the request fails with AssertionError("Sampling failed").
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tensorrt_llm._torch.models.modeling_whisper import WhisperDecoder, WhisperInputProcessor
from tensorrt_llm.executor.result import CompletionOutput
from tensorrt_llm.executor.utils import RequestError
from tensorrt_llm.llmapi.llm_args import TorchLlmArgs
from tensorrt_llm.sampling_params import SamplingParams

logger = logging.getLogger("tensorrt_llm")

# Config attributes the real _get_cross_kv_cache_layout() caps the cross pool with; Whisper's
# max_source_positions is not among them (issue #19514).
CROSS_LEN_ATTRIBUTES = (
    "max_encoder_input_len",
    "encoder_max_input_length",
    "max_encoder_position_embeddings",
    "encoder_max_position_embeddings",
    "max_position_embeddings",
    "n_positions",
)


class RequestOutput:
    """The output of one request; ``result()`` waits for it (like the real GenerationResult)."""

    def __init__(self, request_id: int, prompt: str | None, prompt_token_ids: list[int]) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.outputs: list[CompletionOutput] = []
        self.finished = False
        self._future: Future[None] | None = None

    def result(self, timeout: float | None = None) -> RequestOutput:
        assert self._future is not None
        self._future.result(timeout)
        return self


class LLM:
    def __init__(
        self,
        model: str | Path,
        tokenizer: Any = None,
        tokenizer_mode: str = "auto",
        skip_tokenizer_init: bool = False,
        trust_remote_code: bool = False,
        tensor_parallel_size: int = 1,
        dtype: str = "auto",
        revision: str | None = None,
        tokenizer_revision: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.args = TorchLlmArgs(
            model=str(model),
            trust_remote_code=trust_remote_code,
            tensor_parallel_size=tensor_parallel_size,
            dtype=dtype,
            **kwargs,
        )
        model_path = Path(model)
        if not (model_path / "config.json").is_file():
            raise ValueError(f"test stand-in: {model} is not a local checkpoint directory")
        self.model_config = json.loads((model_path / "config.json").read_text())
        self._check_engine_config()
        self.input_processor = WhisperInputProcessor(model_path)
        self._decoder = WhisperDecoder(model_path)
        self._eos = self.input_processor.tokenizer.token_to_id("<|endoftext|>")
        self._timestamp_begin = self.input_processor.tokenizer.token_to_id("<|notimestamps|>") + 1
        self._ids = itertools.count()
        self._worker: ThreadPoolExecutor | None = ThreadPoolExecutor(1, "trtllm-sim")
        self._dead: BaseException | None = None
        self._seen_prompts: set[tuple[str, bytes]] = set()
        self._lock = threading.Lock()

    # -- engine configuration -------------------------------------------------------------
    def _check_engine_config(self) -> None:
        kv = self.args.kv_cache_config
        if self.model_config.get("is_encoder_decoder") and kv.cross_kv_cache_fraction is None:
            raise ValueError(
                "Encoder-decoder models require kv_cache_config.cross_kv_cache_fraction to be set"
            )
        if self.args.enable_chunked_prefill:
            raise ValueError("Chunked prefill is not supported for encoder-decoder models")
        if self.args.max_seq_len is not None and self.args.max_seq_len > self.args.max_input_len:
            raise RuntimeError("No free block found. This shouldn't happen!")

    @property
    def _cross_kv_capacity(self) -> int:
        limit = self.args.max_input_len
        for name in CROSS_LEN_ATTRIBUTES:
            if name in self.model_config:
                return min(limit, int(self.model_config[name]))
        return limit

    @property
    def audio_sources_read(self) -> list[str]:
        """Path/URL audio items this engine was asked to read (stand-in only)."""
        return self.input_processor.audio_sources_read

    @property
    def is_shut_down(self) -> bool:
        """Stand-in only."""
        return self._worker is None

    # -- requests ---------------------------------------------------------------------------
    def generate_async(
        self,
        inputs: dict[str, Any] | str,
        sampling_params: SamplingParams | None = None,
        streaming: bool = False,
        **kwargs: Any,
    ) -> RequestOutput:
        if self._worker is None:
            raise RuntimeError("test stand-in: the LLM was shut down")
        if isinstance(inputs, str):
            inputs = {"prompt": inputs}
        params = sampling_params if sampling_params is not None else SamplingParams()
        if params.end_id is None:
            params.end_id = self._eos
            params.pad_id = self._eos
        if "prompt_token_ids" in inputs and "prompt" not in inputs:
            raise ValueError("Whisper requires a text prompt and multi_modal_data['audio']")
        prompt_ids, features = self.input_processor(inputs, params)
        output = RequestOutput(next(self._ids), inputs.get("prompt"), prompt_ids)
        key = (inputs.get("prompt") or "", features.numpy().tobytes())
        output._future = self._worker.submit(self._run, output, features, params, key)
        return output

    def generate(
        self,
        inputs: Any,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        **kwargs: Any,
    ) -> RequestOutput | list[RequestOutput]:
        unbatched = not isinstance(inputs, list)
        batch = [inputs] if unbatched else inputs
        futures = []
        for i, request in enumerate(batch):
            params = sampling_params[i] if isinstance(sampling_params, list) else sampling_params
            futures.append(self.generate_async(request, params))
        results = [f.result() for f in futures]
        return results[0] if unbatched else results

    def _run(
        self,
        output: RequestOutput,
        features: Any,
        params: SamplingParams,
        key: tuple[str, bytes],
    ) -> None:
        self._schedule(key)
        encoder_len = int(self.model_config["max_source_positions"])
        if encoder_len > self._cross_kv_capacity:
            error = RequestError(
                f"The max KV cache length of input sequences ({encoder_len}) exceeds the KV "
                f"cache manager's maximum supported length ({self._cross_kv_capacity})"
            )
            logger.error("Encountered an error in forward function: %s", error)
            raise AssertionError("Sampling failed") from error
        if self.args.max_num_tokens is not None and encoder_len > self.args.max_num_tokens:
            raise RequestError(  # inferred: an encoder pass cannot be split
                f"The encoder input ({encoder_len} tokens) exceeds max_num_tokens "
                f"({self.args.max_num_tokens})"
            )
        encoded = self._decoder.encode(features)
        decoded = self._decoder.decode(output.request_id, encoded, output.prompt_token_ids, params)
        text_ids = [t for t in decoded.token_ids if t < self._eos]
        text = self.input_processor.tokenizer.decode(text_ids, skip_special_tokens=True)
        output.outputs = [
            CompletionOutput(
                index=0,
                text=text if params.detokenize else "",
                token_ids=decoded.token_ids,
                cumulative_logprob=decoded.cumulative_logprob if params.logprobs else None,
                logprobs=decoded.logprobs if params.logprobs else [],
                finish_reason=decoded.finish_reason,
            )
        ]
        output.finished = True

    def _schedule(self, key: tuple[str, bytes]) -> None:
        """The capacity scheduler's part of the known failures."""
        with self._lock:
            if self._dead is not None:
                raise self._dead
            kv = self.args.kv_cache_config
            if kv.enable_block_reuse and not self.args.scheduler_config.use_python_scheduler:
                # capacityScheduler.cpp: req->getEncoderUniqueTokens().value() on features.
                self._dead = RuntimeError("bad optional access")
                raise self._dead
            if kv.enable_block_reuse and key in self._seen_prompts:
                raise ValueError(
                    "Request requires multimodal_embed_mask_cumsum for chunked prefill or "
                    "KV-cache reuse"
                )
            self._seen_prompts.add(key)

    # -- lifetime ---------------------------------------------------------------------------
    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.shutdown(wait=True, cancel_futures=True)
            self._worker = None

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> bool:
        self.shutdown()
        return False
