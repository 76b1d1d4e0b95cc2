"""A scheduler in a prefill role or a decode role: SGLang's PD flow (sglang/srt/disaggregation/
prefill.py and decode.py) where it changes timing. A PD cluster (simulator/cluster/pd.py) pairs
the roles and carries the KV between them; each scheduler (sglang_roles.py, vllm_roles.py) mixes
a role into its own class and gives the KV rules.

A request's way:

1. The router sends it to a (prefill, decode) pair. The decode instance takes it into its
   PreallocQueue (add_request, after the scheduler's own checks at arrival).
2. At each of its schedules (process_queues, SGLang's process_decode_queue, before the batch is
   picked) the decode instance pre-allocates the prompt's KV for the requests at the queue's head
   that fit its budget, first come first served: the first that does not fit holds back the rest
   (a hold; `held_since` times it). A pre-allocated request is bootstrapped: on_preallocated.
3. Its prefill instance gets a twin of it with one output token (SGLang's prefill sets
   max_new_tokens = 1) and prefills it as any request; the first token comes out of that prefill
   (on_prefilled). The prefill instance then holds its KV (the prompt in the radix cache, locked)
   while the KV crosses the link, and lets it go at its first schedule after the transfer ended
   (release_transferred: SGLang's inflight queue; the prompt may stay cached).
4. The decode instance, at its first schedule after the transfer ended, gives the request its
   first token (what the client sees: TTFT counts the prefill, the transfer and that wait) and puts
   it in its running batch (SGLang's prebuilt batch, merged and decoded in the same schedule); it
   decodes from the second token on. A request whose first token is its last finishes there.

Simplified: the bootstrap handshake and the metadata poll take no time (the request reaches its
prefill instance at the decode instance's schedule that pre-allocated it); the transfer starts when
the whole prefill is done (SGLang sends a chunked prompt's KV chunk by chunk); the decode side has
no radix cache and no pre-allocation rows beyond its running requests' (SGLang's decode side keeps
extra rows for pre-allocated requests); a decode instance that runs short of KV retracts a request
as the scheduler always does, and recomputes it there (SGLang offloads its KV and resumes it).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import islice
from typing import Any, Callable

from scheduler.core.req import Req


@dataclass(slots=True)
class Prefilled:
    """What a request's prefill hands its decode instance beside the KV (SGLang's metadata buffer)."""

    token: int  # the first output token
    scheduled_time: float | None  # when the prefill was scheduled
    cached_tokens: int  # prompt tokens the prefill instance's cache held
    prefill_tokens: int


class IncomingGuard:
    """A decode instance's decode stretches, but none while a request is on its way in: the time it
    comes in (its prefill and transfer end) is not known in advance, so the instance steps."""

    def __init__(self, stretches: Any, incoming: Callable[[], bool]) -> None:
        self.stretches, self.incoming = stretches, incoming

    def decode_stretch(self, inflight, token_id):
        return None if self.incoming() else self.stretches.decode_stretch(inflight, token_id)

    def advance_decode_stretch(self, stretch, num_steps, launch_times, token_times, token_id):
        return self.stretches.advance_decode_stretch(stretch, num_steps, launch_times, token_times, token_id)


class PrefillRole:
    """Mixed into a scheduler class before it: its requests (twins with one output token) end at
    their prefill, but their KV stays until the transfer ends. The scheduler gives _hold(req) and
    _release_kv(req)."""

    holding: dict[Req, None]
    transferred: list[tuple[Req, float]]
    on_prefilled: Callable[[Req, float], None]

    def _init_prefill_role(self) -> None:
        self.decode_stretches = None  # (a prefill instance decodes nothing)
        self.holding = {}  # prefilled, their KV held for the transfer (SGLang's inflight queue)
        self.transferred = []  # (request, when its transfer ended), not yet let go
        self.on_prefilled = lambda req, now: None  # set by the cluster: the transfer starts

    def finish(self, req: Req, now: float) -> None:
        """The prefill gave the request its token: its KV is held, the transfer starts now."""
        if req.req_pool_idx is not None:  # (none: preempted while its token was in flight)
            self._hold(req)
            self.holding[req] = None
        self.on_prefilled(req, now)

    def transfer_done(self, req: Req, now: float) -> None:
        """Its KV has crossed (called by the cluster as the transfer ends): let go at the next schedule."""
        self.transferred.append((req, now))

    def release_transferred(self, now: float) -> None:
        """At the start of a schedule: the KV of the requests whose transfer ended goes (to the cache)."""
        done, self.transferred = self.transferred, []
        for req, _ in done:
            if req in self.holding:
                del self.holding[req]
                self._release_kv(req)
            self._ended(req, now)

    def _hold(self, req: Req) -> None:
        raise NotImplementedError

    def _release_kv(self, req: Req) -> None:
        raise NotImplementedError


class DecodeRole:
    """Mixed into a scheduler class before it: the PreallocQueue, the pre-allocated requests waiting
    for their KV (SGLang's TransferQueue) and the requests whose KV has arrived. The scheduler gives
    check_arrival(req) (its own checks at arrival; False: rejected), _never_preallocated(req) (why
    its budget refuses req even with nothing else there, or None), _try_preallocate(req),
    _join_running(req) and _free_preallocated(req)."""

    prealloc_queue: deque[Req]
    preallocated: dict[Req, None]
    kv_arrived_queue: list[tuple[Req, Prefilled]]
    held_since: dict[Req, float]
    on_preallocated: Callable[[Req, float, float], None]

    def _init_decode_role(self) -> None:
        self.prealloc_queue = deque()
        self.preallocated = {}  # KV reserved, waiting for the prefill and the transfer
        self.kv_arrived_queue = []
        self.held_since = {}  # queued requests that a pass of the queue held back: since when
        self._marked = 0  # the queue's first requests that are in held_since
        # Set by the cluster: (request, now, seconds it was held back) once its KV is reserved.
        self.on_preallocated = lambda req, now, held_s: None
        self.decode_stretches = IncomingGuard(self.decode_stretches, self.has_incoming)

    def add_request(self, req: Req) -> None:
        """A request the router sent here: the scheduler's checks, then the PreallocQueue."""
        if not self.check_arrival(req):
            return
        refusal = self._never_preallocated(req)
        if refusal is not None:
            self._reject(req, refusal)
            return
        self.prealloc_queue.append(req)

    def has_incoming(self) -> bool:
        return bool(self.prealloc_queue or self.preallocated or self.kv_arrived_queue)

    def kv_arrived(self, req: Req, prefilled: Prefilled) -> None:
        """Its KV has crossed (called by the cluster as the transfer ends): it joins at the next schedule."""
        self.kv_arrived_queue.append((req, prefilled))

    def process_queues(self, now: float) -> None:
        """At the start of a schedule (SGLang's process_decode_queue): pre-allocate, first come
        first served, then the requests whose KV has arrived take their first token and join the
        running batch."""
        queue = self.prealloc_queue
        while queue:
            req = queue[0]
            if not self._try_preallocate(req):
                for r in islice(queue, self._marked, None):
                    self.held_since[r] = now
                self._marked = len(queue)
                break
            queue.popleft()
            self._marked = max(self._marked - 1, 0)
            self.preallocated[req] = None
            self.on_preallocated(req, now, now - self.held_since.pop(req, now))
        arrived, self.kv_arrived_queue = self.kv_arrived_queue, []
        for req, p in arrived:
            del self.preallocated[req]
            req.take_token(p.token, now)
            req.scheduled_time = p.scheduled_time
            req.cached_tokens += p.cached_tokens
            req.prefill_tokens += p.prefill_tokens
            if req.finished_reason is not None:
                self.finish(req, now)  # its one token was its last
            else:
                self._join_running(req)

    def drop_preallocated(self, req: Req, reason: str) -> None:
        """Its prefill instance refused it: the reserved KV goes and the request is rejected."""
        del self.preallocated[req]
        self._free_preallocated(req)
        self._reject(req, reason)

    def _never_preallocated(self, req: Req) -> str | None:
        raise NotImplementedError

    def _try_preallocate(self, req: Req) -> bool:
        raise NotImplementedError

    def _join_running(self, req: Req) -> None:
        raise NotImplementedError

    def _free_preallocated(self, req: Req) -> None:
        raise NotImplementedError
