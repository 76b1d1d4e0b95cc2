"""ScheduleBatch: the requests of one forward, their KV allocation, and the ForwardPlan.

prepare_for_extend / prepare_for_decode allocate KV slots (evicting from the
cache when short) and write them into ReqToTokenPool; to_plan() turns the batch
into the plain-data ForwardPlan that an executor runs or a cost model prices.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.core.forward_plan import ForwardMode, ForwardPlan
from scheduler.core.ids import ids
from scheduler.core.req import Req
from scheduler.memory.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator

# Decode steps of headroom that retraction leaves each remaining request (SGLang's value).
RETRACT_DECODE_STEPS = 20


class OutOfKVMemory(RuntimeError):
    pass


@dataclass(eq=False)
class ScheduleBatch:
    reqs: list[Req]
    req_to_token_pool: ReqToTokenPool
    allocator: TokenToKVPoolAllocator
    tree_cache: object
    forward_mode: ForwardMode = ForwardMode.DECODE
    chunked_req: Req | None = None  # the request of this batch whose prefill is not complete
    plan: ForwardPlan | None = None
    batch_is_full: bool = False
    # Filled when the batch runs: what the step record needs.
    num_retracted: int = 0
    cache_hit_tokens: int = 0
    num_extend_reqs: int = 0  # a mixed batch: its first rows extend, the rest decode

    def batch_size(self) -> int:
        return len(self.reqs)

    def is_empty(self) -> bool:
        return not self.reqs

    # -- memory -------------------------------------------------------------
    def evict_if_needed(self, num_tokens: int) -> None:
        short = num_tokens - self.allocator.available_size()
        if short > 0:
            self.tree_cache.evict(short)

    def _last_loc(self, req: Req) -> int:
        if req.seq_len == 0:
            return -1
        return self.req_to_token_pool.req_to_token[req.req_pool_idx][req.seq_len - 1]

    # -- extend -------------------------------------------------------------
    def prepare_for_extend(self) -> None:
        self.forward_mode = ForwardMode.EXTEND
        pool, alloc = self.req_to_token_pool, self.allocator
        prefix_lens = [len(r.prefix_indices) for r in self.reqs]
        extend_lens = [len(r.fill_ids) - p for r, p in zip(self.reqs, prefix_lens)]
        for r, prefix_len in zip(self.reqs, prefix_lens):
            if r.req_pool_idx is None:
                r.req_pool_idx = pool.alloc()
                if r.req_pool_idx is None:
                    raise OutOfKVMemory("no free request slot")
                pool.write(r.req_pool_idx, 0, r.prefix_indices)
            r.seq_len = prefix_len
        last_locs = [self._last_loc(r) for r in self.reqs] if alloc.page_size > 1 else []
        # SGLang's demand: with pages, as if every request began a new page.
        self.evict_if_needed(sum(extend_lens) + (len(self.reqs) * alloc.page_size if alloc.page_size > 1 else 0))
        out_cache_loc = alloc.alloc_extend(last_locs, prefix_lens, extend_lens)
        if out_cache_loc is None:
            raise OutOfKVMemory(f"prefill of {sum(extend_lens)} tokens does not fit the KV pool")
        seq_lens: list[int] = []
        pos = 0
        for r, prefix_len, n in zip(self.reqs, prefix_lens, extend_lens):
            pool.write(r.req_pool_idx, prefix_len, out_cache_loc[pos : pos + n] if len(self.reqs) > 1 else out_cache_loc)
            pos += n
            r.seq_len = prefix_len + n
            seq_lens.append(r.seq_len)
        self.num_extend_reqs = len(self.reqs)
        sample = [r is not self.chunked_req for r in self.reqs]
        num_tokens, sum_seq, sum_prefix, pairs, longest = ForwardPlan.summarize(prefix_lens, extend_lens)
        self.plan = ForwardPlan(
            mode=ForwardMode.EXTEND,
            req_pool_indices=[r.req_pool_idx for r in self.reqs],
            prefix_lens=prefix_lens,
            extend_lens=extend_lens,
            seq_lens=seq_lens,
            sampling=[r.sampling_params for r in self.reqs],
            sample=sample,
            out_cache_loc=out_cache_loc,
            token_sources=[r.fill_ids for r in self.reqs],
            row_writes=pool.take_journal(),
            num_tokens=num_tokens,
            sum_seq_len=sum_seq,
            sum_prefix_len=sum_prefix,
            attention_pairs=pairs,
            max_seq_len=longest,
        )

    # -- decode -------------------------------------------------------------
    def new_pages_next_decode(self, reqs: list[Req] | None = None) -> int:
        reqs = self.reqs if reqs is None else reqs
        ps = self.allocator.page_size
        if ps == 1:
            return len(reqs)
        return sum(1 for r in reqs if r.seq_len % ps == 0)

    def check_decode_mem(self, reqs: list[Req] | None = None) -> bool:
        need = self.new_pages_next_decode(reqs) * self.allocator.page_size
        self.evict_if_needed(need)
        return self.allocator.available_size() >= need

    def retract_decode(self) -> tuple[list[Req], float]:
        """Retract requests until the rest can decode; return them and the new token ratio.

        The requests with the fewest output tokens go first (ties: the longest
        prompt), as in SGLang: they lose the least work.
        """
        order = sorted(self.reqs, key=lambda r: (len(r.output_ids), -r.input_len, -r.index), reverse=True)
        retracted: list[Req] = []
        first = True
        while first or not self.check_decode_mem(order):
            if len(order) == 1:
                break
            first = False
            req = order.pop()
            retracted.append(req)
            self.release_for_retract(req, remaining=len(order))
        self.reqs = order  # in SGLang's keep order (filter_batch(keep_indices=sorted_indices))
        total_decoded = sum(len(r.output_ids) for r in self.reqs)
        total_max_new = sum(r.max_new_tokens for r in self.reqs)
        ratio = min(1.0, (total_decoded + RETRACT_DECODE_STEPS * len(self.reqs)) / (total_max_new + 1))
        self.num_retracted = len(retracted)
        return retracted, ratio

    def release_for_retract(self, req: Req, remaining: int) -> None:
        """Free what the request computed beyond its cached prefix (the cache keeps the prefix),
        make room for the remaining requests' next decode steps, and send it back to waiting.
        Retraction and priority preemption both release a running request this way."""
        ps = self.allocator.page_size
        uncached_from = len(req.prefix_indices) // ps * ps if not self.tree_cache.disabled else 0
        self.allocator.free(self.req_to_token_pool.get(req.req_pool_idx, uncached_from, req.seq_len))
        self.req_to_token_pool.free(req.req_pool_idx)
        self.tree_cache.dec_lock_ref(req.last_node)
        self.evict_if_needed(remaining * RETRACT_DECODE_STEPS)
        req.reset_for_retract()

    def prepare_for_decode(self) -> None:
        """Allocate one slot per request and plan one decode step."""
        self.forward_mode = ForwardMode.DECODE
        reqs, pool = self.reqs, self.req_to_token_pool
        seq_lens_before = [r.seq_len for r in reqs]
        ps = self.allocator.page_size
        last_locs = [self._last_loc(r) for r in reqs] if ps > 1 else []
        # SGLang's demand: with pages, as if every request began a new page.
        self.evict_if_needed(len(reqs) * ps)
        out_cache_loc = self.allocator.alloc_decode(last_locs, seq_lens_before)
        if out_cache_loc is None:
            raise OutOfKVMemory("decode does not fit the KV pool")
        rows = pool.req_to_token
        input_ids: list[int] = []
        for r, loc in zip(reqs, out_cache_loc):
            rows[r.req_pool_idx].append(loc)
            input_ids.append(r.output_ids[-1] if r.pending_token is None else r.pending_token)
            r.seq_len += 1
        bs = len(reqs)
        seq_lens = [n + 1 for n in seq_lens_before]
        sum_prefix = sum(seq_lens_before)
        self.plan = ForwardPlan(
            mode=ForwardMode.DECODE,
            req_pool_indices=[r.req_pool_idx for r in reqs],
            prefix_lens=seq_lens_before,
            extend_lens=[1] * bs,
            seq_lens=seq_lens,
            sampling=[r.sampling_params for r in reqs],
            sample=[True] * bs,
            out_cache_loc=out_cache_loc,
            row_writes=pool.take_journal(),
            _input_ids=input_ids,
            _positions=seq_lens_before,
            num_tokens=bs,
            sum_seq_len=sum_prefix + bs,
            sum_prefix_len=sum_prefix,
            attention_pairs=float(sum_prefix + bs),
            max_seq_len=max(seq_lens),
        )

    # -- mixed --------------------------------------------------------------
    def mix_with_running(self, running: ScheduleBatch) -> None:
        """Append the running batch's decode step (prepared by prepare_for_decode) to this
        prefill batch: a MIXED forward, each decode request a one-token extend on its
        context (SGLang's mix_with_running). Rows keep that order: prefills, then decodes."""
        ext, dec = self.plan, running.plan
        assert ext is not None and dec is not None
        # The decode slots were appended to the rows directly; an executor that mirrors the
        # table learns them from the row writes, as it learns an extend's.
        row_writes = None
        if ext.row_writes is not None:
            row_writes = ext.row_writes + (dec.row_writes or [])
            row_writes += [(slot, pos, ids([loc])) for slot, pos, loc in zip(dec.req_pool_indices, dec.prefix_lens, dec.out_cache_loc)]
        self.forward_mode = ForwardMode.MIXED
        self.reqs = self.reqs + running.reqs
        out_cache_loc = ext.out_cache_loc + dec.out_cache_loc
        prefix_lens = ext.prefix_lens + dec.prefix_lens
        extend_lens = ext.extend_lens + dec.extend_lens
        num_tokens, sum_seq, sum_prefix, pairs, longest = ForwardPlan.summarize(prefix_lens, extend_lens)
        self.plan = ForwardPlan(
            mode=ForwardMode.MIXED,
            req_pool_indices=ext.req_pool_indices + dec.req_pool_indices,
            prefix_lens=prefix_lens,
            extend_lens=extend_lens,
            seq_lens=ext.seq_lens + dec.seq_lens,
            sampling=ext.sampling + dec.sampling,
            sample=ext.sample + dec.sample,
            out_cache_loc=out_cache_loc,
            row_writes=row_writes,
            _input_ids=list(ext.input_ids) + list(dec.input_ids),
            _positions=ext.positions + dec.positions,
            num_tokens=num_tokens,
            sum_seq_len=sum_seq,
            sum_prefix_len=sum_prefix,
            attention_pairs=pairs,
            max_seq_len=longest,
        )

    # -- membership ---------------------------------------------------------
    def filter_batch(self, exclude: tuple[Req | None, ...] = ()) -> None:
        """Drop finished and retracted requests, and `exclude` (requests still being chunked)."""
        # (r.finished() inlined: this runs on every request at every step)
        self.reqs = [r for r in self.reqs if r.finished_reason is None and not r.is_retracted and r not in exclude]

    def merge_batch(self, other: ScheduleBatch) -> None:
        self.reqs.extend(other.reqs)
