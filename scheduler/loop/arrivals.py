"""Where the loop's requests come from, and when each arrives: an arrival source.

- OpenLoopArrivals: every request arrives at its own arrival_time (the trace's, scaled); the
  load does not depend on how fast the requests are served.
- ClosedLoopArrivals: N clients, as `vllm bench serve --max-concurrency N` and
  `sglang.bench_serving --max-concurrency N` run them. The requests are taken in their order
  (the trace's); the first N arrive at time 0; each time a request is done (finished, or
  rejected at arrival), its client sends the next unsent one, which arrives at that moment (the
  done request's finish_time). A request's arrival_time is set when it is sent, so its TTFT and
  E2E count from then, as a benchmark client measures them; the arrival times it came with (the
  trace's) are not used.

The loop (loop.py) takes the requests that have arrived by its clock (pop_arrived), waits for
the next known arrival when idle (next_arrival; a decode stretch ends before it, too), and
tells the source which requests are done (done), in the scheduler's finishing order, where
the source asks for it (sends_on_finish: a finish may send a request now). Then the arrival a
finish sends is not known before the finish, so a decode stretch ends with the step whose
processing finishes a request (decode_stretch.steps_through_first_finish).
"""

from __future__ import annotations

from typing import Iterator

from scheduler.core.req import Req


class ArrivalSource:
    """The requests of a run, handed out as they arrive."""

    # True while a request being done may send another (the loop then reports every request done).
    sends_on_finish: bool = False

    def pop_arrived(self, now: float) -> Req | None:
        """The next request, if it has arrived by `now` (its arrival_time <= now); else None."""
        raise NotImplementedError

    def next_arrival(self) -> float | None:
        """When the next request arrives, if that is known; None if no request is to come
        (closed loop: none until a request is done)."""
        raise NotImplementedError

    def done(self, req: Req) -> None:
        """req finished or was rejected (at req.finish_time)."""


class OpenLoopArrivals(ArrivalSource):
    """Every request at its own arrival_time (requests: in arrival order)."""

    def __init__(self, requests: Iterator[Req]) -> None:
        self._requests = requests
        self._next: Req | None = next(requests, None)

    def pop_arrived(self, now: float) -> Req | None:
        nxt = self._next
        if nxt is None or nxt.arrival_time > now:
            return None
        self._next = next(self._requests, None)
        return nxt

    def next_arrival(self) -> float | None:
        return None if self._next is None else self._next.arrival_time


class ClosedLoopArrivals(ArrivalSource):
    """`concurrency` clients, each sending its next request when its previous one is done."""

    def __init__(self, requests: Iterator[Req], concurrency: int) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"a closed loop needs at least one client, got concurrency {concurrency!r}")
        self.concurrency = concurrency
        self._requests = requests
        self._unsent: Req | None = next(requests, None)
        self._sent: list[Req] = []  # sent, not yet taken by the loop (in sending order)
        self._taken = 0  # how many of _sent the loop has taken
        self.sends_on_finish = self._unsent is not None
        for _ in range(concurrency):
            self._send(0.0)

    def _send(self, at: float) -> None:
        req = self._unsent
        if req is None:
            return
        req.arrival_time = at
        self._sent.append(req)
        self._unsent = next(self._requests, None)
        self.sends_on_finish = self._unsent is not None

    def pop_arrived(self, now: float) -> Req | None:
        sent, i = self._sent, self._taken
        if i == len(sent) or sent[i].arrival_time > now:
            return None
        req = sent[i]
        if i + 1 == len(sent):  # all taken: the list starts again (it holds at most one request a client)
            sent.clear()
            self._taken = 0
        else:
            self._taken = i + 1
        return req

    def next_arrival(self) -> float | None:
        return self._sent[self._taken].arrival_time if self._taken < len(self._sent) else None

    def done(self, req: Req) -> None:
        assert req.finish_time is not None, f"{req.rid}: done without a finish time"
        self._send(req.finish_time)
