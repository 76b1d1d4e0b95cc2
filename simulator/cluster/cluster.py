"""Replicas behind a router, on one SimPy clock.

Each instance is a whole scheduler core (its own KV pool and prefix cache) with its own event
loop and SimDriver (its own CPU and device), all on one LandingEnvironment. The router is a
process of its own: at each request's arrival it picks an instance (routing.py) and the request
reaches it `latency_s` later. It runs first among the events of a moment (SimPy's URGENT
priority), so an instance that wakes at that moment sees what was sent to it.

What the router knows: each instance's running + waiting requests and KV use as the instance
reported them at the router's last refresh (every `refresh_s`; 0: at every decision), the
outstanding tokens of what it sent (its own count), and its own prefix index of the prompts it
sent to each (prefix_index.py). An instance's next arrival is the router's next decision (any
request may come its way) or a request already on its way to it, so decode stretches end there.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterator

import simpy

from scheduler.core.protocol import SchedulerCore
from scheduler.core.req import Req
from scheduler.loop.arrivals import ArrivalSource
from scheduler.loop.event_loop import EventLoop
from scheduler.loop.gc_pause import gc_paused
from scheduler.loop.step_log import StepLog
from simulator.cluster.prefix_index import BLOCK, PrefixIndex, prompt_keys
from simulator.cluster.routing import InstanceView, Policy
from simulator.driver.sim_driver import LandingEnvironment, SimDriver


class RoutedArrivals(ArrivalSource):
    """One instance's arrivals: the requests the router sent it, each when it reaches it."""

    sends_on_finish = True  # (the router counts what each instance finishes)

    def __init__(self, router: Router, index: int) -> None:
        self.router, self.index = router, index
        self.queue: deque[tuple[float, Req]] = deque()  # (when it reaches the instance, request), in order

    def pop_arrived(self, now: float) -> Req | None:
        q = self.queue
        return q.popleft()[1] if q and q[0][0] <= now else None

    def next_arrival(self) -> float | None:
        mine = self.queue[0][0] if self.queue else None
        routed = self.router.next_decision()
        if mine is None:
            return routed
        return mine if routed is None else min(mine, routed)

    def done(self, req: Req) -> None:
        self.router.finished(self.index, req)


@dataclass
class Instance:
    index: int
    scheduler: SchedulerCore
    kv_tokens: int
    driver: SimDriver
    loop: EventLoop
    arrivals: RoutedArrivals


class Router:
    def __init__(
        self,
        env: LandingEnvironment,
        requests: Iterator[Req],
        policy: Policy,
        refresh_s: float,
        latency_s: float,
        index_blocks: int,
        on_finished: Callable[[Req], None] | None = None,
    ) -> None:
        self.env, self.policy, self.refresh_s, self.latency_s = env, policy, refresh_s, latency_s
        self.on_finished = on_finished
        self._requests = requests
        self._next: Req | None = next(requests, None)
        self.instances: list[Instance] = []
        self.outstanding: list[int] = []
        self.indexes: list[PrefixIndex] = []
        self.index_blocks = index_blocks
        self._views: list[InstanceView] | None = None
        self._refreshed_at = -float("inf")
        self.routed = 0

    def attach(self, instances: list[Instance]) -> None:
        self.instances = instances
        self.outstanding = [0] * len(instances)
        self.indexes = [PrefixIndex(self.index_blocks) for _ in instances]

    def next_decision(self) -> float | None:
        return None if self._next is None else self._next.arrival_time

    def finished(self, i: int, req: Req) -> None:
        self.outstanding[i] -= req.input_len + req.max_new_tokens
        if self.on_finished is not None:
            self.on_finished(req)

    def _views_now(self) -> list[InstanceView]:
        now = self.env.now
        if self._views is None or now - self._refreshed_at >= self.refresh_s:
            self._views = [
                InstanceView(
                    inst.scheduler.num_running() + len(inst.scheduler.waiting_queue) + len(inst.arrivals.queue),
                    0,
                    inst.scheduler.kv_used_tokens() / inst.kv_tokens if inst.kv_tokens else 0.0,
                )
                for inst in self.instances
            ]
            self._refreshed_at = now
        for v, tokens in zip(self._views, self.outstanding):
            v.outstanding_tokens = tokens  # (the router's own count: never stale)
        return self._views

    def _choose(self, req: Req) -> int:
        """The policy's instance for req, on the router's view (its prefix index then holds the prompt there)."""
        views = self._views_now()
        keys = prompt_keys(req.origin_input_ids) if self.policy.reads_prefixes else None
        rates = [idx.match(keys) * BLOCK / req.input_len for idx in self.indexes] if keys is not None else None
        i = self.policy.choose(views, rates, [len(idx) for idx in self.indexes])
        if keys is not None:
            self.indexes[i].insert(keys)
        return i

    def _route(self, req: Req) -> None:
        i = self._choose(req)
        req.instance = i
        self.outstanding[i] += req.input_len + req.max_new_tokens
        self.instances[i].arrivals.queue.append((self.env.now + self.latency_s, req))
        self.routed += 1

    def run(self):
        env = self.env
        while self._next is not None:
            delay = self._next.arrival_time - env.now
            if delay > 0:
                wake = env.event()
                wake._ok, wake._value = True, None
                env.schedule(wake, simpy.core.URGENT, delay)  # before the instances' events of that moment
                yield wake
            while self._next is not None and self._next.arrival_time <= env.now:
                req, self._next = self._next, next(self._requests, None)
                self._route(req)


class Cluster:
    """N instances behind a router; run() replays every request."""

    def __init__(
        self,
        requests: Iterator[Req],
        num_instances: int,
        make_instance: Callable[[int, LandingEnvironment], tuple[SchedulerCore, SimDriver, int]],
        policy: Policy,
        overlap: bool,
        refresh_s: float = 0.0,
        latency_s: float = 0.0,
        index_blocks: int = 1 << 20,
        progress: Callable[[int], None] | None = None,
        on_finished: Callable[[Req], None] | None = None,
    ) -> None:
        """make_instance(i, env): instance i's scheduler, its SimDriver on env, its KV pool size.
        progress: each instance loop's after-step callback; on_finished(req): a request is done
        (finished, or rejected at arrival), on any instance."""
        self.env = LandingEnvironment()
        self.router = Router(self.env, requests, policy, refresh_s, latency_s, index_blocks, on_finished)
        instances = []
        for i in range(num_instances):
            sched, driver, kv_tokens = make_instance(i, self.env)  # (its SimDriver on the cluster's clock)
            arrivals = RoutedArrivals(self.router, i)
            loop = EventLoop(sched, arrivals, driver.clock, overlap, progress)
            loop.steps = StepLog(i)  # (its steps table's rows say which instance took them)
            instances.append(Instance(i, sched, kv_tokens, driver, loop, arrivals))
        self.instances = instances
        self.router.attach(instances)

    def run(self) -> None:
        env = self.env
        env.process(self.router.run())
        for inst in self.instances:
            inst.driver.start(inst.loop)
        with gc_paused():
            env.run()

    def clock(self) -> float:
        return self.env.now

    @property
    def received(self) -> list[Req]:
        return [r for inst in self.instances for r in inst.loop.received]

    @property
    def done(self) -> list[Req]:
        return [r for inst in self.instances for r in inst.scheduler.done]
