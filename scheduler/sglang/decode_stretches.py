"""SGLang's scheduler taking decode stretches (scheduler/fast_forward/decode_stretch.py): which of the next
steps are pure decodes (decode_stretch), and taking them at once (advance_decode_stretch),
with the state changes stepping would make. An object beside the Scheduler (scheduler.py),
which holds it as `decode_stretches`: it reads and changes the scheduler's state through
scheduler_state.SchedulerState, and calls its ordinary step code for the steps it does not
take in bulk. docs/fast-forward.md says why the result equals stepping."""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING

from scheduler.core.forward_plan import ForwardMode
from scheduler.core.req import Req
from scheduler.fast_forward.decode_stretch import (
    DecodeStretch,
    StretchSegment,
    append_tokens,
    bulk_decode_slots,
    exit_steps,
    steps_with_pages,
    stretch_through_finishes,
)
from scheduler.sglang.refused_admission import RefusedAdmissions

if TYPE_CHECKING:
    from scheduler.core.launched_batch import LaunchedBatch
    from scheduler.sglang.scheduler_state import SchedulerState


class SglangDecodeStretches:
    """The decode stretches of one SGLang scheduler (`sched`)."""

    def __init__(self, sched: SchedulerState) -> None:
        self.sched = sched

    def decode_stretch(self, inflight: LaunchedBatch | None, token_id: int) -> DecodeStretch | None:
        """The decode steps from the next get_next_batch_to_run() on that repeat the running
        batch's step unchanged, each sampling token_id; None if the next step is not one.
        Overlap: `inflight` is the launched batch not processed yet; it must be a decode of
        the same requests (each step of the stretch processes the one before)."""
        sched = self.sched
        running, last = sched.running_batch, sched.last_batch
        if sched.chunked_req is not None or sched.req_to_token_pool.journal is not None or last is None:
            return None
        if sched.waiting_queue and (sched.enable_priority_preemption or not running.batch_is_full):
            return None  # the prefill branch would look at the queue
        overlap = sched.config.overlap
        if last is running and last.forward_mode is ForwardMode.DECODE and not running.is_empty():
            reqs = running.reqs
            if overlap and (inflight is None or inflight.plan.mode is not ForwardMode.DECODE or inflight.reqs != reqs):
                return None
        elif last.forward_mode is ForwardMode.EXTEND and last.chunked_req is None and (not sched.waiting_queue or not running.is_empty()):
            # A whole prefill that the first step merges into the running batch (the ordinary
            # code merges it; with overlap it processes the prefill). With requests
            # waiting, the batch is full (above) and stays so: it is not a new one (which would
            # start not full), and no request leaves at the merge (below).
            reqs = running.reqs + last.reqs
            if overlap and (inflight is None or inflight.plan.mode is not ForwardMode.EXTEND or inflight.reqs != last.reqs):
                return None
        else:
            return None
        # The first step drops the requests that leave: finished ones, and with overlap those
        # whose in-flight result finishes them.
        in_flight: bool | set[int] = False  # the requests with a token in flight
        if overlap:
            if sched.inflight != [inflight]:
                return None
            near_end = sched.reqs_finishing_inflight(reqs)  # (the in-flight batch's requests)
            if last is running:
                if any(r.finished_reason is not None for r in near_end):
                    return None  # stopped (EOS) while its next step ran: stepping drops that step's token
                # (another one that stopped makes exit_steps refuse)
                leaving, in_flight = near_end, True
            else:
                ending = set(map(id, near_end))
                leaving = [r for r in reqs if r.finished_reason is not None or id(r) in ending]
                in_flight = set(map(id, inflight.reqs))
        elif inflight is not None or sched.inflight:
            return None
        else:
            leaving = [r for r in reqs if r.finished_reason is not None]
        if leaving:
            if sched.waiting_queue:
                return None  # the batch shrinks (no longer full): the next step's prefill branch looks at the queue
            gone = set(map(id, leaving))
            reqs = [r for r in reqs if id(r) not in gone]
        exits = exit_steps(reqs, token_id, in_flight)
        if not exits:
            return None
        checks = None
        if sched.waiting_queue:
            # The batch is full, so no step's prefill branch looks at the queue, until the step
            # after a request leaves: without overlap the step after the one that computes its
            # last token, with overlap the step after the one whose schedule drops it (its last
            # token in flight) and whose processing finishes it. The stretch goes on through
            # those checks that are sure to refuse (refused_admission.py), and ends before the
            # first that is not.
            checks = RefusedAdmissions.of(sched, last.reqs if overlap and last is not running else ())
            limit = max(exits) if checks is not None else min(exits) + overlap
        else:
            limit = max(exits)
        # No retraction: every step finds a page for every request free or in evictable cache
        # (each page evicted is a page freed: free + evictable only shrinks by what steps take).
        ps = sched.allocator.page_size
        pages = sched.allocator.num_free_pages() + sched.tree_cache.evictable_size() // ps
        stretch = stretch_through_finishes(reqs, exits, limit, pages, ps, tuple(leaving), checks, int(overlap))
        if stretch is not None:
            stretch.merges_prefill = last is not running
        return stretch

    def advance_decode_stretch(
        self, stretch: DecodeStretch, num_steps: int, launch_times: array, token_times: array, token_id: int
    ) -> LaunchedBatch:
        """Take the stretch's first num_steps steps: the first num_steps - 1 in bulk (a first
        step that merges a prefill merges it by the ordinary code), the last scheduled and
        launched as stepping does (step j at launch_times[j]); each step's processing gives its
        requests one token at token_times, and finishes those at their length. Returns the last
        step's launched batch (in flight with overlap)."""
        sched = self.sched
        overlap, last = sched.config.overlap, num_steps - 1
        launched = None
        first = 0
        if stretch.merges_prefill:
            # Step 0 merges the prefill just scheduled into the running batch (the ordinary
            # code's merge), and its decode is taken in bulk; with overlap it processes that
            # prefill (the ordinary code), after its schedule took its slots.
            kv_before = sched.kv_used_tokens()
            seg = stretch.segments[0]
            self._merge_in_bulk(stretch, seg)
            if overlap:
                prefill = sched.inflight[0]
                sched.process_batch_result(prefill, [token_id] * len(prefill.reqs), token_times[0])
                # The prefill's processing caches its prompts (and finishes a one-token request).
                taken = seg.pages_per_step[0] * sched.allocator.page_size
                stretch.kv_changes.append((0, sched.kv_used_tokens() - kv_before - taken))
            else:
                append_tokens(seg.reqs, token_id, token_times[:1])
            stretch.cached_changes.append((0, sched.tree_cache.evictable_size()))  # (step 0 may evict, too)
            first = 1
        batch = sched.running_batch
        # With requests waiting, the step after a request leaves looks at the queue: the stretch
        # was planned through such checks only where they refuse. Its last step's (scheduled by
        # the ordinary code) is the ordinary code's.
        checks = bool(sched.waiting_queue)
        check_at = -1  # overlap: the step whose check is due when its segment begins
        # Overlap: step j processes the batch launched at step j - 1 (at 0: the one in flight).
        processed = sched.inflight.pop(0).reqs if overlap and not first else []
        for seg in stretch.taken(num_steps):
            j, stop = max(seg.first_step, first), min(seg.stop, num_steps)
            if j == check_at:
                self._refused_admission_check()  # (before this step's schedule drops its leaving requests)
            if seg.leaving and j == seg.first_step:
                batch.filter_batch(exclude=seg.leaving)
                if overlap:
                    # Step j is scheduled before the batch launched at j - 1 is processed; that
                    # processing gives the leaving requests their last token and finishes them.
                    # Its schedule drops them after its prefill branch saw the batch full: then
                    # the batch is no longer full, and step j + 1's prefill branch looks.
                    launched = self._decode_steps(stretch, seg, j, j + 1, last, launch_times, token_times, token_id, processed) or launched
                    batch.batch_is_full = False
                    self._finish_leaving(stretch, seg.leaving, j, token_times[j])
                    j += 1
                    if checks and j < last:
                        if j < stop:
                            self._refused_admission_check()
                        else:
                            check_at = j
                else:
                    batch.batch_is_full = False  # (as a shrinking batch is)
                    if checks and j < last:
                        self._refused_admission_check()
            if j < stop:
                # (at step 0 with overlap the batch in flight is these very requests)
                launched = self._decode_steps(stretch, seg, j, stop, last, launch_times, token_times, token_id, seg.reqs) or launched
            if not overlap and seg.finishing and stop == seg.stop:
                self._finish_leaving(stretch, seg.finishing, stop - 1, token_times[stop - 1])
            processed = seg.reqs
        assert launched is not None
        return launched

    def _merge_in_bulk(self, stretch: DecodeStretch, seg: StretchSegment) -> None:
        """Schedule a stretch's step 0, which merges the prefill scheduled before: the merge,
        the queue look and the drop of requests finishing in flight by the ordinary code, then
        the decode's slots and decay in bulk (step 1 processes its result in bulk, so it plans
        and launches nothing). The last step's ordinary schedule sets the rest of the batch's
        per-step state (its plan, num_retracted) before anything reads it."""
        sched = self.sched
        sched.merge_last_prefill()
        admitted = sched.get_new_batch_prefill()  # (the call outside the assert: it must run under -O too)
        assert admitted is None, "a decode stretch's merge step admitted a request"
        batch = sched.running_batch
        sched.drop_finishing_inflight(batch)
        assert batch.reqs == seg.reqs, "a decode stretch's merge changed its batch"
        batch.forward_mode = ForwardMode.DECODE
        sched.last_batch = batch
        self._bulk_decode(stretch, seg, 0, 1)

    def _refused_admission_check(self) -> None:
        """A step's prefill branch inside a stretch, which the stretch's plan showed to refuse
        (refused_admission.py): the ordinary code, for its stamps and the head's match."""
        sched = self.sched
        admitted = sched.get_new_batch_prefill()
        assert admitted is None and sched.running_batch.batch_is_full, "a decode stretch's admission check did not refuse"

    def _decode_steps(
        self,
        stretch: DecodeStretch,
        seg: StretchSegment,
        start: int,
        stop: int,
        last: int,
        launch_times: array,
        token_times: array,
        token_id: int,
        processed: list[Req],
    ) -> LaunchedBatch | None:
        """Steps start .. stop - 1 of segment seg: scheduled in bulk, but for the stretch's last
        step (scheduled and launched by the ordinary code, after the tokens of the steps before);
        each processing gives `processed` its token. Returns the last step's launched batch."""
        sched = self.sched
        bulk_stop = min(stop, last)
        if start < bulk_stop:
            self._bulk_decode(stretch, seg, start, bulk_stop - start)
            append_tokens(processed, token_id, token_times[start:bulk_stop])
        if stop <= last:
            return None
        batch = sched.running_batch
        scheduled = sched.get_next_batch_to_run()
        assert scheduled is batch and scheduled.forward_mode is ForwardMode.DECODE and scheduled.reqs == seg.reqs, (
            "a decode stretch changed its batch"
        )
        launched = sched.launch(scheduled, launch_times[last], sched.config.overlap)
        append_tokens(processed, token_id, token_times[last:])
        return launched

    def _finish_leaving(self, stretch: DecodeStretch, reqs: tuple[Req, ...], step: int, now: float) -> None:
        """The requests' last tokens were processed at the stretch's step `step`: they finish."""
        sched = self.sched
        kv_before = sched.kv_used_tokens()
        for r in reqs:
            r.check_finished()
            assert r.finished_reason is not None, "a decode stretch's request did not finish at its length"
            sched.finish(r, now)
        stretch.kv_changes.append((step, sched.kv_used_tokens() - kv_before))
        stretch.cached_changes.append((step, sched.tree_cache.evictable_size()))

    def _bulk_decode(self, stretch: DecodeStretch, seg: StretchSegment, first_step: int, num_steps: int) -> None:
        """The scheduling side of the stretch's steps first_step .. first_step + num_steps - 1
        (of segment seg): their evictions and KV slots, the decay of new_token_ratio, and
        (overlap) the future indices their launches would name."""
        sched = self.sched
        alloc, batch, reqs = sched.allocator, sched.running_batch, seg.reqs
        ps, bs = alloc.page_size, len(reqs)
        # prepare_for_decode's slots: alloc's order with page size 1; alloc_decode pops its new pages from the end.
        take = alloc.take_pages_in_steps_dealt if ps == 1 else (lambda n, _: reversed(alloc.take_pages(n)))
        done = 0
        while done < num_steps:
            if alloc.num_free_pages() < bs:
                # This step's schedule evicts, as stepping's does: check_decode_mem, then prepare_for_decode.
                batch.check_decode_mem()
                batch.evict_if_needed(bs * ps)
                stretch.cached_changes.append((first_step + done, sched.tree_cache.evictable_size()))
            # The steps from here that find their pages free (the segment's cycle, from this step).
            phase = (first_step + done - seg.first_step) % ps
            per_step = seg.pages_per_step[phase:] + seg.pages_per_step[:phase]
            n = steps_with_pages(alloc.num_free_pages(), per_step, bs, num_steps - done)
            assert n > 0, "a decode stretch ran out of KV pages"
            bulk_decode_slots(sched.req_to_token_pool, reqs, n, ps, take)
            done += n
        sched.new_token_ratio = sched.ratio_decay.after(sched.new_token_ratio, num_steps)
        if sched.config.overlap:
            sched.future.skip(len(reqs), num_steps)
