"""Admission checks a decode stretch may go through: those sure to refuse (SGLang, requests waiting).

While the running batch is full, SGLang's prefill branch does not look at the waiting queue;
once a request leaves, the next step's does. With a tight KV pool the check usually refuses
(the head of the queue does not fit the budget), marks the batch full again, and the batch
decodes on. A stretch may go on past such a check when it is sure to refuse: the advance runs
the ordinary check at its step (so its LRU stamps and the head's match are stepping's), and
asserts that it refused.

The check refuses the head request h (PrefillAdder.add_one_req's NO_TOKEN) when

    extend_h + max_new_h + page_size >= available + evictable - e_P - offset

where extend_h = len(fill_h) - P (P: its cached prefix, locked first; e_P of it was evictable)
and offset is what the running requests will still decode (each min(remaining, 4096), times
new_token_ratio unless it ignores EOS). With l_P = P - e_P, the part of the prefix that running
requests hold locked, that is

    len(fill_h) + max_new_h + page_size + offset >= available + evictable + l_P.

At a check `c` steps on, each term is bounded from what is known now, the right side from above
and the left from below, so that the inequality of the bounds proves the check's:
- available + evictable: less the pages the steps before c take, plus at most the KV of each
  request that finished by then (a finish turns at most its row's slots, its last page whole,
  into free or evictable ones; eviction only moves slots from one to the other), plus, where the
  stretch's first step processes a prefill (overlap), the slots that processing frees: a
  prompt's tokens that are cached by then (already in the cache, or an earlier request's of the
  batch) are duplicates of its own;
- l_P: in a stretch locks are released (finishes), and evictions and a finish's inserts add no
  locked node, so the locked part of h's path is at most today's (RadixCache.locked_prefix_len);
  but for a prefill whose result the stretch's first step processes (overlap): that caches its
  prompts, each locked by its request, so l_P is also at most h's common prefix with any of them;
- offset: over the requests still running, each with at most c more tokens (it has exactly c
  more: one a step processed), and new_token_ratio after c + 1 decays (it only decays).

Only where the check's head is the queue's first request (FCFS, no priority scheduling) and it
can only refuse by NO_TOKEN, which marks the batch full (no mixed chunk, budgets positive).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from scheduler.core.ids import common_prefix_len
from scheduler.sglang.prefill_adder import CLIP_MAX_NEW_TOKENS
from scheduler.sglang.token_ratio import NewTokenRatioDecay

if TYPE_CHECKING:
    from scheduler.core.req import Req
    from scheduler.sglang.scheduler_state import SchedulerState

# Tokens the bounds must clear by: the adder sums floats in its own order.
MARGIN = 16.0
# A prefill of more requests is not looked at (each is compared with those before it).
MAX_PREFILL_LOOKED_AT = 16


@dataclass(slots=True)
class RefusedAdmissions:
    """The bounds of a stretch's admission checks, from the scheduler's state when the stretch
    was asked for."""

    need: int  # len(fill_h) + max_new_h + page_size of the head request h
    budget: int  # available + evictable + l_P now (with what the first step's processing frees)
    ratio: float  # new_token_ratio now
    decay: NewTokenRatioDecay
    page_size: int
    released: int = 0  # at most what the requests that left so far released

    @classmethod
    def of(cls, sched: SchedulerState, unprocessed_prefill: Sequence[Req] = ()) -> RefusedAdmissions | None:
        """The bounds, or None where a check's outcome is not a matter of the KV budget alone.
        unprocessed_prefill: the requests of a prefill whose result the stretch processes."""
        queue, policy, config = sched.waiting_queue, sched.policy, sched.config
        if not queue or policy.enable_priority_scheduling or policy.effective_policy(len(queue)) != "fcfs":
            return None  # the head is not the queue's first
        if sched.is_mixed_chunk or config.max_prefill_tokens <= 0 or (config.effective_chunked_prefill_size or 1) <= 0:
            return None  # the adder could stop for its input budget, leaving the batch not full
        head = queue[0]
        if head.sampling_params.ignore_eos and sched.tree_cache.disabled:
            return None  # add_one_req_ignore_eos's own rule
        if len(unprocessed_prefill) > MAX_PREFILL_LOOKED_AT:
            return None
        outputs = len(head.output_ids)
        fill = head.origin_input_ids
        ps = sched.allocator.page_size
        need = head.input_len + outputs + min(max(head.max_new_tokens - outputs, 0), CLIP_MAX_NEW_TOKENS) + ps
        tree = sched.tree_cache
        locked = tree.locked_prefix_len(fill)  # (outputs, if any, only lengthen the path)
        budget = sched.allocator.available_size() + tree.evictable_size()
        for i, r in enumerate(unprocessed_prefill):
            locked = max(locked, common_prefix_len(fill, r.fill_ids))
            cached = max(
                [tree.cached_prefix_len(r.fill_ids)] + [common_prefix_len(r.fill_ids, q.fill_ids) for q in unprocessed_prefill[:i]]
            )
            budget += max(0, cached - len(r.prefix_indices)) + ps  # (its duplicates' pages, the last whole)
        return cls(need, budget + locked, sched.new_token_ratio, sched.ratio_decay, ps)

    def leave(self, seq_len: int) -> None:
        """A request leaves, with at most seq_len slots when it finishes: count the most its
        finish can release (its row, the last page whole)."""
        ps = self.page_size
        self.released += (-(-seq_len // ps) + 1) * ps

    def refuses(self, check_step: int, running: Sequence[tuple[Req, int, int]], pages_taken: int) -> bool:
        """Whether the check at check_step is sure to refuse. running: (request, seq_len when
        asked, exit step) of those still running there; pages_taken: pages the steps before it
        take at least."""
        c = check_step
        ratio = self.decay.after(self.ratio, c + 1)
        offset, clip = 0.0, CLIP_MAX_NEW_TOKENS
        for r, _, exit_step in running:
            left = exit_step - c  # the request's remaining tokens at the check are at least this
            if left > 0:
                offset += (left if left < clip else clip) * (1.0 if r.sampling_params.ignore_eos else ratio)
        budget = self.budget - pages_taken * self.page_size + self.released
        return self.need + offset >= budget + MARGIN
