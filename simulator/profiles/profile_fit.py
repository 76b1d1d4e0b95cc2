"""Fitting a calibrated profile: roofline-shaped linear models by non-negative least squares.

Forward time of an extend batch is modelled as
    t = fixed + per_token * new tokens + per_pair * causal attention pairs
        + per_req * requests + per_kv * prefix tokens read
        + per_pair_knee * sum over requests of max(0, pairs - knee)
(past a knee, chosen by the fit, an attention that materializes every
query-key score, as the torch backend does per request, spills out of the CPU
caches and costs more per pair) and of a decode batch as
    t = fixed + per_req * requests + per_kv * tokens attended + per_padded_kv * requests * longest,
the terms of a roofline (fixed launch cost, compute in tokens and attention
work, memory in KV bytes), with coefficients >= 0 so that the fit extrapolates
sanely past the measured grid. Every feature can be computed from a step of a
run (steps.parquet) as well as from a plan, so the fit takes forwards timed in
a real replay beside the synthetic grid (for a step of several extend requests
the knee term assumes its pairs were spread evenly over them). Forward fits
minimize relative error (each row weighted by 1/t), as the simulator's error is
judged relatively. CPU stages are base + per request + per token, fitted on
absolute error (their mean is what adds up over a run).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

EXTEND_FEATURES = ("fixed", "per_token", "per_pair", "per_req", "per_kv", "per_pair_knee")
KNEE_CANDIDATES = (0.0, 5e4, 1.25e5, 2.5e5, 5e5, 1e6, 2e6)
DECODE_FEATURES = ("fixed", "per_req", "per_kv", "per_padded_kv")
CPU_FEATURES = ("base_s", "per_req_s", "per_token_s")


def extend_features(prefix_lens: list[int], extend_lens: list[int], knee: float) -> list[float]:
    tokens = pairs = over = 0.0
    for p, e in zip(prefix_lens, extend_lens):
        tokens += e
        a = e * (p + (e + 1) / 2)
        pairs += a
        if a > knee:
            over += a - knee
    return [1.0, tokens, pairs, float(len(extend_lens)), float(sum(prefix_lens)), over if knee > 0 else 0.0]


def extend_step_features(batch_size: int, num_tokens: int, prefix_tokens: int, attention_pairs: float, knee: float) -> list[float]:
    """extend_features from a step's totals (steps.parquet), its pairs taken as evenly spread."""
    over = batch_size * max(0.0, attention_pairs / batch_size - knee) if knee > 0 else 0.0
    return [1.0, float(num_tokens), float(attention_pairs), float(batch_size), float(prefix_tokens), over]


def decode_features(batch_size: float, sum_seq_len: float, max_seq_len: float) -> list[float]:
    # A backend that pads every request to the longest (torch's) reads batch x longest.
    return [1.0, batch_size, sum_seq_len, batch_size * max_seq_len]


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int = 500) -> np.ndarray:
    """min ||a x - b|| subject to x >= 0 (Lawson-Hanson active set)."""
    # Columns are rescaled to unit norm: features span many orders of magnitude.
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    a = a / scale
    n = a.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    for _ in range(max_iter):
        w = a.T @ (b - a @ x)
        if passive.all() or w[~passive].max(initial=-np.inf) <= 1e-12:
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
    return x / scale


@dataclass(frozen=True)
class LinearFit:
    names: tuple[str, ...]
    coef: tuple[float, ...]

    def predict(self, features: list[float]) -> float:
        return sum(c * f for c, f in zip(self.coef, features))

    def to_dict(self) -> dict[str, float]:
        return dict(zip(self.names, self.coef))

    @classmethod
    def from_dict(cls, names: tuple[str, ...], d: dict[str, float]) -> "LinearFit":
        return cls(names, tuple(float(d.get(n, 0.0)) for n in names))


def fit(names: tuple[str, ...], x: list[list[float]], t: list[float], relative: bool) -> LinearFit:
    a, b = np.asarray(x, dtype=float), np.asarray(t, dtype=float)
    if relative:
        w = 1.0 / b
        a, b = a * w[:, None], np.ones_like(b)
    return LinearFit(names, tuple(float(c) for c in nnls(a, b)))


def relative_errors(f: LinearFit, x: list[list[float]], t: list[float]) -> list[float]:
    return [abs(f.predict(xi) - ti) / ti for xi, ti in zip(x, t)]


def holdout_error(names: tuple[str, ...], x: list[list[float]], t: list[float], relative: bool, every: int = 4) -> dict:
    """Fit on all but every `every`-th point, report the error on those held out."""
    held = [i for i in range(len(t)) if i % every == every - 1]
    train = [i for i in range(len(t)) if i % every != every - 1]
    if len(held) == 0 or len(train) < len(names):
        return {"points": 0}
    f = fit(names, [x[i] for i in train], [t[i] for i in train], relative)
    errs = relative_errors(f, [x[i] for i in held], [t[i] for i in held])
    return {"points": len(held), "median_rel_err": float(np.median(errs)), "max_rel_err": float(np.max(errs))}


def fit_extend(batches: list[Callable[[float], list[float]]], t: list[float]) -> tuple[LinearFit, float]:
    """The extend fit and its knee: the candidate with the smallest mean relative error (not the
    median: the few long prefills past the knee are what the knee is for).

    Each batch is a function from a knee to its feature row (extend_features or
    extend_step_features with the rest bound)."""
    best = None
    for knee in KNEE_CANDIDATES:
        x = [features(knee) for features in batches]
        f = fit(EXTEND_FEATURES, x, t, relative=True)
        err = float(np.mean(relative_errors(f, x, t)))
        if best is None or err < best[0]:
            best = (err, f, knee)
    assert best is not None
    return best[1], best[2]
