"""The benchmark client that measured a point: which requests it sent, and which of them it averaged.

A measured point's mean TTFT and TPOT are the client's, over the requests it sent. Two clients made
the points of silicon_sample.csv, and they load a server differently:

- `inferencemax`: InferenceMAX's sweeps (SemiAnalysis; its benchmarks/benchmark_lib.sh runs
  utils/bench_serving/benchmark_serving.py, a copy of vLLM's): `--dataset-name random
  --random-range-ratio 0.8 --num-prompts 10 x CONC --max-concurrency CONC --ignore-eos`, after
  2 x CONC warm-up requests that finish before it starts. Each request's input and output lengths
  are drawn uniformly from [0.8 x L, L] (numpy, seed 0), so the clients, all sent at once, finish
  at different times and then send out of phase; the means are over all 10 x CONC requests, the
  first wave's included. Its shapes: 1,024 in / 1,024 out, 1,024 / 8,192 and 8,192 / 1,024.
- `fixed`: every request exactly `isl` in and `osl` out (AIConfigurator's gap-analysis jobs:
  aiperf through Dynamo, no length spread). With equal lengths the clients stay in synchronized
  waves; three are simulated (a warm-up, the measured wave, a trailing wave that keeps the load
  on while the measured wave decodes), and `--phase spread` starts the clients out of phase.

`auto` (the default) takes a point's `harness` column where its file has one, else InferenceMAX's
for InferenceMAX's shapes unless the point's silicon_data_source names a gap-analysis job
(`aic-auto-gap-analysis/...`), else `fixed`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from testbed.errors import ConfigError
from testbed.traces.schema import TraceRequest
from testbed.validate.points import HARNESSES, MeasuredPoint

INFERENCEMAX_SHAPES = {(1024, 1024), (1024, 8192), (8192, 1024)}  # its sweeps' (ISL, OSL)
INFERENCEMAX_RANGE_RATIO = 0.8  # --random-range-ratio of every InferenceMAX sweep (its workflows' configs)
INFERENCEMAX_PROMPTS_PER_CLIENT = 10  # --num-prompts $(( CONC * 10 ))
INFERENCEMAX_SEED = 0  # benchmark_serving.py's --seed default, before it draws the lengths
GAP_ANALYSIS_MARK = "gap-analysis"  # in silicon_data_source: a point of AIConfigurator's gap-analysis jobs (aic-auto-gap-analysis/...)
FIXED_WAVES = 3  # a warm-up wave, the measured wave, and a trailing wave


@dataclass(frozen=True)
class Workload:
    """What the client sends to the server, all at time 0 (the closed loop paces them), and which
    of the requests its means are over."""

    requests: list[TraceRequest]
    measured_rids: frozenset[str]


def harness_of(p: MeasuredPoint, choice: str = "auto") -> str:
    """The harness that measured p: `choice` unless it is auto (see the module's docstring)."""
    if choice != "auto":
        return choice
    named = p.row.get("harness", "").lower()  # checked when the file was read (points.py)
    if named:
        return named
    gap_analysis = GAP_ANALYSIS_MARK in p.row.get("silicon_data_source", "")
    return "inferencemax" if (p.isl, p.osl) in INFERENCEMAX_SHAPES and not gap_analysis else "fixed"


def simulated_tokens(p: MeasuredPoint, harness: str) -> int:
    """Output tokens the simulation of p generates: what its run time grows with."""
    per_client = INFERENCEMAX_PROMPTS_PER_CLIENT if harness == "inferencemax" else FIXED_WAVES
    return per_client * (p.concurrency or 1) * p.osl


def workload(p: MeasuredPoint, harness: str, out_of_phase: bool = False) -> Workload:
    """The requests `harness` sends for p, at p's concurrency."""
    c = p.concurrency or 1
    if harness == "inferencemax":
        n = INFERENCEMAX_PROMPTS_PER_CLIENT * c
        draw = np.random.RandomState(INFERENCEMAX_SEED)
        # benchmark_serving's sample_uniform: randint(int(L x ratio), L + 1), inputs first, then outputs
        inputs = draw.randint(int(p.isl * INFERENCEMAX_RANGE_RATIO), p.isl + 1, size=n)
        outputs = draw.randint(int(p.osl * INFERENCEMAX_RANGE_RATIO), p.osl + 1, size=n)
        requests = [TraceRequest(0.0, int(i), int(o), rid=f"r{k}") for k, (i, o) in enumerate(zip(inputs, outputs))]
        return Workload(requests, frozenset(r.rid for r in requests))
    if harness != "fixed":
        raise ConfigError(f"harness {harness!r} is not one of {', '.join(HARNESSES)}")
    # --phase spread: the warm-up wave's k-th request generates osl x (k + 1) / c tokens, so the
    # clients run out of phase from the measured wave on
    warm_up_osl = (lambda k: max(1, p.osl * (k + 1) // c)) if out_of_phase else (lambda k: p.osl)
    warm_up = [TraceRequest(0.0, p.isl, warm_up_osl(k), rid=f"warm-up-{k}") for k in range(c)]
    measured = [TraceRequest(0.0, p.isl, p.osl, rid=f"r{k}") for k in range((FIXED_WAVES - 2) * c)]
    trailing = [TraceRequest(0.0, p.isl, p.osl, rid=f"trailing-{k}") for k in range(c)]
    return Workload(warm_up + measured + trailing, frozenset(r.rid for r in measured))
