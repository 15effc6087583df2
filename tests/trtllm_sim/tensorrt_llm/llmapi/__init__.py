"""Stand-in of ``tensorrt_llm.llmapi`` (test package, not NVIDIA's library)."""

from tensorrt_llm.executor.result import CompletionOutput
from tensorrt_llm.llmapi.llm import LLM, RequestOutput
from tensorrt_llm.llmapi.llm_args import KvCacheConfig, SchedulerConfig, TorchLlmArgs
from tensorrt_llm.sampling_params import SamplingParams

__all__ = [
    "LLM",
    "CompletionOutput",
    "KvCacheConfig",
    "RequestOutput",
    "SamplingParams",
    "SchedulerConfig",
    "TorchLlmArgs",
]
