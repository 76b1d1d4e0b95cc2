"""vLLM's scheduler taking decode stretches (scheduler/fast_forward/decode_stretch.py): which of the next
steps are pure decodes (decode_stretch), and taking them at once (advance_decode_stretch),
with the state changes stepping would make. An object beside the VllmScheduler
(scheduler.py), which holds it as `decode_stretches`, as SGLang's (sglang/decode_stretches.py);
it sees the scheduler through scheduler_state.SchedulerState. docs/fast-forward.md says why the result equals
stepping.

A vLLM step's schedule takes the blocks its requests' next tokens need from the front of the
free queue (evicting the cached ones among them: block_pool.py), and puts each block that its
known tokens fill in the prefix cache (VllmKVBlocks.cache_known_blocks); its processing gives
every request a token and finishes those at their length. A stretch does the same, in the
same order (schedule 0, processing 0, schedule 1, ...), and in bulk between two steps where
one of those does more than take blocks and give tokens."""

from __future__ import annotations

import bisect
from array import array
from typing import TYPE_CHECKING

import numpy as np

from scheduler.core.forward_plan import ForwardMode
from scheduler.core.req import Req
from scheduler.fast_forward.decode_stretch import (
    DecodeStretch,
    StretchSegment,
    append_tokens,
    bulk_decode_slots,
    exit_steps,
    pages_taken,
    steps_finding_their_pages,
    stretch_through_finishes,
)
from scheduler.memory.memory_pool import dealt
from scheduler.vllm.kv_blocks import ids_of
from scheduler.vllm.stretch_blocks import filled_blocks

if TYPE_CHECKING:
    from scheduler.core.launched_batch import LaunchedBatch
    from scheduler.vllm.scheduler_state import SchedulerState

# A window's evictions from this many on are put in steps with numpy: a loop over each evicted
# block costs ~0.3 us, numpy's few calls ~10 us.
NUMPY_EVICTIONS = 32


class VllmDecodeStretches:
    """The decode stretches of one vLLM scheduler (`sched`)."""

    def __init__(self, sched: SchedulerState) -> None:
        self.sched = sched

    def decode_stretch(self, inflight: LaunchedBatch | None, token_id: int) -> DecodeStretch | None:
        """The steps from the next get_next_batch_to_run() on that decode the running requests
        by one token each and admit or preempt nobody, each sampling token_id; None if the next
        step is not one. Requests finish on the way (when nothing waits). Overlap: `inflight`
        is the launched batch not processed yet, a decode of the running requests."""
        sched = self.sched
        running, cfg = sched.running, sched.config
        bs = len(running)
        if not bs or sched.req_to_token_pool.journal is not None or bs > cfg.max_num_batched_tokens:
            return None
        waiting = bool(sched.waiting_queue)
        if waiting and bs < cfg.max_num_seqs and bs < cfg.max_num_batched_tokens:
            return None  # the waiting pass would try to admit
        pending = inflight is not None
        if pending and (inflight.plan.mode is not ForwardMode.DECODE or inflight.reqs != running):
            return None
        for r in running:
            if (r.pending_token is not None) != pending or r.input_len + len(r.output_ids) + pending - r.seq_len != 1:
                return None  # not decoding (a prefill chunk), or not as the in-flight batch says
            if r.seq_len < r.input_len:
                return None  # its prompt's last token: a one-token prefill chunk (an extend), not a decode
        # (with overlap a request's token in flight counts: it leaves at the step that processes its last)
        exits = exit_steps(running, token_id, pending)
        if not exits:
            return None
        if waiting:
            # Nobody may leave: with a running request fewer, the waiting pass would admit.
            limit = min(exits) if pending else min(exits) - 1
            leaving: tuple[Req, ...] = ()
            reqs = list(running)
        else:
            limit = max(exits)
            # With overlap, those whose in-flight token is their last: not scheduled again, and
            # finished by step 0's processing.
            leaving = tuple(r for r, e in zip(running, exits) if e == 0)
            reqs = [r for r, e in zip(running, exits) if e > 0] if leaving else list(running)
            exits = [e for e in exits if e > 0] if leaving else exits
        if limit <= 0 or not reqs:
            return None
        # No preemption: every step finds its blocks free (cached free ones included: taking
        # one evicts it; the blocks the steps cache stay held). KV that finishing requests free
        # is not counted: fewer steps, never a wrong one.
        return stretch_through_finishes(reqs, exits, limit, sched.kv.pool.num_free_blocks(), sched.page_size, leaving)

    def advance_decode_stretch(
        self, stretch: DecodeStretch, num_steps: int, launch_times: array, token_times: array, token_id: int
    ) -> LaunchedBatch:
        """Take the stretch's first num_steps steps: the first num_steps - 1 in bulk, the last
        scheduled and launched (at launch_times[num_steps - 1]) as stepping does. Processing j
        (at token_times[j]) gives a token to each request of step j's batch (with overlap: step
        j - 1's, at 0 the one in flight) and finishes those at their length; each block that
        fills enters the prefix cache at the step that fills it. Returns the last step's
        launched batch (in flight with overlap)."""
        sched = self.sched
        overlap, last = sched.config.overlap, num_steps - 1
        run = _StretchRun(sched, stretch, num_steps, token_id, token_times, list(sched.running))
        run.schedule_until(last)
        run.process_until(last)
        batch = sched.get_next_batch_to_run()
        assert batch is not None and batch.reqs == run.segment(last).reqs and batch.plan.mode is ForwardMode.DECODE, (
            "a decode stretch changed its batch"
        )
        launched = sched.launch(batch, launch_times[last], overlap)
        run.process_until(num_steps)
        return launched


