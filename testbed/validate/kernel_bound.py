"""The least time the database's kernels allow for a point's load, under any schedule.

A closed-loop point keeps `concurrency` clients busy: each sends its next request when its last is
done, so on average the engine completes `concurrency` requests in one request's mean latency,
the measured cycle  TTFT + (osl - 1) x TPOT. In that time one GPU of the point's TP group runs,
whatever the scheduler does:

    dense     every token of those requests, c x (isl + osl), through the non-attention kernels.
              At least osl forwards carry them (a request's tokens come one forward after another),
              and a forward costs at least dense(1) (its weights are read once) and at least the
              profile's cheapest time per token: (osl - 1) x dense(1) + the rest at that rate.
    decode    the decode attention of c x (osl - 1) generated tokens, each reading a context of at
              least isl: (osl - 1) forwards of the decode table at batch c and context isl (smaller
              batches cost more per request: each forward pays the kernel's fixed part).

With attention data parallelism (a profile of dp > 1) both terms are the busiest rank's, ceil(c / dp)
of the clients, and the routed experts (which take every rank's tokens) add their own dense term
over all c.

Prefill attention and the LM head are left out, so the sum is a lower bound. `kernel_bound` is that
bound over the measured cycle: above 1, the point was measured faster than its kernels allow, and no
schedule can reproduce it from these kernels (the measurement ran something the point's columns do
not say: a prefix cache hit, another kernel, another checkpoint format; or the tables are slow for
it). The tables scatter by a few percent (decode-bound points, whose bound is nearly their whole
cost, land between 0.95 and 1.07 on silicon_sample.csv), so validate counts a point past
BOUND_EXCEEDED, not past 1.
"""

from __future__ import annotations

from simulator.costs.kernel_cost import KernelProfileCostModel
from testbed.validate.points import MeasuredPoint

BOUND_EXCEEDED = 1.1  # the kernels' least time over the measured, beyond the tables' own scatter


def least_cycle_s(model: KernelProfileCostModel, p: MeasuredPoint) -> float:
    """The least time the profile's kernels need for `concurrency` of p's requests (seconds)."""
    c = p.concurrency
    rank = -(-c // model.dp)  # the busiest attention DP rank's clients (all of them without DP)
    steps = p.osl - 1

    def least(curve, requests: int) -> float:
        # Every token of `requests` requests at the curve's cheapest rate, but at least one step a token generated.
        per_token = min(y / x for x, y in zip(curve.xs, curve.ys) if x >= 1)
        return steps * curve(1) + (requests * (p.isl + p.osl) - steps) * per_token

    dense = least(model.dense, rank) + (least(model.all_ranks, c) if model.all_ranks is not None else 0.0)
    decode = steps * model.decode(rank, p.isl) if p.osl > 1 else 0.0
    return dense + decode


def kernel_bound(model: KernelProfileCostModel, p: MeasuredPoint) -> float:
    """least_cycle_s over the measured cycle, TTFT + (osl - 1) x TPOT."""
    measured = (p.ttft_ms + (p.osl - 1) * p.tpot_ms) / 1e3
    return least_cycle_s(model, p) / measured
