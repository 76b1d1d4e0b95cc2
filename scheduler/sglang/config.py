"""SchedulerConfig: every option of the core, with SGLang's defaults."""

from __future__ import annotations

from dataclasses import asdict, dataclass

# The SGLang release whose scheduler this core follows step for step (make conformance checks it).
SGLANG_RELEASE = "0.5.23"


@dataclass(frozen=True)
class SchedulerConfig:
    kv_tokens: int  # size of the KV pool in tokens
    context_len: int  # the model's context length
    policy: str = "fcfs"
    page_size: int = 1
    max_prefill_tokens: int = 16384
    chunked_prefill_size: int | None = 8192  # None or <= 0: no chunking
    max_running_requests: int | None = None  # None: derived from the pool as SGLang does
    disable_radix_cache: bool = False
    overlap: bool = True
    schedule_conservativeness: float = 1.0
    # Decode requests ride along in a prefill batch (a MIXED forward), as SGLang's --enable-mixed-chunk.
    enable_mixed_chunk: bool = False
    # SGLang's --enable-priority-scheduling: the waiting queue ordered by priority (larger first),
    # and running requests preempted by a waiting one whose priority exceeds theirs by more
    # than the threshold.
    enable_priority_scheduling: bool = False
    priority_scheduling_preemption_threshold: int = 10
    new_token_ratio_decay_steps: int = 600
    # SGLang's --scheduler-recv-interval: new requests are taken in once every this many decode
    # steps (scheduler/loop/recv_skipper.py); 1 takes them in before every step.
    scheduler_recv_interval: int = 1
    seed: int = 0
    # Journal ReqToTokenPool writes into each plan, for an executor that mirrors the table.
    journal_row_writes: bool = False

    @property
    def init_new_token_ratio(self) -> float:
        return min(0.7 * self.schedule_conservativeness, 1.0)

    @property
    def min_new_token_ratio(self) -> float:
        return min(self.init_new_token_ratio * 0.14, 1.0)

    @property
    def new_token_ratio_decay(self) -> float:
        return (self.init_new_token_ratio - self.min_new_token_ratio) / self.new_token_ratio_decay_steps

    @property
    def effective_chunked_prefill_size(self) -> int | None:
        size = self.chunked_prefill_size
        return size if size is not None and size > 0 else None

    @property
    def effective_max_running_requests(self) -> int:
        # SGLang: enough request slots for the pool, within [2048, 4096]; at most one per two KV slots.
        estimated = min(max(int(self.kv_tokens / self.context_len * 512), 2048), 4096)
        return min(self.max_running_requests or estimated, self.kv_tokens // 2)

    def __post_init__(self) -> None:
        if self.kv_tokens < self.page_size:
            raise ValueError(f"the KV pool ({self.kv_tokens} tokens) is smaller than one page ({self.page_size})")
        chunk = self.effective_chunked_prefill_size
        if chunk is not None and chunk < self.page_size:
            raise ValueError(f"chunked_prefill_size {chunk} is smaller than a page ({self.page_size} tokens)")
        if self.max_prefill_tokens < 1:
            raise ValueError("max_prefill_tokens must be positive")
        if self.scheduler_recv_interval < 1:
            raise ValueError("scheduler_recv_interval must be positive")

    def to_dict(self) -> dict:
        return {"name": "sglang", "follows": f"sglang {SGLANG_RELEASE}"} | asdict(self)