class _StretchRun:
    """One stretch being taken: the schedules and processings done so far (each up to a step),
    in stepping's order: schedule s comes after processing s - 1 and before processing s."""

    def __init__(
        self, sched: SchedulerState, stretch: DecodeStretch, num_steps: int, token_id: int, token_times: array, running: list[Req]
    ) -> None:
        self.sched, self.stretch, self.token_id, self.token_times = sched, stretch, token_id, token_times
        self.segments = stretch.taken(num_steps)
        self.scheduled = 0  # steps scheduled: 0 .. scheduled - 1
        self.processed = 0  # processings done
        # A request's known tokens at schedule s are those at schedule 0 plus s (it gets a token
        # at every processing until it leaves): a block is cached at the step they fill it.
        self.known = {id(r): r.input_len + len(r.output_ids) for r in running}
        # Who processing x gives a token: step x's batch, or with overlap step x - 1's (at 0 the
        # batch in flight, the running requests); and who it finishes.
        self.receivers: list[tuple[int, int, list[Req]]] = []
        self.finishes: dict[int, tuple[Req, ...]] = {}
        if sched.config.overlap:
            self.receivers.append((0, 1, running))
            for seg in self.segments:
                self.receivers.append((seg.first_step + 1, seg.stop + 1, seg.reqs))
                if seg.leaving:
                    self.finishes[seg.first_step] = seg.leaving
        else:
            for seg in self.segments:
                self.receivers.append((seg.first_step, seg.stop, seg.reqs))
                if seg.finishing:
                    self.finishes[seg.stop - 1] = seg.finishing
        self.finish_steps = sorted(self.finishes)
        # Blocks that steps already scheduled evict after the processing being done (a window
        # of steps takes its blocks before a finish among them: schedule_until).
        self.evicted_ahead = 0

    def segment(self, step: int) -> StretchSegment:
        return next(seg for seg in self.segments if seg.first_step <= step < seg.stop)

    def _next_finish(self, x: int, default: int) -> int:
        """The first processing from x on that finishes requests (default if none)."""
        at = bisect.bisect_left(self.finish_steps, x)
        return self.finish_steps[at] if at < len(self.finish_steps) else default

    def schedule_until(self, stop: int) -> None:
        """Schedule steps up to stop - 1 (processing those before each first): their blocks,
        slots and cached blocks."""
        sched = self.sched
        pool, ps = sched.kv.pool, sched.page_size
        while self.scheduled < stop:
            s = self.scheduled
            self.process_until(s)
            seg = self.segment(s)
            reqs = seg.reqs
            phase = (s - seg.first_step) % ps
            cycle = seg.pages_per_step[phase:] + seg.pages_per_step[:phase]
            # Steps s .. s + n - 1 take their blocks at once, up to the segment's end. A
            # processing among them that finishes requests (with overlap, at the segment's first
            # step) frees blocks to the back of the free queue: steps that take no more blocks
            # than are free now never reach those, so they take what stepping's take. Which
            # blocks are taken does not depend on what the held ones hold either.
            n = steps_finding_their_pages(pool.num_free_blocks(), cycle, min(stop, seg.stop) - s)
            assert n > 0, "a decode stretch ran out of KV blocks"
            cached_before = pool.num_cached_free
            evicted_at: list[int] = []
            blocks = pool.get_new_blocks(pages_taken(cycle, n), evicted_at)
            if ps == 1:
                bulk_decode_slots(sched.req_to_token_pool, reqs, n, ps, _handing_out(ids_of(blocks), ps))
                sched.kv.blocks_from_rows(reqs)
            else:
                sched.kv.extend_decoding(reqs, n, blocks)
            if sched.config.overlap:
                sched.future.skip(len(reqs), n)
            self.scheduled = s + n
            self._around_finishes(reqs, s, s + n, _evictions_by_step(s, cycle, evicted_at), cached_before)

    def _around_finishes(self, reqs: list[Req], first: int, stop: int, evictions: list[tuple[int, int]], cached_before: int) -> None:
        """What steps first .. stop - 1 did besides taking blocks, in stepping's order around the
        processings among them that finish requests: the blocks each step fills enter the cache
        (_cache_filled_blocks) and its evictions are recorded before the finishes that come
        after its schedule. evictions: (step, blocks evicted from `first` through it), where that
        grows; cached_before: the cached free blocks before step first's schedule."""
        sched, ps, changes = self.sched, self.sched.page_size, self.stretch.cached_changes
        pool = sched.kv.pool
        base, done = cached_before, 0  # base: cached_before plus what the finishes so far added
        while True:
            x = self._next_finish(self.processed, stop)
            end = x + 1 if x < stop - 1 else stop  # (a finish at stop - 1 comes after the window)
            if sched.kv.enable_caching:
                self._cache_filled_blocks(reqs, end)
            while done < len(evictions) and evictions[done][0] < end:
                step, count = evictions[done]
                changes.append((step, (base - count) * ps))
                done += 1
            if end == stop:
                return
            # The finish sees the blocks that steps after it evict as still cached.
            self.evicted_ahead = (evictions[-1][1] - (evictions[done - 1][1] if done else 0)) if evictions else 0
            before = pool.num_cached_free
            self.process_until(end)
            base += pool.num_cached_free - before
            self.evicted_ahead = 0

    def _cache_filled_blocks(self, reqs: list[Req], stop: int) -> None:
        """cache_known_blocks of the steps scheduled before `stop` that fill a block, step by
        step, for each step's requests in order (stretch_blocks.filled_blocks). Their tokens
        come with the processings before each such step, done before anything reads the
        blocks' hashes (kv_blocks.VllmKVBlocks.cache_blocks); these requests do not finish
        before `stop`."""
        kv, known = self.sched.kv, self.known
        filled = filled_blocks([kv.reqs[r].num_cached for r in reqs], [known[id(r)] for r in reqs], stop, kv.page_size)
        if filled:
            kv.cache_filled(reqs, filled)

    def process_until(self, stop: int) -> None:
        """Processings up to stop - 1: each receiver gets its token; the finishing ones finish."""
        sched, times = self.sched, self.token_times
        while self.processed < stop:
            x = self.processed
            _, end, reqs = next(rv for rv in self.receivers if rv[0] <= x < rv[1])
            end = min(end, stop, self._next_finish(x, stop) + 1)
            append_tokens(reqs, self.token_id, times[x:end])
            self.processed = end
            finishing = self.finishes.get(end - 1)
            if finishing:
                kv_before = sched.kv_used_tokens()
                for r in finishing:
                    r.check_finished()
                    assert r.finished_reason is not None, "a decode stretch's request did not finish at its length"
                    if sched.config.overlap:  # (AsyncScheduler: what its last step computed enters the cache)
                        sched.kv.cache_blocks(r, r.seq_len)
                    sched.finish(r, times[end - 1])
                sched.running[:] = [r for r in sched.running if r.finished_reason is None]
                if not sched.config.overlap:  # (with overlap the next step's batch lacks them already)
                    self.stretch.running_changes.append((end - 1, -len(finishing)))
                self.stretch.kv_changes.append((end - 1, sched.kv_used_tokens() - kv_before))
                self.stretch.cached_changes.append((end - 1, sched.kv_cached_tokens() + self.evicted_ahead * sched.page_size))


