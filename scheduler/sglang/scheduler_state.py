"""SGLang's scheduler as its decode stretches and their refused-admission checks see it.

The stretches (decode_stretches.py) are an object beside the scheduler, not part of it: they
read its state and call its step code through what is listed here, so they depend on this
description, not on the Scheduler class (which holds them).
"""

from __future__ import annotations

from typing import Protocol

from scheduler.core.future_indices import FutureIndices
from scheduler.core.launched_batch import LaunchedBatch
from scheduler.core.req import Req
from scheduler.memory.chunk_cache import ChunkCache
from scheduler.memory.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator
from scheduler.memory.radix_cache import RadixCache
from scheduler.sglang.config import SchedulerConfig
from scheduler.sglang.policy import SchedulePolicy
from scheduler.sglang.schedule_batch import ScheduleBatch
from scheduler.sglang.token_ratio import NewTokenRatioDecay


class SchedulerState(Protocol):
    config: SchedulerConfig
    req_to_token_pool: ReqToTokenPool
    allocator: TokenToKVPoolAllocator
    tree_cache: RadixCache | ChunkCache
    policy: SchedulePolicy
    waiting_queue: list[Req]
    running_batch: ScheduleBatch
    last_batch: ScheduleBatch | None
    chunked_req: Req | None
    inflight: list[LaunchedBatch]  # overlap: launched, not processed yet
    new_token_ratio: float
    ratio_decay: NewTokenRatioDecay
    future: FutureIndices
    enable_priority_preemption: bool
    is_mixed_chunk: bool

    def kv_used_tokens(self) -> int: ...

    def get_next_batch_to_run(self) -> ScheduleBatch | None: ...

    def get_new_batch_prefill(self) -> ScheduleBatch | None: ...

    def merge_last_prefill(self) -> None: ...

    def drop_finishing_inflight(self, batch: ScheduleBatch) -> bool: ...

    def reqs_finishing_inflight(self, reqs: list[Req]) -> list[Req]: ...

    def launch(self, batch: ScheduleBatch, now: float, overlap: bool) -> LaunchedBatch: ...

    def process_batch_result(self, launched: LaunchedBatch, next_token_ids: list[int], now: float) -> None: ...

    def finish(self, req: Req, now: float) -> None: ...
