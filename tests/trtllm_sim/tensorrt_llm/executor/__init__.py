"""Stand-in of ``tensorrt_llm.executor`` (test package, not NVIDIA's library)."""

from tensorrt_llm.executor.result import CompletionOutput, Logprob
from tensorrt_llm.executor.utils import RequestError

__all__ = ["CompletionOutput", "Logprob", "RequestError"]
