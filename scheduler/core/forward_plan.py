"""ForwardPlan: everything an executor needs for one forward pass.

The simulator costs the very plan that the real engine runs, so every field
here is plain Python data (lists of ints), never a tensor.
"""

from __future__ import annotations

import enum
from array import array
from dataclasses import dataclass

from scheduler.core.ids import ids
from scheduler.core.sampling import SamplingParams


class ForwardMode(enum.Enum):
    EXTEND = "extend"  # prefill, possibly on top of a cached prefix or a previous chunk
    DECODE = "decode"  # one new token per request
    MIXED = "mixed"  # extend and decode requests in one batch
    IDLE = "idle"

    def is_extend(self) -> bool:
        return self in (ForwardMode.EXTEND, ForwardMode.MIXED)


@dataclass(slots=True)
class ForwardPlan:
    mode: ForwardMode
    # Per request (all lists have batch_size entries).
    req_pool_indices: list[int]  # row of each request in ReqToTokenPool
    prefix_lens: list[int]  # tokens already in the KV cache before this forward
    extend_lens: list[int]  # new tokens this forward computes (1 for decode)
    seq_lens: list[int]  # prefix_len + extend_len
    sampling: list[SamplingParams]
    # If False the request is a non-final prefill chunk: its sampled token is discarded.
    sample: list[bool]
    out_cache_loc: array  # KV slot each new token writes (sum(extend_lens) int64 entries)
    # Where the new tokens come from: request i computes token_sources[i][prefix_lens[i]:seq_lens[i]].
    # input_ids and positions are derived from it on first use: the simulator never needs them.
    token_sources: list[array] | None = None
    # Overlap mode: the future-map index where each request's sampled token is stored,
    # so that the next batch can name it before the CPU has seen it.
    future_indices: list[int] | None = None
    # Writes to ReqToTokenPool rows since the last plan, as (row, start, slots), for an
    # executor that mirrors the table on its device (decode appends are not in it: they
    # are req_pool_indices x positions -> out_cache_loc). None when nobody mirrors.
    row_writes: list[tuple[int, int, array]] | None = None
    # Cost-model summaries, filled by the scheduler so that cost models need not loop.
    num_tokens: int = 0  # sum(extend_lens)
    sum_seq_len: int = 0  # sum(seq_lens)
    sum_prefix_len: int = 0  # sum(prefix_lens)
    # sum(extend_len * (prefix_len + (extend_len + 1) / 2)): query-key pairs of causal attention
    attention_pairs: float = 0.0
    max_seq_len: int = 0  # max(seq_lens): what a backend that pads the batch reads per request
    _input_ids: array | list[int] | None = None
    _positions: list[int] | None = None

    @property
    def batch_size(self) -> int:
        return len(self.req_pool_indices)

    @property
    def input_ids(self) -> array | list[int]:
        """Token of each new position; negative ids are placeholders, -(future index) of a
        token still on the device (overlap mode)."""
        if self._input_ids is None:
            ids = array("q")
            for src, p, s in zip(self.token_sources, self.prefix_lens, self.seq_lens):
                ids.extend(src[p:s])
            self._input_ids = ids
        return self._input_ids

    @property
    def positions(self) -> list[int]:
        if self._positions is None:
            pos: list[int] = []
            for p, s in zip(self.prefix_lens, self.seq_lens):
                pos.extend(range(p, s))
            self._positions = pos
        return self._positions

    @staticmethod
    def summarize(prefix_lens: list[int], extend_lens: list[int]) -> tuple[int, int, int, float, int]:
        """(num_tokens, sum_seq_len, sum_prefix_len, attention_pairs, max_seq_len) of a batch."""
        num_tokens = sum(extend_lens)
        sum_prefix = sum(prefix_lens)
        pairs = 0.0
        longest = 0
        for p, e in zip(prefix_lens, extend_lens):
            pairs += e * (p + (e + 1) / 2)
            longest = max(longest, p + e)
        return num_tokens, sum_prefix + num_tokens, sum_prefix, pairs, longest


def synthetic_plan(mode: ForwardMode, prefix_lens: list[int], extend_lens: list[int], with_rows: bool) -> ForwardPlan:
    """A plan of requests laid out side by side in the KV pool (rows 0..B-1), every token id 1:
    what calibrate times, and what an engine warms up on before it takes requests."""
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    out_cache_loc, row_writes, off = ids(), [], 0
    for i, (p, s) in enumerate(zip(prefix_lens, seq_lens)):
        row_writes.append((i, 0, ids(range(off, off + s))))
        out_cache_loc.extend(range(off + p, off + s))
        off += s
    n, sum_seq, sum_prefix, pairs, longest = ForwardPlan.summarize(prefix_lens, extend_lens)
    return ForwardPlan(
        mode=mode,
        req_pool_indices=list(range(len(seq_lens))),
        prefix_lens=prefix_lens,
        extend_lens=extend_lens,
        seq_lens=seq_lens,
        sampling=[SamplingParams(max_new_tokens=1)] * len(seq_lens),
        sample=[True] * len(seq_lens),
        out_cache_loc=out_cache_loc,
        token_sources=[ids([1]) * s for s in seq_lens],
        row_writes=row_writes if with_rows else None,
        num_tokens=n,
        sum_seq_len=sum_seq,
        sum_prefix_len=sum_prefix,
        attention_pairs=pairs,
        max_seq_len=longest,
    )
