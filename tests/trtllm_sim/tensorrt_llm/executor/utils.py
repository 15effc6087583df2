"""Stand-in of ``tensorrt_llm.executor.utils`` (test package, not NVIDIA's library)."""


class RequestError(RuntimeError):
    """The error the executor reports for one request (real name and base class)."""
