"""Future indices: how an overlapped batch names tokens still on the device.

In overlap mode batch N+1 is scheduled before batch N's tokens reach the CPU. Each
request that samples in batch N gets a future index f; its next input is the
placeholder -f, which the executor resolves on the device from the token batch N
stored at f. Both schedulers hand out indices the same way.
"""

from __future__ import annotations

from typing import Sequence

from scheduler.core.forward_plan import ForwardPlan
from scheduler.core.req import Req

FUTURE_MAP_SIZE = 1 << 20  # future indices cycle; far more than the tokens ever in flight


class FutureIndices:
    def __init__(self) -> None:
        self._last = 0

    def assign(self, plan: ForwardPlan, reqs: Sequence[Req]) -> None:
        """Name the outputs of plan's requests; a sampling request's pending token becomes -index."""
        start = self._last + 1
        if start + len(reqs) > FUTURE_MAP_SIZE:
            start = 1
        self._last = start + len(reqs) - 1
        plan.future_indices = future = list(range(start, start + len(reqs)))
        for r, f, sample in zip(reqs, future, plan.sample):
            if sample:
                r.pending_token = -f

    def skip(self, num_reqs: int, times: int) -> None:
        """As `times` assigns to num_reqs requests whose indices nobody reads (a decode stretch's steps)."""
        last = self._last
        if last + times * num_reqs < FUTURE_MAP_SIZE:  # no wrap: every assign starts where the last ended
            self._last = last + times * num_reqs
            return
        for _ in range(times):
            start = last + 1
            if start + num_reqs > FUTURE_MAP_SIZE:
                start = 1
            last = start + num_reqs - 1
        self._last = last
