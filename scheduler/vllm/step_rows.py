"""The requests one vLLM step schedules, column by column, and the ForwardPlan they make.

A step carries every running decode: each row is appended to the columns the plan lists as it
is scheduled (its input token and KV slot included), so that the plan is a few bulk operations
over the columns rather than another pass over per-row objects.
"""

from __future__ import annotations

from array import array
from operator import add, attrgetter, mul

from scheduler.core.forward_plan import ForwardMode, ForwardPlan
from scheduler.core.ids import ids
from scheduler.core.req import Req

_row_of = attrgetter("req_pool_idx")
_sampling_of = attrgetter("sampling_params")


def new_token_ids(req: Req, start: int, end: int) -> array:
    """Tokens at positions [start, end): prompt, outputs, then the one still in flight."""
    prompt_len, outs = req.input_len, req.output_ids
    out = ids()
    if start < prompt_len:
        out.extend(req.origin_input_ids[start : min(end, prompt_len)])
    if end > prompt_len:
        out.extend(outs[max(start - prompt_len, 0) : end - prompt_len])
        if end - prompt_len > len(outs):
            out.append(req.pending_token)
    return out


class StepRows:
    """One step's scheduled requests in order: row i computes reqs[i]'s tokens prefix_lens[i] ..
    prefix_lens[i] + extend_lens[i] - 1 (input_ids and out_cache_loc hold every row's, in row
    order), and samples its last position if sample[i]."""

    __slots__ = ("reqs", "prefix_lens", "extend_lens", "sample", "input_ids", "out_cache_loc", "num_decoding")

    def __init__(self) -> None:
        self.reqs: list[Req] = []
        self.prefix_lens: list[int] = []
        self.extend_lens: list[int] = []
        self.sample: list[bool] = []
        self.input_ids = ids()
        self.out_cache_loc = ids()
        self.num_decoding = 0  # rows that decode (one token past the prompt) and sample

    def __len__(self) -> int:
        return len(self.reqs)

    def add_decode(self, req: Req, before: int, token: int, loc: int) -> None:
        """A decode: the one token at `before` (the last output, or the one in flight), sampled,
        into KV slot loc."""
        self.reqs.append(req)
        self.prefix_lens.append(before)
        self.extend_lens.append(1)
        self.sample.append(True)
        self.input_ids.append(token)
        self.out_cache_loc.append(loc)
        self.num_decoding += 1

    def add(self, req: Req, before: int, num_new: int, sample: bool, locs: array) -> None:
        """Any row: num_new tokens from `before` into KV slots locs."""
        self.reqs.append(req)
        self.prefix_lens.append(before)
        self.extend_lens.append(num_new)
        self.sample.append(sample)
        if self._decodes(req, before, num_new):
            self.num_decoding += sample
        self.input_ids.extend(new_token_ids(req, before, before + num_new))
        self.out_cache_loc.extend(locs)

    def remove(self, req: Req) -> int | None:
        """Drop req's row (preempted after it was scheduled); its token count, None if it has none."""
        if req not in self.reqs:  # checked first: list.index's ValueError would format req's whole repr
            return None
        i = self.reqs.index(req)
        before, num_new = self.prefix_lens[i], self.extend_lens[i]
        if self._decodes(req, before, num_new):
            self.num_decoding -= self.sample[i]
        start = sum(self.extend_lens[:i])
        del self.input_ids[start : start + num_new], self.out_cache_loc[start : start + num_new]
        for column in (self.reqs, self.prefix_lens, self.extend_lens, self.sample):
            del column[i]
        return num_new

    @staticmethod
    def _decodes(req: Req, before: int, num_new: int) -> bool:
        return num_new == 1 and before >= req.input_len

    def plan(self, row_writes: list[tuple[int, int, array]] | None) -> ForwardPlan:
        """The step's forward (its summaries are sums of integers: attention_pairs, a float sum of
        whole numbers in ForwardPlan.summarize, is exact, so the order of summing is free)."""
        reqs, prefix_lens, extend_lens = self.reqs, self.prefix_lens, self.extend_lens
        if self.num_decoding == len(reqs):
            mode = ForwardMode.DECODE
        else:
            mode = ForwardMode.MIXED if self.num_decoding else ForwardMode.EXTEND
        seq_lens = list(map(add, prefix_lens, extend_lens))
        num_tokens = sum(extend_lens)
        sum_prefix = sum(prefix_lens)
        # sum(e * (p + (e + 1) / 2)) = sum(e * p) + (sum(e * e) + sum(e)) / 2
        pairs = sum(map(mul, extend_lens, prefix_lens)) + (sum(map(mul, extend_lens, extend_lens)) + num_tokens) // 2
        return ForwardPlan(
            mode=mode,
            req_pool_indices=list(map(_row_of, reqs)),
            prefix_lens=prefix_lens,
            extend_lens=extend_lens,
            seq_lens=seq_lens,
            sampling=list(map(_sampling_of, reqs)),
            sample=self.sample,
            out_cache_loc=self.out_cache_loc,
            row_writes=row_writes,
            _input_ids=self.input_ids,
            num_tokens=num_tokens,
            sum_seq_len=sum_prefix + num_tokens,
            sum_prefix_len=sum_prefix,
            attention_pairs=float(pairs),
            max_seq_len=max(seq_lens, default=0),
        )
