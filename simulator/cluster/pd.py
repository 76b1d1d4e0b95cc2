"""Prefill/decode disaggregation on the simulator's one clock: P prefill instances and D decode
instances, each a whole scheduler core in its role (scheduler/disagg/: SGLang's PD flow as kept,
and what is simplified), behind a router that sends each request to a pair, with the link their
KV crosses (kv_link.py).

- The router, at a request's arrival, picks its prefill instance by the policy, on the prefill
  instances (as a replica cluster's router picks an instance), and its decode instance by the
  fewest outstanding tokens: prompt + output tokens of the requests sent there and not finished
  (its own count, never stale; ties to the lowest). The request reaches the decode instance
  `latency_s` later, into its PreallocQueue.
- At the decode instance's schedule that pre-allocates its KV, the request's twin (its prompt, one
  output token) reaches the prefill instance, which prefills it as any request.
- As the prefill is processed, the transfer starts: the model's KV bytes per token (per TP shard) x
  the prompt's tokens, over the link, sharing it with the transfers under way.
- As the transfer ends, the prefill instance lets the KV go and the decode instance takes the
  request in (its first token, then its decode), each at its first schedule after that.

Instances are numbered prefill first (0 .. P-1), then decode (P .. P+D-1): the steps table's
instance, the requests table's instance (where the request prefilled) and decode_instance.

An instance cannot know in advance when a twin comes in or a transfer ends: its driver is
wakeable (SimDriver.wake: an idle wait ends then; the loop's next arrival is math.inf while such
an event may come and no other is known), a decode instance takes no decode stretch while a
request may come in (roles.IncomingGuard), a prefill instance none at all. So an instance sees
such an event at its first schedule after it, as stepping sees an arrival; but for CPU time the
instance has charged and not yet waited out (SimPy's clock runs behind the loop's by that much,
a few microseconds), where the event is seen one schedule later. A replica cluster's router has
the same lag.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace
from functools import partial
from typing import Callable, Iterator

from scheduler.core.protocol import SchedulerCore
from scheduler.core.req import FinishReason, Req
from scheduler.disagg.roles import Prefilled
from scheduler.loop.arrivals import ArrivalSource
from scheduler.loop.event_loop import DeadlockError, EventLoop
from scheduler.loop.gc_pause import gc_paused
from scheduler.loop.step_log import StepLog
from simulator.cluster.cluster import Instance, Router
from simulator.cluster.kv_link import KvFabric, KvLink, Transfer
from simulator.cluster.routing import Policy
from simulator.driver.sim_driver import LandingEnvironment, SimDriver

ROLES = ("prefill", "decode")
DECODE_ROUTER = "least-tokens"  # how the router picks a decode instance (the module's docstring says it)


@dataclass(slots=True)
class PdRequest:
    """One request's way through its pair: what the requests table's PD columns say."""

    req: Req
    prefill: int  # its instances, by number
    decode: int
    decode_tokens: int  # what the router counts for it on its decode instance
    twin: Req | None = None  # what its prefill instance runs
    preallocated_at: float | None = None
    held_s: float = 0.0  # how long its decode instance held it back for KV
    nbytes: float = 0.0
    transfer: Transfer | None = None


class PrefillIntake(ArrivalSource):
    """A prefill instance's arrivals: the twins of the requests its decode instances pre-allocated,
    each at that schedule's time. Each schedule also lets go the KV whose transfer has ended."""

    sends_on_finish = True  # (a twin done here: the router's count and the cluster's)

    def __init__(self, cluster: PdCluster, index: int) -> None:
        self.cluster, self.index = cluster, index
        self.queue: deque[tuple[float, Req]] = deque()  # (when it reaches the instance, twin), in order
        self.pending = 0  # requests routed here whose twin is not done here yet
        self.scheduler = None  # (its role scheduler, set once built)

    def pop_arrived(self, now: float) -> Req | None:
        q = self.queue
        if q and q[0][0] <= now:
            return q.popleft()[1]
        self.scheduler.release_transferred(now)  # (the last call of each schedule's receive)
        return None

    def next_arrival(self) -> float | None:
        if self.queue:
            return self.queue[0][0]
        routed = self.cluster.router.next_decision()  # (the request may come this way: a look then)
        if routed is None and self.pending:
            return math.inf  # a twin will come when its decode instance pre-allocates it, or KV goes: a wake
        return routed

    def done(self, req: Req) -> None:
        self.cluster.prefill_done(self.index, req)