def _evictions_by_step(first: int, cycle: list[int], evicted_at: list[int]) -> list[tuple[int, int]]:
    """(step, evictions from `first` through it) of each step from `first` on whose blocks
    included cached ones, where step j takes cycle[(j - first) % len(cycle)] blocks (evicted_at:
    the evicted ones' places among the blocks taken, in order)."""
    if len(evicted_at) >= NUMPY_EVICTIONS:
        places = np.array(evicted_at, dtype=np.int64)
        per_cycle = sum(cycle)
        # Each place's step: whole cycles before it, then the steps of its cycle it is past.
        within = np.cumsum(cycle)
        steps = (places // per_cycle) * len(cycle) + np.searchsorted(within, places % per_cycle, side="right")
        last = np.flatnonzero(np.diff(steps, append=-1))  # (each step's last eviction)
        return list(zip((steps.take(last) + first).tolist(), (last + 1).tolist()))
    out: list[tuple[int, int]] = []
    step, end, k = first, cycle[0], 0  # end: blocks taken through `step`
    for i, place in enumerate(evicted_at):
        while place >= end:
            k += 1
            step += 1
            end += cycle[k % len(cycle)]
        if i + 1 == len(evicted_at) or evicted_at[i + 1] >= end:
            out.append((step, i + 1))
    return out


def _handing_out(blocks: array, page_size: int):
    """bulk_decode_slots's take over blocks already taken in step order: with page size 1 one
    call for every step (dealt out, request by request), else one call a step, in order."""
    if page_size == 1:
        return lambda k, steps: dealt(blocks, k)
    taken = iter(blocks)
    return lambda k, steps: [next(taken) for _ in range(k)]
