"""One step of vLLM's scheduler, as scheduled: the plan of its forward and what the step record counts."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.core.forward_plan import ForwardPlan
from scheduler.core.req import Req


@dataclass(eq=False, slots=True)
class VllmBatch:
    reqs: list[Req]
    plan: ForwardPlan
    num_preempted: int
    cache_hit_tokens: int
