"""VllmSchedulerConfig: every option of the vLLM-style scheduler, with vLLM's defaults."""

from __future__ import annotations

from dataclasses import asdict, dataclass

# The vLLM release whose v1 scheduler (vllm/v1/core/sched/scheduler.py, async_scheduler.py,
# kv_cache_manager.py) vllm_scheduler.py follows.
VLLM_RELEASE = "0.19.0"
VLLM_POLICIES = ("fcfs", "priority")
# vLLM 0.19's defaults for its OpenAI API server on a GPU of 70 GB or more (H100, H200);
# it uses 2048 tokens and 256 requests on smaller GPUs (EngineArgs.get_batch_defaults).
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
DEFAULT_MAX_NUM_SEQS = 1024
DEFAULT_BLOCK_SIZE = 16
# vLLM's gpu_memory_utilization: the device memory share for weights, activations and KV.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9


@dataclass(frozen=True)
class VllmSchedulerConfig:
    kv_tokens: int  # size of the KV pool in tokens
    context_len: int  # the model's context length (vLLM's max_model_len)
    page_size: int = DEFAULT_BLOCK_SIZE  # vLLM's block_size: KV blocks and prefix caching
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS  # token budget of one step
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS  # running requests at most
    policy: str = "fcfs"  # fcfs | priority (a smaller priority value runs first, as in vLLM)
    enable_prefix_caching: bool = True
    # Admit a waiting request only if its whole prompt fits the free KV, not just its
    # first chunk (vLLM's scheduler_reserve_full_isl, on by default in 0.19).
    reserve_full_prompt: bool = True
    overlap: bool = True  # vLLM's async scheduling
    seed: int = 0
    # Journal ReqToTokenPool writes into each plan, for an executor that mirrors the table.
    journal_row_writes: bool = False

    name = "vllm"
    release = VLLM_RELEASE

    @property
    def effective_max_running_requests(self) -> int:
        return self.max_num_seqs

    def __post_init__(self) -> None:
        if self.kv_tokens < self.page_size:
            raise ValueError(f"the KV pool ({self.kv_tokens} tokens) is smaller than one block ({self.page_size})")
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be positive")
        if self.policy not in VLLM_POLICIES:
            raise ValueError(f"policy {self.policy!r}: the vLLM scheduler takes {' or '.join(VLLM_POLICIES)}")

    def to_dict(self) -> dict:
        return {"name": self.name, "follows": f"vLLM {self.release} v1 scheduler"} | asdict(self)
