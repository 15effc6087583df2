"""A TEST STAND-IN for NVIDIA's ``tensorrt_llm`` package: NOT NVIDIA's library.

TensorRT-LLM cannot be installed on the machines that build and test this project (it needs a
CUDA GPU; the package index only has a stub). This small package has the shape of the subset
of the real LLM API that ``whisper_engine.backends.trtllm`` uses: ``LLM`` (``generate``,
``generate_async``, ``shutdown``, context manager), ``SamplingParams`` (the real field names
and defaults: ``max_tokens`` defaults to 32), ``KvCacheConfig``, ``SchedulerConfig``,
``RequestOutput`` / ``CompletionOutput`` / ``Logprob`` and ``__version__``.

It enforces the rules in docs/tensorrt-llm-whisper.md of the project documentation and
reproduces the known failures with the same exception types and messages (the failure
matrix: "bad optional access" with block reuse on, the 1024-vs-1500 cross-KV RequestError
followed by "Sampling failed", "No free block found" at start-up, the missing
``cross_kv_cache_fraction`` error; the Whisper input processor's audio and prompt checks are
copied from ``tensorrt_llm/_torch/models/modeling_whisper.py``). Everything else decodes for
real through the Hugging Face transformers Whisper model on the CPU.

Tests put ``tests/trtllm_sim`` on ``sys.path`` inside a fixture only.
"""

from tensorrt_llm.llmapi import (
    LLM,
    CompletionOutput,
    KvCacheConfig,
    RequestOutput,
    SchedulerConfig,
)
from tensorrt_llm.sampling_params import LogitsProcessor, SamplingParams

__version__ = "1.3.0rc25"
IS_TEST_STAND_IN = True  # the real library has no such attribute

__all__ = [
    "LLM",
    "CompletionOutput",
    "KvCacheConfig",
    "LogitsProcessor",
    "RequestOutput",
    "SamplingParams",
    "SchedulerConfig",
    "__version__",
]
