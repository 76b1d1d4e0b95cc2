"""vLLM's scheduler as its decode stretches see it.

The stretches (decode_stretches.py) are an object beside the scheduler, not part of it: they
read its state and call its step code through what is listed here, so they depend on this
description, not on the VllmScheduler class (which holds them).
"""

from __future__ import annotations

from typing import Protocol

from scheduler.core.future_indices import FutureIndices
from scheduler.core.launched_batch import LaunchedBatch
from scheduler.core.req import Req
from scheduler.memory.memory_pool import ReqToTokenPool
from scheduler.vllm.batch import VllmBatch
from scheduler.vllm.config import VllmSchedulerConfig
from scheduler.vllm.kv_blocks import VllmKVBlocks
from scheduler.vllm.queues import RunningQueue, WaitingQueue


class SchedulerState(Protocol):
    config: VllmSchedulerConfig
    page_size: int
    req_to_token_pool: ReqToTokenPool
    kv: VllmKVBlocks
    waiting_queue: WaitingQueue
    running: RunningQueue
    future: FutureIndices

    def kv_used_tokens(self) -> int: ...

    def kv_cached_tokens(self) -> int: ...

    def get_next_batch_to_run(self) -> VllmBatch | None: ...

    def launch(self, batch: VllmBatch, now: float, overlap: bool) -> LaunchedBatch: ...

    def finish(self, req: Req, now: float) -> None: ...
