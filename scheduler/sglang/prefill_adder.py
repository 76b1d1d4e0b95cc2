"""PrefillAdder: admits waiting requests into one prefill batch under token budgets.

As SGLang 0.5.23's schedule_policy.py and mem_cache/prefill_budget.py:
- rem_input_tokens: new prompt tokens this batch may compute (max_prefill_tokens, less
  the decode tokens of a mixed batch);
- rem_chunk_tokens: the chunked-prefill size (less those decode tokens); a request that
  does not fit is cut into a chunk, and only one request is chunked at a time;
- the KV budget: free + evictable slots, less `total_offset` (what admitted requests
  take now and what admitted and running requests will still decode) for
  rem_total_tokens, less `current_offset` (what admitted requests take now) for
  cur_rem_tokens. A running request will decode min(remaining output, 4096) tokens,
  times new_token_ratio unless it ignores EOS (its length is fixed, so no early stop
  is expected). Each admitted request also reserves one page for page alignment.
- Without a radix cache, requests that ignore EOS go through a stricter check that
  simulates the running batch to its end (add_one_req_ignore_eos).
- With priority scheduling, a waiting request may preempt running requests whose
  priority is lower by more than the threshold (preempt_to_schedule).
"""

from __future__ import annotations

import enum

from scheduler.core.req import Req

# SGLang clips each request's reserved decode tokens so a huge max_new_tokens
# does not block admission forever.
CLIP_MAX_NEW_TOKENS = 4096
IGNORE_EOS_RESERVE_TOKENS = 1  # slots per request the ignore-EOS check keeps in hand


class AddReqResult(enum.Enum):
    CONTINUE = "continue"  # more requests may be added
    NO_TOKEN = "no_token"  # KV budget exhausted
    OTHER = "other"  # prefill-size or chunk budget exhausted


