"""A decode stretch: the next steps of a running batch that are pure repeats, taken at once.

Between two events (an arrival, a chunk, the KV pool running short, a retraction, with
vLLM a new cached block) each decode step runs the same requests, each one token longer,
but for those that leave at their length. When the sampled tokens are known in advance (the simulator's: every
token is the same id), a scheduler can say how many such steps come next
(SchedulerCore.decode_stretch) and apply k of them at once (SchedulerCore.advance_decode_stretch):
the first k - 1 steps' state changes in bulk (the same KV slots in the same order, the
same decay of new_token_ratio, k - 1 tokens for every request), then the last step
scheduled and launched by the ordinary code, so that what stays in flight (overlap) or
in the running batch is the very object stepping would have made.

When nothing waits, a request's last token does not end the stretch: the stretch is
planned in segments (StretchSegment), and the step that processes a last token finishes
the request (its KV goes to the cache) while the next segment's first step drops it from
the batch (StretchSegment.leaving; with overlap that is the step that processes the token
in flight). A stretch may also start at the step that merges a whole prefill into the
batch (DecodeStretch.merges_prefill). docs/fast-forward.md says why all this equals stepping.

The loop (loop.py) asks only when its driver knows the tokens (EventLoop.fast_forward_token);
the driver (simulator/driver/sim_driver.py) prices the steps and cuts the stretch before the
first step whose schedule start reaches the next arrival.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Callable, Container, Iterable, Iterator, Protocol, Sequence

import numpy as np

from scheduler.core.req import Req
from scheduler.memory.memory_pool import ReqToTokenPool


@dataclass(slots=True)
class StretchSegment:
    """Steps first_step .. stop - 1 of a stretch, which decode the same requests. Its step
    first_step + i has sum_prefix_len + i * batch_size prefix tokens and its longest
    sequence is max_seq_len + i tokens (after its token)."""

    first_step: int
    stop: int
    reqs: list[Req]
    sum_prefix_len: int
    max_seq_len: int
    pages_per_step: list[int]  # pages its step first_step + i takes: pages_per_step[i % page_size]
    # Requests of the step before that leave the batch at first_step: finished ones (processed
    # by then), or, with overlap, ones whose in-flight last token first_step's processing takes.
    leaving: tuple[Req, ...] = ()
    # Its requests whose last token step stop - 1 computes (they leave at stop).
    finishing: tuple[Req, ...] = ()

    @property
    def batch_size(self) -> int:
        return len(self.reqs)


@dataclass(slots=True)
class DecodeStretch:
    """Up to max_steps decode steps from the next step on, in segments: within a segment the
    same requests decode, each one token longer a step; at a segment's first step requests
    that finished leave the batch (nothing else changes)."""

    segments: list[StretchSegment]  # those planned so far (plan() plans more)
    page_size: int
    # The first step merges the prefill scheduled just before into the running batch (SGLang):
    # the ordinary code merges it (and, with overlap, processes that prefill).
    merges_prefill: bool = False
    # Filled by advance_decode_stretch, for the rows from step j on: (j, the cache's evictable
    # tokens) where that changes at step j (a step whose schedule evicts, a finished request's KV
    # going to the cache), and (j, change of the KV in use) where finished requests release KV.
    cached_changes: list[tuple[int, int]] = field(default_factory=list)
    kv_changes: list[tuple[int, int]] = field(default_factory=list)
    # (j, d): row j's running count is its batch's size + d, at row j only (vLLM drops a
    # finished request from its running requests as it processes its last token; without
    # overlap that is in the row of the step that computed it).
    running_changes: list[tuple[int, int]] = field(default_factory=list)
    # The segments after the planned ones, planned when asked for.
    _unplanned: Iterator[StretchSegment] | None = None
    _taken: tuple[int, list[StretchSegment]] | None = None  # (num_steps, taken(num_steps))

    def plan(self, num_steps: int | None = None) -> list[StretchSegment]:
        """The segments, planned until they reach num_steps steps (None: all)."""
        segments, more = self.segments, self._unplanned
        while more is not None and (num_steps is None or segments[-1].stop < num_steps):
            seg = next(more, None)
            if seg is None:
                self._unplanned = more = None
            else:
                segments.append(seg)
        return segments

    def each_segment(self) -> Iterator[StretchSegment]:
        """The segments in order, each planned when reached."""
        i = 0
        while True:
            if i == len(self.segments):
                self.plan(self.segments[-1].stop + 1)  # (one more, if there is one)
                if i == len(self.segments):
                    return
            yield self.segments[i]
            i += 1

    @property
    def max_steps(self) -> int:
        return self.plan()[-1].stop

    @property
    def reqs(self) -> list[Req]:  # the first step's
        return self.segments[0].reqs

    @property
    def batch_size(self) -> int:  # the first step's
        return len(self.segments[0].reqs)

    def taken(self, num_steps: int) -> list[StretchSegment]:
        """The segments that the first num_steps steps reach into (kept for the last num_steps
        asked: the driver, the scheduler and the loop's rows each ask for the stretch taken;
        segments planned later start at or after num_steps, so the answer stays)."""
        kept = self._taken
        if kept is not None and kept[0] == num_steps:
            return kept[1]
        segments = [seg for seg in self.plan(num_steps) if seg.first_step < num_steps]
        self._taken = (num_steps, segments)
        return segments


def steps_through_first_finish(stretch: DecodeStretch, overlap: bool) -> int | None:
    """The stretch's steps up to the first whose processing finishes a request, that one
    included (None if no step's does): where a finish would send a closed-loop client's next
    request (scheduler/loop/arrivals.py). The first finish is in the first segment's reach (a segment
    that finishes no request is the stretch's last). Without overlap step j processes its own
    batch: the first segment's finishing requests finish at its last step. With overlap step j
    processes the batch launched before it: a request leaving at step 0 with its last token in
    flight (or a one-token prefill that the first step merges) finishes at step 0, the first
    segment's finishing ones at the step after its last."""
    seg = stretch.segments[0]
    if overlap:
        if any(r.finished_reason is None for r in seg.leaving):
            return 1
        return seg.stop + 1 if seg.finishing else None
    return seg.stop if seg.finishing else None


def exit_steps(reqs: Sequence[Req], token_id: int, in_flight: bool | Container[int] = False) -> list[int] | None:
    """For each request, the first step of a stretch from here that it is not in: each step
    appends one token (token_id) to every request, and a request leaves after its length.
    A request with a token in flight (overlap: in_flight is True for all, or holds the ids of
    those that have one) counts it, and leaves at the step that processes its last. None if
    one could stop at EOS (token_id is one), or is not decoding (finished, retracted)."""
    exits = []
    every = in_flight if isinstance(in_flight, bool) else None
    for r in reqs:
        if r.finished_reason is not None or r.is_retracted:
            return None
        if not r.sampling_params.ignore_eos and token_id in r.eos_token_ids:
            return None
        exits.append(r.max_new_tokens - len(r.output_ids) - (every if every is not None else id(r) in in_flight))
    return exits


def steps_with_pages(free_pages: int, per_step: Sequence[int], reserve: int, limit: int) -> int:
    """How many steps (<= limit) start with at least `reserve` free pages, when step j takes
    per_step[j % len(per_step)] pages (a request takes a page when its length crosses a page)."""
    cycle = sum(per_step)
    if free_pages - reserve >= (limit // len(per_step) + 1) * cycle:
        return limit  # even the worst phase leaves enough: no step to count
    if len(per_step) == 1 and cycle > 0:
        # Pages of one slot: step j starts with free_pages - j * cycle, so the count is closed-form.
        return max(0, min(limit, (free_pages - reserve) // cycle + 1))
    j = 0
    n = len(per_step)
    while j < limit and free_pages >= reserve:
        free_pages -= per_step[j % n]
        j += 1
    return j


def steps_finding_their_pages(free_pages: int, per_step: Sequence[int], limit: int) -> int:
    """How many steps (<= limit) find the pages they take free (vLLM's allocation: no page
    reserved beyond the step's own), when step j takes per_step[j % len(per_step)] pages."""
    if free_pages >= pages_taken(per_step, limit):
        return limit
    j, n = 0, len(per_step)
    while j < limit and free_pages >= per_step[j % n]:
        free_pages -= per_step[j % n]
        j += 1
    return j


class AdmissionChecks(Protocol):
    """The admission checks that a stretch beside a waiting queue goes through: the step after a
    request leaves looks at the queue (scheduler/sglang/refused_admission.py)."""

    def leave(self, seq_len: int) -> None:
        """A request leaves, with seq_len slots at most when it finishes."""

    def refuses(self, check_step: int, running: Sequence[tuple[Req, int, int]], pages_taken: int) -> bool:
        """Whether the check at check_step surely refuses."""


def stretch_through_finishes(
    reqs: Sequence[Req],
    exits: Sequence[int],
    limit: int,
    free_pages: int,
    page_size: int,
    leaving: tuple[Req, ...],
    checks: AdmissionChecks | None = None,
    check_shift: int = 0,
) -> DecodeStretch | None:
    """The stretch of at most `limit` steps from the batch reqs (after `leaving` left), where
    reqs[i] is in steps 0 .. exits[i] - 1, whose every step finds a page free for every request
    (SGLang's check_decode_mem): segments from one exit to the next. KV that finished requests
    release during the stretch is not counted: fewer steps, never a wrong one. The first segment
    is planned now, the others when first asked for (an arrival cuts most stretches early).
    With checks, the step check_shift steps after each exit looks at the waiting queue: the
    stretch ends before the first such step that checks cannot show to refuse."""
    plan = _plan_segments(reqs, [r.seq_len for r in reqs], exits, limit, free_pages, page_size, leaving, checks, check_shift)
    first = next(plan, None)
    return None if first is None else DecodeStretch([first], page_size, _unplanned=plan)


def _plan_segments(
    reqs: Sequence[Req],
    seq_lens: Sequence[int],
    exits: Sequence[int],
    limit: int,
    free_pages: int,
    page_size: int,
    leaving: tuple[Req, ...],
    checks: AdmissionChecks | None,
    check_shift: int,
) -> Iterator[StretchSegment]:
    """stretch_through_finishes's segments, one by one (from the lengths as they were when it was
    asked: a stretch being taken changes the requests)."""
    members = list(zip(reqs, seq_lens, exits))
    start, pages = 0, free_pages
    while start < limit and members:
        stop = min(limit, min(e for _, _, e in members))
        seg_reqs = [r for r, _, _ in members]
        lens = [s + start for _, s, _ in members]
        per_step = pages_per_step(lens, page_size)
        n = steps_with_pages(pages, per_step, len(seg_reqs), stop - start)
        if n <= 0:
            return
        finishing = tuple(r for r, _, e in members if e == start + n)
        yield StretchSegment(start, start + n, seg_reqs, sum(lens), max(lens) + 1, per_step, leaving, finishing)
        if start + n < stop:
            return
        pages -= pages_taken(per_step, n)
        if checks is not None:
            for _, s, e in members:
                if e == stop:
                    checks.leave(s + e)
        members = [m for m in members if m[2] > stop]
        check = stop + check_shift
        if checks is not None and check < limit and not checks.refuses(check, members, free_pages - pages):
            limit = check
        leaving, start = finishing, stop


def pages_taken(per_step: Sequence[int], num_steps: int) -> int:
    """Pages that num_steps steps take, step j per_step[j % len(per_step)]."""
    whole, part = divmod(num_steps, len(per_step))
    return whole * sum(per_step) + sum(per_step[:part])


def pages_per_step(seq_lens: Sequence[int], page_size: int) -> list[int]:
    """Requests that start a new page at step j, for j in 0 .. page_size - 1 (then it repeats):
    a request of length s starts one when (s + j) % page_size == 0."""
    counts = [0] * page_size
    for s in seq_lens:
        counts[(-s) % page_size] += 1
    return counts


def bulk_decode_slots(
    pool: ReqToTokenPool, reqs: Sequence[Req], num_steps: int, page_size: int, take: Callable[[int, int], Iterable]
) -> None:
    """The KV slots of num_steps decode steps, written into the requests' rows as stepping
    writes them. take(n, steps) takes the n pages each of `steps` steps needs from the
    allocator, step after step, and gives them in the order the requests that need them get
    them (request order). With page_size 1 a page is a slot and every request needs one a step:
    take gives them dealt out, one sequence a request (request i's: the i-th of each step's)."""
    bs = len(reqs)
    if page_size == 1:
        rows = pool.req_to_token
        for r, slots in zip(reqs, take(bs, num_steps)):
            rows[r.req_pool_idx].extend(slots)
            r.seq_len += num_steps
        return
    rows = pool.req_to_token
    seq_lens = [r.seq_len for r in reqs]
    new_pages: list[dict[int, int]] = [{} for _ in reqs]
    by_phase: list[list[int]] = [[] for _ in range(page_size)]
    for i, s in enumerate(seq_lens):
        by_phase[(-s) % page_size].append(i)
    for j in range(num_steps):
        needing = by_phase[j % page_size]
        for i, page in zip(needing, take(len(needing), 1)):
            new_pages[i][j] = page
    last_locs = [rows[r.req_pool_idx][r.seq_len - 1] for r in reqs]
    locs = paged_slots(last_locs, seq_lens, new_pages, num_steps, page_size)
    append_rows(pool, reqs, locs)


def append_rows(pool: ReqToTokenPool, reqs: Sequence[Req], locs: np.ndarray) -> None:
    """locs[j, i]: the slot request i's token of step j took; each row grows by its column."""
    rows = pool.req_to_token
    cols = np.ascontiguousarray(locs.T)
    for r, col in zip(reqs, cols):
        rows[r.req_pool_idx].frombytes(col.tobytes())
        r.seq_len += len(col)


def paged_slots(
    last_locs: Sequence[int], seq_lens: Sequence[int], new_pages: list[dict[int, int]], num_steps: int, page_size: int
) -> np.ndarray:
    """Slots [step, request] of num_steps decode steps with pages: a request whose length is a
    multiple of page_size takes the first slot of its new page (new_pages[i][step]), any
    other the slot after its last one."""
    out = np.empty((num_steps, len(seq_lens)), dtype=np.int64)
    for i, (loc, _seq_len, pages) in enumerate(zip(last_locs, seq_lens, new_pages)):
        col = out[:, i]
        pos = 0
        for j in sorted(pages):
            if j > pos:
                col[pos:j] = np.arange(loc + 1, loc + 1 + j - pos)
            loc = pages[j] * page_size
            col[j] = loc
            pos = j + 1
        if pos < num_steps:
            col[pos:] = np.arange(loc + 1, loc + 1 + num_steps - pos)
    return out


def append_tokens(reqs: Sequence[Req], token_id: int, times: array) -> None:
    """Processing len(times) decode steps' results: every request gets token_id at each time."""
    if not times:
        return
    toks = [token_id] * len(times)
    first = times[0]
    for r in reqs:
        r.output_ids.extend(toks)
        r.token_times.extend(times)
        if r.first_token_time is None:
            r.first_token_time = first
