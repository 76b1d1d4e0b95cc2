"""A batch as it was launched: what processing its result needs, for either scheduler."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.core.forward_plan import ForwardPlan
from scheduler.core.req import Req


@dataclass(eq=False, slots=True)
class LaunchedBatch:
    """A batch as it was when launched: the running batch changes before its result is processed."""

    reqs: list[Req]
    plan: ForwardPlan
    chunked_req: Req | None
    num_retracted: int  # retracted (SGLang) or preempted (vLLM) when it was scheduled
    cache_hit_tokens: int
    num_extend_reqs: int  # the first rows extend; the rest (a mixed batch's) decode
