"""What the event loop, the drivers and a replay need from a scheduler.

SGLang's scheduler (scheduler.py) and the vLLM-style one (vllm_scheduler.py) both
satisfy SchedulerCore, so the one loop (loop.py) runs either on either clock. The
loop reads nothing else: the attributes below are what it records in each step's row.
"""

from __future__ import annotations

from array import array
from typing import Collection, Protocol

from scheduler.core.forward_plan import ForwardPlan
from scheduler.core.req import Req
from scheduler.fast_forward.decode_stretch import DecodeStretch


class RunningSet(Protocol):
    def batch_size(self) -> int: ...


class PlannedBatch(Protocol):
    """A scheduled batch: its plan is what the forward runs."""

    plan: ForwardPlan | None


class Launched(Protocol):
    """A batch as launched: what processing its result and the step record need."""

    plan: ForwardPlan
    num_retracted: int  # requests retracted (SGLang) or preempted (vLLM) when it was scheduled
    cache_hit_tokens: int  # prefix tokens newly admitted requests reused from the cache


class DecodeStretches(Protocol):
    """A scheduler's decode stretches (scheduler/fast_forward/decode_stretch.py): asked only by a
    loop whose driver knows every sampled token in advance (the simulator's fast-forward)."""

    def decode_stretch(self, inflight: Launched | None, token_id: int) -> DecodeStretch | None: ...

    def advance_decode_stretch(
        self, stretch: DecodeStretch, num_steps: int, launch_times: array, token_times: array, token_id: int
    ) -> Launched: ...


class SchedulerCore(Protocol):
    waiting_queue: Collection[Req]
    running_batch: RunningSet
    done: list[Req]  # finished and rejected requests, in finishing order
    # None: the scheduler takes no decode stretches, and the loop steps every step.
    decode_stretches: DecodeStretches | None

    def add_request(self, req: Req) -> None: ...

    def get_next_batch_to_run(self) -> PlannedBatch | None: ...

    def launch(self, batch: PlannedBatch, now: float, overlap: bool) -> Launched: ...

    def process_batch_result(self, launched: Launched, next_token_ids: list[int], now: float) -> None: ...

    def on_idle(self) -> None: ...

    def is_idle(self) -> bool: ...

    def kv_used_tokens(self) -> int: ...

    def kv_cached_tokens(self) -> int: ...

    def check_invariants(self) -> None: ...
