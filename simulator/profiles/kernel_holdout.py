"""How far a kernel profile's prices are from the database at measured shapes it did not use.

The database measured attention at some (batch, sequence length) shapes; the profile tabulates it
on grids (simulator/profiles/kernel_profile.py) that hold most of them (powers of 2), and interpolates in
between. To see the interpolation's error where it matters, the check leaves every other sequence
length of each attention grid out (a profile with half the grid: its error bounds the full one's)
and, at every measured shape of this model's heads off that thinned grid, prices a whole forward
twice: by the thinned profile (KernelProfileCostModel on a uniform plan of that shape) and straight
from the database (every kernel queried at that exact shape, composed as the profile composes
them). Their relative difference is the error of the grids, the interpolation and the monotone
clean-up; not of the composition itself (one forward as a sum of kernels), which only a real run
can check (benchmarks/gpu_profile.py compares one layer with independent kernel timings).
"""

from __future__ import annotations

import copy

import numpy as np

from scheduler.core.forward_plan import ForwardMode, ForwardPlan
from simulator.costs.kernel_cost import KernelProfileCostModel
from simulator.profiles.kernel_db import KernelDatabase
from simulator.profiles.mla_module import DECODE_FMHA


def uniform_plan(mode: ForwardMode, batch: int, new_tokens: int, prefix: int) -> ForwardPlan:
    """A plan of `batch` equal requests, with the cost summaries a cost model reads (no token data)."""
    prefix_lens, extend_lens = [prefix] * batch, [new_tokens] * batch
    n, sum_seq, sum_prefix, pairs, longest = ForwardPlan.summarize(prefix_lens, extend_lens)
    return ForwardPlan(
        mode=mode,
        req_pool_indices=list(range(batch)),
        prefix_lens=prefix_lens,
        extend_lens=extend_lens,
        seq_lens=[prefix + new_tokens] * batch,
        sampling=[],
        sample=[True] * batch,
        out_cache_loc=None,
        num_tokens=n,
        sum_seq_len=sum_seq,
        sum_prefix_len=sum_prefix,
        attention_pairs=pairs,
        max_seq_len=longest,
    )


def direct_forward(g, db: KernelDatabase, mode: ForwardMode, batch: int, seq: int) -> float:
    """A uniform forward straight from the database: prefill of `seq` new tokens a request, or decode over `seq`
    (with attention data parallelism, on the busiest of the dp ranks the requests are spread over)."""
    per_request = seq if mode is ForwardMode.EXTEND else 1
    rank = -(-batch // g.dp)
    n, n_rank = batch * per_request, rank * per_request
    attention = g.prefill_attention(db, rank, seq, 0) if mode is ForwardMode.EXTEND else g.decode_attention(db, rank, seq)
    layer = sum(g.layer_kernels(db, n_rank).values()) + sum(g.all_ranks_kernels(db, n).values()) + attention
    return g.layers * layer + g.embedding(db, n_rank) + g.lm_head(db, rank)


def _summary(errors: list[float]) -> dict:
    if not errors:
        return {"points": 0}
    a = np.abs(errors)
    return {
        "points": len(a),
        "median_rel_err": float(np.median(a)),
        "p90_rel_err": float(np.percentile(a, 90)),
        "max_rel_err": float(a.max()),
        "mean_signed_err": float(np.mean(errors)),
    }


def thinned(profile: dict) -> dict:
    """The profile with every other sequence length of both attention grids left out (the last kept)."""
    k = copy.deepcopy(profile["kernels"])
    for key, axis in (("prefill_attention", "new_tokens"), ("decode_attention", "context")):
        table = k[key]
        keep = list(range(0, len(table[axis]), 2))
        if keep[-1] != len(table[axis]) - 1:
            keep.append(len(table[axis]) - 1)
        table[axis] = [table[axis][i] for i in keep]
        table["seconds"] = [[row[i] for i in keep] for row in table["seconds"]]
    return profile | {"kernels": k}


def holdout_errors(profile: dict, db: KernelDatabase, g) -> dict:
    """{"extend": ..., "decode": ...}: points, median / p90 / max relative error, mean signed error
    of the thinned profile at the measured shapes off its grid."""
    check = thinned(profile)
    cost = KernelProfileCostModel(check)
    out = {}
    for mode, key, axis in ((ForwardMode.EXTEND, "prefill_attention", "new_tokens"), (ForwardMode.DECODE, "decode_attention", "context")):
        used = set(check["kernels"][key][axis])
        extend = mode is ForwardMode.EXTEND
        # The measured rows of the precision that priced the table (KV dtype; prefill: attention dtype too).
        kv, fmha = (g.prefill_kv, g.prefill_fmha) if extend else (g.decode_kv, None)
        if g.sparse is not None and g.sparse.prices_projections:
            measured = db.tables.measured_dsa(extend, g.sparse.architecture, g.heads, kv, g.sparse.module_gemm)
        elif g.mla_module is not None:
            measured = db.tables.measured_mla_module(extend, g.heads, kv, fmha or DECODE_FMHA, g.mla_module.gemm)
        elif g.kv_lora:
            measured = db.tables.measured_mla(extend, g.heads, kv, fmha)
        else:
            measured = db.tables.measured_attention(extend, g.heads, g.kv_heads, g.head_dim, kv, fmha)
        shapes = [(b, s) for b, s in measured if s not in used and s >= 1]
        errors = []
        for b, s in shapes:
            plan = uniform_plan(mode, b, s, 0) if mode is ForwardMode.EXTEND else uniform_plan(mode, b, 1, s - 1)
            ref = direct_forward(g, db, mode, b, s)
            errors.append(cost.forward_time(plan) / ref - 1)
        out[mode.value] = _summary(errors)
    return out
