"""PrefillAdder: admits waiting requests into one prefill batch under token budgets.

Budgets, as in SGLang's schedule_policy.py:
- rem_input_tokens: new prompt tokens this batch may compute (max_prefill_tokens);
- rem_chunk_tokens: the chunked-prefill size; a request that does not fit is cut
  into a chunk, and only one request is chunked at a time;
- rem_total_tokens: free + evictable KV slots, minus what admitted and running
  requests will still need for decoding, estimated as new_token_ratio times
  their remaining output (clipped at CLIP_MAX_NEW_TOKENS per request).
"""

from __future__ import annotations

import enum

from scheduler.req import Req

# SGLang clips each request's reserved decode tokens so a huge max_new_tokens
# does not block admission forever.
CLIP_MAX_NEW_TOKENS = 4096


class AddReqResult(enum.Enum):
    CONTINUE = "continue"  # more requests may be added
    NO_TOKEN = "no_token"  # KV budget exhausted
    OTHER = "other"  # prefill-size or chunk budget exhausted


class PrefillAdder:
    def __init__(
        self,
        tree_cache,
        allocator,
        running_reqs: list[Req],
        new_token_ratio: float,
        max_prefill_tokens: int,
        chunked_prefill_size: int | None,
        page_size: int = 1,
    ) -> None:
        self.tree_cache = tree_cache
        self.allocator = allocator
        self.page_size = page_size
        self.new_token_ratio = new_token_ratio
        self.rem_input_tokens = max_prefill_tokens
        self.rem_chunk_tokens = chunked_prefill_size
        self.rem_total_token_offset = sum(
            min(r.max_new_tokens - len(r.output_ids), CLIP_MAX_NEW_TOKENS) * new_token_ratio for r in running_reqs
        )
        self.cur_rem_token_offset = 0
        self.can_run_list: list[Req] = []
        self.new_chunked_req: Req | None = None
        self.log_hit_tokens = 0
        self.log_input_tokens = 0

    @property
    def rem_total_tokens(self) -> float:
        return self.allocator.available_size() + self.tree_cache.evictable_size() - self.rem_total_token_offset

    @property
    def cur_rem_tokens(self) -> float:
        return self.allocator.available_size() + self.tree_cache.evictable_size() - self.cur_rem_token_offset

    def _ceil_paged(self, n: int) -> int:
        return -(-n // self.page_size) * self.page_size

    def budget_state(self) -> AddReqResult:
        if self.rem_total_tokens <= 0 or self.cur_rem_tokens <= 0:
            return AddReqResult.NO_TOKEN
        if self.rem_input_tokens <= 0 or (self.rem_chunk_tokens is not None and self.rem_chunk_tokens <= 0):
            return AddReqResult.OTHER
        return AddReqResult.CONTINUE

    def _update_budget(self, prefix_len: int, extend_len: int, max_new_tokens: int) -> None:
        extend_len = self._ceil_paged(extend_len)
        self.rem_total_token_offset += extend_len + max_new_tokens
        self.cur_rem_token_offset += extend_len
        self.rem_input_tokens -= extend_len
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= extend_len
        self.log_hit_tokens += prefix_len
        self.log_input_tokens += extend_len

    def add_chunked_req(self, req: Req) -> Req | None:
        """Continue the request being chunked; return it if it still does not finish its prefill."""
        assert self.rem_chunk_tokens is not None
        truncated = req.extend_input_len > self.rem_chunk_tokens
        req.extend_input_len = min(req.extend_input_len, self.rem_chunk_tokens)
        req.fill_ids = req.fill_ids[: len(req.prefix_indices) + req.extend_input_len]
        self.can_run_list.append(req)
        self._update_budget(0, req.extend_input_len, 0 if truncated else min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS))
        return req if truncated else None

    def add_one_req(self, req: Req) -> AddReqResult:
        """Try to admit req (already matched against the cache by init_next_round_input)."""
        reserve = min(req.max_new_tokens - len(req.output_ids), CLIP_MAX_NEW_TOKENS)
        total_tokens = req.extend_input_len + reserve
        input_tokens = self._ceil_paged(req.extend_input_len)
        prefix_len = len(req.prefix_indices)
        if total_tokens >= self.rem_total_tokens:
            return AddReqResult.NO_TOKEN
        if input_tokens > self.rem_input_tokens and self.can_run_list:
            return AddReqResult.OTHER

        # Lock the matched prefix first, so its slots stop counting as evictable.
        self.tree_cache.inc_lock_ref(req.last_node)
        if total_tokens > self.rem_total_tokens:
            self.tree_cache.dec_lock_ref(req.last_node)
            return AddReqResult.NO_TOKEN
        if self.rem_chunk_tokens is None or input_tokens <= self.rem_chunk_tokens:
            self.can_run_list.append(req)
            self._update_budget(prefix_len, input_tokens, reserve)
        else:
            trunc_len = self.rem_chunk_tokens // self.page_size * self.page_size
            if trunc_len <= 0:
                self.tree_cache.dec_lock_ref(req.last_node)
                return AddReqResult.OTHER
            req.extend_input_len = trunc_len
            req.fill_ids = req.fill_ids[: prefix_len + trunc_len]
            self.can_run_list.append(req)
            self.new_chunked_req = req
            self._update_budget(prefix_len, trunc_len, 0)
        return self.budget_state()
