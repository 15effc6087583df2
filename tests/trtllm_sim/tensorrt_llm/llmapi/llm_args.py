"""Stand-in of the argument classes in ``tensorrt_llm.llmapi.llm_args`` (test package, not
NVIDIA's library). Pydantic models that forbid unknown fields, like the real ones."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictBaseModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class KvCacheConfig(StrictBaseModel):
    enable_block_reuse: bool = True
    max_tokens: int | None = None
    max_attention_window: list[int] | None = None
    sink_token_length: int | None = None
    free_gpu_memory_fraction: float | None = 0.9
    host_cache_size: int | None = None
    onboard_blocks: bool = True
    cross_kv_cache_fraction: float | None = None
    secondary_offload_min_priority: int | None = None
    event_buffer_max_size: int = 0
    enable_partial_reuse: bool = True
    copy_on_partial_reuse: bool = True
    dtype: str = "auto"


class SchedulerConfig(StrictBaseModel):
    capacity_scheduler_policy: str = "GUARANTEED_NO_EVICT"
    context_chunking_policy: str | None = None
    use_python_scheduler: bool = False


class TorchLlmArgs(StrictBaseModel):
    """The subset of ``TorchLlmArgs`` fields this project touches, with the real defaults."""

    model: str
    tokenizer: str | None = None
    trust_remote_code: bool = False
    tensor_parallel_size: int = 1
    dtype: str = "auto"
    backend: str | None = "pytorch"
    max_batch_size: int | None = 2048
    max_num_tokens: int | None = 8192
    max_input_len: int | None = 1024
    max_seq_len: int | None = None
    max_beam_width: int | None = 1
    enable_chunked_prefill: bool = False
    attn_backend: str = "TRTLLM"
    kv_cache_config: KvCacheConfig = KvCacheConfig()
    scheduler_config: SchedulerConfig = SchedulerConfig()
    disable_overlap_scheduler: bool = False
    enable_attention_dp: bool = False
