"""Lockstep comparison of two runs of one scenario: the first step where they differ."""

from __future__ import annotations

from dataclasses import dataclass

from conformance.decision import RunResult, StepDecision

# Differences kept on purpose (DESIGN.md says why). The scenarios do not draw them: each is
# covered by a test of ours instead.
EXPECTED_DIFFERENCES = (
    "A prompt that leaves no room for output (>= min(context, KV pool) - 6 tokens) is rejected at "
    "arrival with a reason; SGLang aborts it and runs a one-token prefill to report the abort.",
    "Several running requests preempted for one waiting request re-queue in running-batch order; "
    "SGLang re-queues them in set order (arbitrary), which matters only for equal priorities.",
    "A request that SGLang's admission refuses even on an empty KV pool is rejected at arrival with the "
    "reason; SGLang queues it and waits for it forever (and, first come first served, for the requests "
    "behind it).",
    "Overlap mode: results are processed one step late in both, but the testbed's clock is the "
    "simulator's or the wall clock; the oracle's loop runs on a logical clock (one step a forward).",
)

FIELDS = ("mode", "reqs", "retracted", "new_token_ratio", "kv_used", "kv_cached", "num_waiting")


@dataclass
class Divergence:
    step: int  # index of the first differing step (or len of the shorter run)
    what: str  # the fields that differ, or "rejected", "outputs", "error", "length"
    ours: object
    sglang: object


def first_divergence(ours: RunResult, sglang: RunResult) -> Divergence | None:
    for i, (a, b) in enumerate(zip(ours.steps, sglang.steps)):
        diff = [f for f in FIELDS if _norm(getattr(a, f)) != _norm(getattr(b, f))]
        if diff:
            return Divergence(i, ",".join(diff), a.to_dict(), b.to_dict())
    n = min(len(ours.steps), len(sglang.steps))
    if len(ours.steps) != len(sglang.steps):
        extra = lambda r: r.steps[n].to_dict() if len(r.steps) > n else None  # noqa: E731
        return Divergence(n, "length", extra(ours), extra(sglang))
    if sorted(ours.rejected) != sorted(sglang.rejected):
        return Divergence(n, "rejected", sorted(ours.rejected), sorted(sglang.rejected))
    if _error_kind(ours.error) != _error_kind(sglang.error):
        return Divergence(n, "error", ours.error, sglang.error)
    if ours.outputs != sglang.outputs:
        diff = {
            k: (ours.outputs.get(k), sglang.outputs.get(k))
            for k in set(ours.outputs) | set(sglang.outputs)
            if ours.outputs.get(k) != sglang.outputs.get(k)
        }
        return Divergence(n, "outputs", {k: v[0] for k, v in diff.items()}, {k: v[1] for k, v in diff.items()})
    return None


def _error_kind(error: str | None) -> str | None:
    """Both stuck is agreement: the messages differ, the state does not."""
    return None if error is None else error.split(":")[0]


def _norm(v):
    if isinstance(v, float):
        return round(v, 6)
    if isinstance(v, list):
        return [tuple(x) if isinstance(x, (list, tuple)) else x for x in v]
    return v


def step_count(r: RunResult) -> int:
    return len(r.steps)


__all__ = ["Divergence", "first_divergence", "StepDecision"]


def expected_reason(ours: RunResult, d: Divergence, priorities: dict[str, int]) -> str | None:
    """The EXPECTED_DIFFERENCES entry a divergence follows from, if any: here, two running
    requests of equal priority preempted in one step before it (their re-queue order differs), or a
    request no admission takes, rejected at arrival here and waited for forever by SGLang."""
    if ours.never_admitted:
        return f"never admitted, rejected at arrival: {', '.join(ours.never_admitted[:3])}"
    for step in ours.steps[: d.step + 1]:
        if step.mode != "decode" and len(step.retracted) > 1:
            prios = [priorities[r] for r in step.retracted]
            if len(set(prios)) < len(prios):
                return "equal-priority requests preempted together re-queue in another order"
    return None
