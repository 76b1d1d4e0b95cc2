"""The arrival source of a server (`testbed serve`): requests come in from the HTTP side (another
thread) as they arrive, and the loop takes them between steps.

While the server is open, the next arrival is always "soon" (IDLE_WAIT_S from now): an idle loop
waits that long or until a request comes in, whichever is first (wait()). Once closed (the server
drains), nothing more is to come, and the loop ends when its last request is done.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Callable

from scheduler.core.req import Req
from scheduler.loop.arrivals import ArrivalSource

IDLE_WAIT_S = 0.5


class LiveArrivals(ArrivalSource):
    sends_on_finish = True  # (the loop reports every request done: the server answers its client)

    def __init__(self, clock: Callable[[], float], on_done: Callable[[Req], None]) -> None:
        self.clock = clock
        self.on_done = on_done
        self._queue: deque[Req] = deque()
        self._came = threading.Event()
        self.closed = False

    def put(self, req: Req) -> None:
        """A request has come in (any thread): it arrives now."""
        req.arrival_time = self.clock()
        self._queue.append(req)
        self._came.set()

    def close(self) -> None:
        """No more requests: the loop ends once the ones it has are done."""
        self.closed = True
        self._came.set()

    def wait(self, delay: float) -> None:
        """The loop's wait for its next arrival: over when one comes in, or after delay."""
        self._came.wait(delay)
        self._came.clear()

    def pop_arrived(self, now: float) -> Req | None:
        return self._queue.popleft() if self._queue else None

    def next_arrival(self) -> float | None:
        if self._queue:
            return self.clock()
        return None if self.closed else self.clock() + IDLE_WAIT_S

    def done(self, req: Req) -> None:
        self.on_done(req)
