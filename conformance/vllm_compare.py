"""Lockstep comparison of two runs of one vLLM scenario: the first step where they differ."""

from __future__ import annotations

from dataclasses import dataclass

from conformance.vllm_scenario import FIELDS, VllmRun

# Differences from vLLM 0.19.0 kept on purpose. None has shown in the random scenarios; each
# would show as a divergence (the harness does not excuse it), and this says why it is kept.
EXPECTED_DIFFERENCES = (
    "A running request that the priority policy preempts after it was scheduled in the same step "
    "(to make room for a request ahead of it) leaves no block in the prefix cache: ours caches a "
    "step's new full blocks after the running pass. vLLM caches them as it allocates them, so the "
    "preempted request's blocks stay cached though no forward computed their KV, and a later "
    "request that hits them would read KV that was never written.",
)


@dataclass
class Divergence:
    step: int  # index of the first differing step (or the length of the shorter run)
    what: str  # the fields that differ, or "length", "rejected", "error", "outputs"
    ours: object
    vllm: object


def _norm(v):
    if isinstance(v, list):
        return [tuple(x) if isinstance(x, (list, tuple)) else x for x in v]
    return v


def first_divergence(ours: VllmRun, theirs: VllmRun) -> Divergence | None:
    for i, (a, b) in enumerate(zip(ours.steps, theirs.steps)):
        diff = [f for f in FIELDS if _norm(getattr(a, f)) != _norm(getattr(b, f))]
        if diff:
            return Divergence(i, ",".join(diff), a.to_dict(), b.to_dict())
    n = min(len(ours.steps), len(theirs.steps))
    if len(ours.steps) != len(theirs.steps):
        extra = lambda r: r.steps[n].to_dict() if len(r.steps) > n else None  # noqa: E731
        return Divergence(n, "length", extra(ours), extra(theirs))
    if sorted(ours.rejected) != sorted(theirs.rejected):
        return Divergence(n, "rejected", sorted(ours.rejected), sorted(theirs.rejected))
    if _kind(ours.error) != _kind(theirs.error):
        return Divergence(n, "error", ours.error, theirs.error)
    if ours.outputs != theirs.outputs:
        keys = sorted(k for k in set(ours.outputs) | set(theirs.outputs) if ours.outputs.get(k) != theirs.outputs.get(k))
        return Divergence(n, "outputs", {k: ours.outputs.get(k) for k in keys}, {k: theirs.outputs.get(k) for k in keys})
    return None


def _kind(error: str | None) -> str | None:
    """Both stuck is agreement: the messages differ, the state does not."""
    return None if error is None else error.split(":")[0]


def classify(d: Divergence, ours: VllmRun | None = None) -> str:
    """A first guess at a divergence's cause, for the tally (each still wants a look):
    'eviction' when the two sides have evicted different numbers of cached blocks by then, or
    the prefix hits differ after evictions, 'kv accounting' when ours ends with blocks freed
    twice or lost, else 'other'."""
    if ours is not None and (ours.error or "").startswith("kv accounting"):
        return "kv accounting"
    if isinstance(d.ours, dict) and isinstance(d.vllm, dict):
        evicted_ours, evicted_vllm = d.ours.get("evicted", 0), d.vllm.get("evicted", 0)
        if evicted_ours != evicted_vllm:
            return "eviction"
        if "cache_hit_tokens" in d.what.split(",") and (evicted_ours or evicted_vllm):
            return "eviction"
    return "other"