class DecodeIntake(ArrivalSource):
    """A decode instance's arrivals: the requests the router sent it, each when it reaches it. Each
    schedule also runs its queues (pre-allocation, then the requests whose KV has arrived)."""

    sends_on_finish = True

    def __init__(self, cluster: PdCluster, index: int) -> None:
        self.cluster, self.index = cluster, index
        self.queue: deque[tuple[float, Req]] = deque()
        self.scheduler = None

    def pop_arrived(self, now: float) -> Req | None:
        q = self.queue
        if q and q[0][0] <= now:
            return q.popleft()[1]
        self.scheduler.process_queues(now)  # (the last call of each schedule's receive)
        return None

    def next_arrival(self) -> float | None:
        mine = self.queue[0][0] if self.queue else None
        routed = self.cluster.router.next_decision()
        if mine is None and routed is None:
            return math.inf if self.scheduler.has_incoming() else None
        return mine if routed is None else routed if mine is None else min(mine, routed)

    def done(self, req: Req) -> None:
        self.cluster.decode_done(self.index, req)


class PdRouter(Router):
    """Router's policy on the prefill instances; the decode instance with the fewest outstanding tokens."""

    def __init__(self, *args, on_routed: Callable[[Req, int, int, int, float], None], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.on_routed = on_routed
        self.decode_tokens: list[int] = []

    def _route(self, req: Req) -> None:
        p = self._choose(req)
        tokens = self.decode_tokens
        d = min(range(len(tokens)), key=lambda j: (tokens[j], j))
        self.outstanding[p] += req.input_len + 1  # (its twin: the prompt and one token)
        tokens[d] += req.input_len + req.max_new_tokens
        self.routed += 1
        self.on_routed(req, p, d, req.input_len + req.max_new_tokens, self.env.now + self.latency_s)


class PdCluster:
    """P prefill and D decode instances, a router and a link; run() replays every request."""

    def __init__(
        self,
        requests: Iterator[Req],
        num_prefill: int,
        num_decode: int,
        make_instance: Callable[[int, LandingEnvironment, str], tuple[SchedulerCore, SimDriver, int]],
        policy: Policy,
        overlap: bool,
        link: KvLink,
        kv_bytes_per_token: int,
        refresh_s: float = 0.0,
        latency_s: float = 0.0,
        index_blocks: int = 1 << 20,
        progress: Callable[[int], None] | None = None,
        on_finished: Callable[[Req], None] | None = None,
    ) -> None:
        """make_instance(i, env, role): instance i's scheduler in that role (scheduler/disagg/), its
        wakeable SimDriver on env, its KV pool size. on_finished(req): a request is done (finished,
        or rejected), on its decode instance."""
        self.env = LandingEnvironment()
        self.fabric = KvFabric(self.env, link)
        self.kv_bytes_per_token = kv_bytes_per_token
        self.num_prefill = num_prefill
        self.on_finished = on_finished
        self.router = PdRouter(self.env, requests, policy, refresh_s, latency_s, index_blocks, on_routed=self._routed)
        self.records: dict[int, PdRequest] = {}  # by the request's index (its place in the trace)
        self.instances: list[Instance] = []
        self.roles: list[str] = []
        for i in range(num_prefill + num_decode):
            role = ROLES[i >= num_prefill]
            sched, driver, kv_tokens = make_instance(i, self.env, role)
            assert driver.wakeable, "a PD instance's driver must be wakeable"
            arrivals = PrefillIntake(self, i) if role == "prefill" else DecodeIntake(self, i)
            arrivals.scheduler = sched
            loop = EventLoop(sched, arrivals, driver.clock, overlap, progress)
            loop.steps = StepLog(i)
            inst = Instance(i, sched, kv_tokens, driver, loop, arrivals)
            if role == "prefill":
                sched.on_prefilled = partial(self._prefilled, inst)
            else:
                sched.on_preallocated = self._preallocated
            self.instances.append(inst)
            self.roles.append(role)
        self.prefills = self.instances[:num_prefill]
        self.decodes = self.instances[num_prefill:]
        self.router.attach(self.prefills)
        self.router.decode_tokens = [0] * num_decode
        self.ended_at = 0.0  # when the last instance's loop ended

    # -- a request's way -----------------------------------------------------------------------
    def _routed(self, req: Req, p: int, d: int, tokens: int, reaches: float) -> None:
        req.instance = p
        decode = self.decodes[d]
        self.records[req.index] = PdRequest(req, p, decode.index, tokens)
        self.prefills[p].arrivals.pending += 1
        decode.arrivals.queue.append((reaches, req))

    def _preallocated(self, req: Req, now: float, held_s: float) -> None:
        """Its decode instance reserved its KV at its schedule at `now`: the twin goes to the prefill instance."""
        rec = self.records[req.index]
        rec.preallocated_at, rec.held_s = now, held_s
        twin = Req(
            rid=req.rid,
            input_len=req.input_len,
            input_ids_fn=req.input_ids_fn,
            sampling_params=replace(req.sampling_params, max_new_tokens=1),
            arrival_time=req.arrival_time,
            priority=req.priority,
            eos_token_ids=req.eos_token_ids,
            index=req.index,
        )
        twin.instance = rec.prefill
        rec.twin = twin
        prefill = self.instances[rec.prefill]
        prefill.arrivals.queue.append((now, twin))
        self._at(now, prefill.driver.wake)

    def _prefilled(self, prefill: Instance, twin: Req, now: float) -> None:
        """The twin's prefill was processed at `now`: its KV starts across."""
        rec = self.records[twin.index]
        rec.nbytes = float(self.kv_bytes_per_token * twin.input_len)

        def send() -> None:
            rec.transfer = self.fabric.send(prefill.index, rec.decode, rec.nbytes, partial(self._transferred, rec))

        self._at(now, send)

    def _transferred(self, rec: PdRequest, _transfer: Transfer) -> None:
        now, twin = self.env.now, rec.twin
        prefill, decode = self.instances[rec.prefill], self.instances[rec.decode]
        prefill.scheduler.transfer_done(twin, now)
        decode.scheduler.kv_arrived(rec.req, Prefilled(twin.output_ids[0], twin.scheduled_time, twin.cached_tokens, twin.prefill_tokens))
        prefill.driver.wake()
        decode.driver.wake()

    def prefill_done(self, p: int, twin: Req) -> None:
        """A twin is done on its prefill instance: its KV let go, or refused at arrival."""
        self.prefills[p].arrivals.pending -= 1
        self.router.finished(p, twin)
        if twin.finished_reason is FinishReason.REJECTED:
            rec = self.records[twin.index]
            decode = self.instances[rec.decode]
            decode.scheduler.drop_preallocated(rec.req, f"its prefill instance refused it: {twin.reject_reason}")
            decode.driver.wake()

    def decode_done(self, i: int, req: Req) -> None:
        """A request is done on its decode instance (finished; or rejected, there or by its prefill instance)."""
        rec = self.records[req.index]
        self.router.decode_tokens[i - self.num_prefill] -= rec.decode_tokens
        if rec.twin is None:  # rejected by its decode instance before its prefill: nothing comes to the prefill side
            prefill = self.instances[rec.prefill]
            prefill.arrivals.pending -= 1
            self.router.outstanding[rec.prefill] -= req.input_len + 1
            prefill.driver.wake()
        if self.on_finished is not None:
            self.on_finished(req)

    def _at(self, t: float, call: Callable[[], None]) -> None:
        """call() at time t (now, or later: a loop's clock runs ahead of SimPy's by the CPU time it has charged)."""
        delay = t - self.env.now
        if delay <= 0:
            call()
        else:
            self.env.timeout(delay).callbacks.append(lambda _event: call())

    # -- the run -------------------------------------------------------------------------------
    def run(self) -> None:
        env = self.env
        env.process(self.router.run())
        procs = [inst.driver.start(inst.loop) for inst in self.instances]
        for proc in procs:
            env.process(self._note_end(proc))
        with gc_paused():
            env.run()
        stuck = [f"{role} instance {inst.index}" for inst, role, proc in zip(self.instances, self.roles, procs) if proc.is_alive]
        if stuck:
            raise DeadlockError(
                f"{', '.join(stuck)} still wait for requests that can never come in (a decode instance holds them back "
                "for KV that no running or pre-allocated request will free); a larger --kv-tokens admits them"
            )

    def _note_end(self, proc):
        yield proc
        self.ended_at = max(self.ended_at, self.env.now)

    def clock(self) -> float:
        """When the run ended: the last instance's loop (SimPy's clock may pass it on a stale timeout)."""
        return self.ended_at

    @property
    def received(self) -> list[Req]:
        """Every request, as its decode instance received it."""
        return [r for inst in self.decodes for r in inst.loop.received]

    @property
    def done(self) -> list[Req]:
        return [r for inst in self.decodes for r in inst.scheduler.done]
