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
one of those does more than take blocks and give tokens: the blocks of a window of steps at
once, across the finishes among them (they free blocks to the back of the free queue, which
the window's steps do not reach), then the blocks those steps fill and evict and the finishes,
in stepping's order.

Beside the stretches of SGLang's rules: with async scheduling a stretch may start while the
batch in flight ends a prompt (its processing gives each request a token, as a decode's does),
and goes on beside a waiting queue whose head surely does not fit the free blocks at any of its
steps (_head_surely_refused)."""

from __future__ import annotations

import bisect
from array import array
from dataclasses import dataclass
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
        is the launched batch not processed yet, of the running requests, each sampled (a decode,
        or the last chunk of its prompt)."""
        sched = self.sched
        running, cfg = sched.running, sched.config
        bs = len(running)
        if not bs or sched.req_to_token_pool.journal is not None or bs > cfg.max_num_batched_tokens:
            return None
        waiting = bool(sched.waiting_queue)
        # (the waiting pass looks at the queue: the stretch needs it to refuse at every step)
        looks = waiting and bs < cfg.max_num_seqs and bs < cfg.max_num_batched_tokens
        pending = inflight is not None
        # (the batch in flight may also end prompts: its processing gives each of its requests a
        # token as a decode's does, if each was sampled, which the loop below checks)
        if pending and inflight.reqs != running:
            return None
        for r in running:
            if (r.pending_token is not None) != pending or r.input_len + len(r.output_ids) + pending - r.seq_len != 1:
                return None  # not decoding (a prefill chunk), or not as the in-flight batch says
            if r.seq_len < r.input_len:
                return None  # its prompt's last token: a one-token prefill chunk (an extend), not a decode
        # (with overlap a request's token in flight counts: it leaves at the step that processes its last)
        exits = exit_steps(running, token_id, pending)
        if not exits or (looks and not self._head_surely_refused()):
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

    def _head_surely_refused(self) -> bool:
        """Whether each step of a stretch beside the waiting queue (no request leaves, none is
        admitted, none arrives) refuses the queue's head for want of KV blocks, as it does now.
        vLLM admits it only if blocks for all its tokens are free (scheduler_reserve_full_isl):
        it needs one per block past its cached prefix, and one per free block of the prefix
        (taking it takes it from the free queue). Through such a stretch the free blocks only
        fall (its steps take them); the prefix can only shrink (a cached block leaves the cache
        only when a step takes it) unless a running request caches a block at the place where
        the prefix ends now (h): the blocks it caches come after those it has cached, so none
        does where each has cached more than h. Then the head needs at least its blocks past h,
        whichever of the prefix's blocks are free: if those are more than are free now, every
        step refuses it."""
        sched = self.sched
        kv = sched.kv
        head = sched.waiting_queue.peek()
        if not sched.config.reserve_full_prompt or head.pending_token is not None:
            return False
        blocks, free = -(-(head.input_len + len(head.output_ids)) // sched.page_size), kv.pool.num_free_blocks()
        if blocks <= free:
            return False  # (it fits whatever its cached prefix: no lookup needed to say so)
        h = len(kv.get_computed_blocks(head))
        if blocks - h <= free:
            return False
        if not kv.enable_caching:
            return True  # (nothing is cached: the prefix stays empty)
        states = kv.reqs
        return all(states[r].num_cached > h for r in sched.running)

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
            # Steps s .. s + n - 1 take their blocks at once, across the segments they reach. A
            # processing among them that finishes requests frees blocks to the back of the free
            # queue: steps that take no more blocks than are free now never reach those, so they
            # take what stepping's take. Which blocks are taken does not depend on what the held
            # ones hold either.
            window = self._window(s, stop, pool.num_free_blocks())
            assert window, "a decode stretch ran out of KV blocks"
            n = window[-1].stop - s
            reqs = window[0].seg.reqs
            cached_before = pool.num_cached_free
            evicted_at: list[int] = []
            blocks = pool.get_new_blocks(sum(part.pages for part in window), evicted_at)
            steps = [n] * len(reqs)
            if ps == 1:
                bulk_decode_slots(sched.req_to_token_pool, reqs, n, ps, _handing_out(ids_of(blocks), ps))
                sched.kv.blocks_from_rows(reqs)
            else:
                for part in window[:-1]:  # (requests whose last token comes before the window's end)
                    for r in part.seg.finishing:
                        steps[reqs.index(r)] = part.stop - s
                sched.kv.extend_decoding(reqs, steps, blocks)
            if sched.config.overlap:
                for part in window:
                    sched.future.skip(len(part.seg.reqs), part.stop - part.first)
            self.scheduled = s + n
            self._around_finishes(reqs, steps, s, s + n, _window_evictions(window, evicted_at), cached_before)

    def _window(self, first: int, stop: int, free_blocks: int) -> list[_WindowPart]:
        """The steps from `first` on (before `stop`) that find the blocks they take among the
        free_blocks, by segment: all of them, up to the first segment whose steps do not (with
        blocks of one slot, one segment at most: bulk_decode_slots takes one batch)."""
        ps = self.sched.page_size
        parts: list[_WindowPart] = []
        for seg in self.segments:
            if seg.stop <= first:
                continue
            if seg.first_step >= stop:
                break
            start, end = max(first, seg.first_step), min(seg.stop, stop)
            phase = (start - seg.first_step) % ps
            cycle = seg.pages_per_step[phase:] + seg.pages_per_step[:phase]
            k = steps_finding_their_pages(free_blocks, cycle, end - start)
            if k:
                taken = pages_taken(cycle, k)
                parts.append(_WindowPart(seg, start, start + k, cycle, taken))
                free_blocks -= taken
            if k < end - start or ps == 1:
                break
        return parts

    def _around_finishes(
        self, reqs: list[Req], steps: list[int], first: int, stop: int, evictions: list[tuple[int, int]], cached_before: int
    ) -> None:
        """What steps first .. stop - 1 did besides taking blocks, in stepping's order around the
        processings among them that finish requests: the blocks each step fills enter the cache
        (_filled_blocks) and its evictions are recorded before the finishes that come
        after its schedule. reqs[i] is in steps first .. first + steps[i] - 1; evictions:
        (step, blocks evicted from `first` through it), where that grows; cached_before: the
        cached free blocks before step first's schedule."""
        sched, ps, changes = self.sched, self.sched.page_size, self.stretch.cached_changes
        kv, pool = sched.kv, sched.kv.pool
        filled = self._filled_blocks(reqs, [first + k for k in steps]) if kv.enable_caching else []
        cached = 0  # (filled blocks cached so far)
        base, done = cached_before, 0  # base: cached_before plus what the finishes so far added
        while True:
            x = self._next_finish(self.processed, stop)
            end = x + 1 if x < stop - 1 else stop  # (a finish at stop - 1 comes after the window)
            upto = bisect.bisect_left(filled, (end,))
            if upto > cached:
                kv.cache_filled(reqs, filled[cached:upto])
                cached = upto
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

    def _filled_blocks(self, reqs: list[Req], stops: list[int]) -> list[tuple[int, int, int]]:
        """The blocks that the steps of a window fill, in the order stepping caches them (step
        by step, each step's requests in order: stretch_blocks.filled_blocks), reqs[i] in the
        steps before stops[i]: each enters the cache (cache_known_blocks) in the window's part
        before the finish after its step. Their tokens come with the processings before each
        such step, done before anything reads the blocks' hashes (kv_blocks.VllmKVBlocks
        .cache_blocks)."""
        kv, known = self.sched.kv, self.known
        return filled_blocks([kv.reqs[r].num_cached for r in reqs], [known[id(r)] for r in reqs], stops, kv.page_size)

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


@dataclass(slots=True)
class _WindowPart:
    """The steps first .. stop - 1 of a window, all in one segment: step j takes
    cycle[(j - first) % len(cycle)] blocks, `pages` in all."""

    seg: StretchSegment
    first: int
    stop: int
    cycle: list[int]
    pages: int


def _window_evictions(window: list[_WindowPart], evicted_at: list[int]) -> list[tuple[int, int]]:
    """_evictions_by_step of a window's steps, part after part (evicted_at: the evicted blocks'
    places among all the window's blocks, in order)."""
    out: list[tuple[int, int]] = []
    at = offset = 0
    for part in window:
        end = bisect.bisect_left(evicted_at, offset + part.pages, at)
        if end > at:
            out.extend(
                (step, at + count) for step, count in _evictions_by_step(part.first, part.cycle, [p - offset for p in evicted_at[at:end]])
            )
        at, offset = end, offset + part.pages
    return out


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