class PrefillAdder:
    def __init__(
        self,
        tree_cache,
        allocator,
        running_batch,
        new_token_ratio: float,
        max_prefill_tokens: int,
        chunked_prefill_size: int | None,
        page_size: int = 1,
        num_mixed_decode_tokens: int = 0,
        priority_preemption_threshold: int = 10,
    ) -> None:
        self.tree_cache = tree_cache
        self.allocator = allocator
        self.page_size = page_size
        self.running_batch = running_batch  # ScheduleBatch or None; preemption removes from it
        self.new_token_ratio = new_token_ratio
        self.rem_input_tokens = max_prefill_tokens - num_mixed_decode_tokens
        self.rem_chunk_tokens = None if chunked_prefill_size is None else chunked_prefill_size - num_mixed_decode_tokens
        self.priority_preemption_threshold = priority_preemption_threshold
        self.total_offset: float = num_mixed_decode_tokens
        self.current_offset: float = num_mixed_decode_tokens
        if running_batch is not None:
            # sum(running_offset(r) for r in running_batch.reqs), in the same order, inlined: a
            # prefill look happens nearly every step, over every running request. (min() of two
            # ints as a conditional: the same int, at half the cost of the call.)
            ratio, clip = new_token_ratio, CLIP_MAX_NEW_TOKENS
            self.total_offset += sum(
                [
                    (d if (d := r.max_new_tokens - len(r.output_ids)) < clip else clip) * (1.0 if r.sampling_params.ignore_eos else ratio)
                    for r in running_batch.reqs
                ]
            )
        self.can_run_list: list[Req] = []
        self.preempt_list: list[Req] = []
        self.new_chunked_req: Req | None = None
        self.req_states: list[tuple[float, int]] | None = None
        self.log_hit_tokens = 0
        self.log_input_tokens = 0

    def running_offset(self, r: Req) -> float:
        """Decode tokens a running request is still expected to need."""
        ratio = 1.0 if r.sampling_params.ignore_eos else self.new_token_ratio
        return min(r.max_new_tokens - len(r.output_ids), CLIP_MAX_NEW_TOKENS) * ratio

    def _available_and_evictable(self) -> int:
        return self.allocator.available_size() + self.tree_cache.evictable_size()

    @property
    def rem_total_tokens(self) -> float:
        return self._available_and_evictable() - self.total_offset

    @property
    def cur_rem_tokens(self) -> float:
        return self._available_and_evictable() - self.current_offset

    def _ceil_paged(self, n: int) -> int:
        return -(-n // self.page_size) * self.page_size

    def budget_state(self) -> AddReqResult:
        if not (self.rem_total_tokens > 0 and self.cur_rem_tokens > 0):
            return AddReqResult.NO_TOKEN
        if self.rem_input_tokens <= 0 or (self.rem_chunk_tokens is not None and self.rem_chunk_tokens <= 0):
            return AddReqResult.OTHER
        return AddReqResult.CONTINUE

    def _update_budget(self, prefix_len: int, extend_len: int, max_new_tokens: int) -> None:
        extend_len = self._ceil_paged(extend_len)
        immediate = extend_len + self.page_size  # one page of alignment slack per request
        self.total_offset += immediate + max_new_tokens
        self.current_offset += immediate
        self.rem_input_tokens -= extend_len
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= extend_len
        self.log_hit_tokens += prefix_len
        self.log_input_tokens += extend_len

    def _admit(self, req: Req, extend_len: int) -> None:
        req.extend_input_len = extend_len
        end = len(req.prefix_indices) + extend_len
        if end < len(req.fill_ids):  # (no copy when the whole of it is extended)
            req.fill_ids = req.fill_ids[:end]
        self.can_run_list.append(req)

    # -- the request being chunked -------------------------------------------------------
    def add_chunked_req(self, req: Req) -> Req | None:
        """Continue the request being chunked, its chunk capped by the KV budget; return it
        if it still does not finish its prefill."""
        assert self.rem_chunk_tokens is not None
        rem = min(self.rem_chunk_tokens, int(self.rem_total_tokens))
        if rem <= 0:
            rem = self.rem_chunk_tokens  # the chunk must make progress to release its KV
        truncated = req.extend_input_len > rem
        self._admit(req, min(req.extend_input_len, rem))
        self._update_budget(0, req.extend_input_len, 0 if truncated else min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS))
        return req if truncated else None

    # -- a waiting request -----------------------------------------------------------------
    def add_one_req(self, req: Req, has_chunked_req: bool = False) -> AddReqResult:
        """Try to admit req (already matched against the cache by init_next_round_input)."""
        if req.sampling_params.ignore_eos and self.tree_cache.disabled:
            return self.add_one_req_ignore_eos(req)
        max_new = min(max(req.max_new_tokens - len(req.output_ids), 0), CLIP_MAX_NEW_TOKENS)
        extend_len = req.extend_input_len
        total_tokens = extend_len + max_new + self.page_size
        prefix_len = len(req.prefix_indices)
        # Lock the matched prefix first, so its slots stop counting as evictable.
        self.tree_cache.inc_lock_ref(req.last_node)
        input_tokens = self._ceil_paged(extend_len)
        if not total_tokens < self.rem_total_tokens:
            self.tree_cache.dec_lock_ref(req.last_node)
            return AddReqResult.NO_TOKEN
        # Without chunking, the first request may exceed the input budget; later ones may not.
        if self.rem_chunk_tokens is None and self.can_run_list and input_tokens >= self.rem_input_tokens:
            self.tree_cache.dec_lock_ref(req.last_node)
            return AddReqResult.OTHER
        reserve = min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS)
        chunked = self.rem_chunk_tokens is not None and input_tokens > self.rem_chunk_tokens
        if chunked:
            ps = self.page_size
            end = (prefix_len + self.rem_chunk_tokens // ps * ps) // ps * ps
            extend_len = end - prefix_len
            if extend_len <= 0:
                self.tree_cache.dec_lock_ref(req.last_node)
                return AddReqResult.OTHER
            reserve = 0
            self.new_chunked_req = req
        self._admit(req, extend_len)
        self._update_budget(prefix_len, extend_len, reserve)
        return self.budget_state()

    def add_one_req_ignore_eos(self, req: Req) -> AddReqResult:
        """Admission without a radix cache for a request of fixed length: simulate the
        running batch decoding to its end, shortest remaining first, and admit only if
        the pool never runs dry (SGLang's add_one_req_ignore_eos)."""
        extend_len = req.extend_input_len
        paged_input = self._ceil_paged(extend_len) + self.page_size
        if not paged_input <= min(self.cur_rem_tokens, self.rem_total_tokens):
            return AddReqResult.NO_TOKEN
        if self.req_states is None:
            self.req_states = []
            self._add_req_state(req)
            if self.running_batch is not None:
                for r in self.running_batch.reqs:
                    self._add_req_state(r)
            for r in self.can_run_list:
                self._add_req_state(r)
            self.req_states.sort(key=lambda x: x[0])
        else:
            self._add_req_state(req, insert_sort=True)
        cur_rem = self.cur_rem_tokens - paged_input
        tokens_freed = 0
        for i, (tokens_left, tokens_occupied) in enumerate(self.req_states):
            bs = len(self.req_states) - i
            if cur_rem + tokens_freed - tokens_left * bs <= IGNORE_EOS_RESERVE_TOKENS * bs:
                return AddReqResult.NO_TOKEN
            tokens_freed += tokens_occupied
        if self.rem_chunk_tokens is None or extend_len <= self.rem_chunk_tokens:
            self._admit(req, extend_len)
            self._update_budget(0, extend_len, min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS))
        else:
            if self.rem_chunk_tokens <= 0:
                return AddReqResult.OTHER
            self._admit(req, self.rem_chunk_tokens)
            self.new_chunked_req = req
            self._update_budget(0, self.rem_chunk_tokens, 0)
        return self.budget_state()

    def _add_req_state(self, r: Req, insert_sort: bool = False) -> None:
        ratio = 1.0 if r.sampling_params.ignore_eos else self.new_token_ratio
        tokens_left = r.max_new_tokens * ratio - len(r.output_ids)
        if tokens_left <= 0:
            return
        state = (tokens_left, r.input_len + len(r.output_ids))
        assert self.req_states is not None
        if not insert_sort:
            self.req_states.append(state)
            return
        # SGLang's insertion: before the first state with at least as many tokens left,
        # and (the loop's index when nothing is larger) before the last one.
        i = 0
        for i in range(len(self.req_states)):
            if tokens_left <= self.req_states[i][0]:
                break
        self.req_states.insert(i, state)

    # -- priority preemption ---------------------------------------------------------------
    def preempt_to_schedule(self, req: Req, release) -> bool:
        """Preempt running requests whose priority is lower than req's by more than the
        threshold, lowest priority (then latest queued) first, until req's tokens fit.
        release(batch_index, num_left) frees one running request as retraction does.
        True if req can now be scheduled."""
        batch = self.running_batch
        candidates = [r for r in batch.reqs if r not in self.preempt_list and not r.finished()]
        candidates.sort(key=lambda r: (r.priority, -r.queue_entry))
        # As SGLang: the request's size as of its last match (0 for one never matched).
        need = req.full_fill_len - len(req.prefix_indices) + min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS) - self.rem_total_tokens
        chosen: list[Req] = []
        for r in candidates:
            if req.priority - r.priority > self.priority_preemption_threshold:
                chosen.append(r)
                need -= self.running_offset(r)
                if need <= 0:
                    break
            else:
                break
        if not chosen or need > 0:
            return False
        chosen_ids = set(map(id, chosen))
        keep: list[Req] = []
        released = 0
        for r in batch.reqs:
            if id(r) in chosen_ids:
                self.total_offset -= self.running_offset(r)
                released += 1
                release(r, len(batch.reqs) - released)
            else:
                keep.append(r)
        batch.reqs = keep
        self.preempt_list.extend(chosen)
        return True
