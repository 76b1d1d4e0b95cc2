"""vLLM's request queues: the running list in admission order, and the waiting queue (FCFS, or a
heap by priority) with preempted requests going back to its front."""

from __future__ import annotations

import heapq
from collections import deque
from typing import Iterator

from scheduler.core.req import Req


class RunningQueue(list):
    """vLLM's running list, in admission order; batch_size() is what the loop records."""

    def batch_size(self) -> int:
        return len(self)


class WaitingQueue:
    """vLLM's waiting queue: FCFS (preempted requests go back to the front) or priority
    (a heap on (priority, arrival): a smaller priority value runs first, as in vLLM)."""

    def __init__(self, policy: str) -> None:
        self.by_priority = policy == "priority"
        self._fifo: deque[Req] = deque()
        self._heap: list[tuple[int, float, int, Req]] = []

    def __len__(self) -> int:
        return len(self._heap) if self.by_priority else len(self._fifo)

    def __iter__(self) -> Iterator[Req]:
        return (e[-1] for e in sorted(self._heap)) if self.by_priority else iter(self._fifo)

    def add(self, req: Req) -> None:
        if self.by_priority:
            heapq.heappush(self._heap, (req.priority, req.arrival_time, req.index, req))
        else:
            self._fifo.append(req)

    def prepend(self, req: Req) -> None:
        """A preempted request: first in line under FCFS, by its key under priority."""
        if self.by_priority:
            self.add(req)
        else:
            self._fifo.appendleft(req)

    def peek(self) -> Req:
        return self._heap[0][-1] if self.by_priority else self._fifo[0]

    def pop(self) -> Req:
        return heapq.heappop(self._heap)[-1] if self.by_priority else self._fifo.popleft()

    def remove(self, req: Req) -> None:
        if self.by_priority:
            self._heap = [e for e in self._heap if e[-1] is not req]
            heapq.heapify(self._heap)
        else:
            self._fifo.remove(req)
