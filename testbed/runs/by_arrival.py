"""Two runs compared group by group of arrivals: where in a run the simulator drifts.

A whole-run mean hides where its error comes from. On the ground-truth run of `../shared`
(Llama-3.1-8B on an RTX PRO 6000, 300 requests at 10.3 a second) the simulated TPOT is 2.9% short
on the whole, but 6-7% short for the requests that run through the ramp-up and the drain and 1-2%
for those of the saturated middle, and each group's TTFT error follows the queue that drift
builds (docs/accuracy.md). `testbed compare --by-arrival K` prints that table for any two runs:
the requests both runs finished, in A's arrival order, cut into K groups of consecutive arrivals
(as equal as K divides them), each with its mean TTFT and TPOT in A and B and their relative error.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from testbed.runs.compare import rel_err
from testbed.runs.folder import Run
from testbed.runs.metrics import tpot_per_request, ttft_start


@dataclass(frozen=True)
class ArrivalGroup:
    first: int  # 1-based arrival rank (A's order, among the requests both runs finished) of its first request
    last: int  # ... and of its last
    from_s: float  # A's arrival of its first request, seconds after A's first arrival
    ttft_ms: tuple[float | None, float | None]  # mean TTFT in A and in B
    tpot_ms: tuple[float | None, float | None]  # mean TPOT in A and in B (None: no request of it made two tokens)

    @property
    def ttft_err(self) -> float | None:
        return rel_err(*self.ttft_ms)

    @property
    def tpot_err(self) -> float | None:
        return rel_err(*self.tpot_ms)


def _finished(run: Run, basis: str) -> pd.DataFrame:
    """rid, arrival, TTFT and TPOT (seconds; TPOT NaN for a one-token request) of the run's finished requests."""
    r = run.requests
    if "queued" not in r.columns:
        r = r.assign(queued=np.nan)
    r = r[r["status"] == "finished"]
    first_token = r["first_token"].to_numpy(np.float64)
    tpot = tpot_per_request(first_token, r["finish"].to_numpy(np.float64), r["output_tokens"].to_numpy(np.int64))
    return pd.DataFrame(
        {
            "rid": r["rid"].to_numpy(),
            "arrival": r["arrival"].to_numpy(np.float64),
            "ttft": first_token - ttft_start(r, basis),
            "tpot": tpot,
        }
    )


def _mean_ms(values: np.ndarray) -> float | None:
    values = values[~np.isnan(values)]
    return float(values.mean() * 1e3) if len(values) else None


def by_arrival(a: Run, b: Run, groups: int, basis: str) -> list[ArrivalGroup]:
    """The requests both runs finished (matched by rid), in A's arrival order, in `groups` groups of
    consecutive arrivals (fewer when fewer requests); TTFT from `basis` (compare.ttft_basis)."""
    both = _finished(a, basis).merge(_finished(b, basis), on="rid", suffixes=("_a", "_b"))
    both = both.sort_values(["arrival_a", "rid"], kind="stable").reset_index(drop=True)
    if both.empty:
        return []
    t0 = float(both["arrival_a"].iloc[0])
    out = []
    for rows in np.array_split(np.arange(len(both)), min(groups, len(both))):
        g = both.iloc[rows]
        # A request with one token has no TPOT in either run: both means leave it out.
        multi = g[g["tpot_a"].notna() & g["tpot_b"].notna()]
        out.append(
            ArrivalGroup(
                first=int(rows[0]) + 1,
                last=int(rows[-1]) + 1,
                from_s=float(g["arrival_a"].iloc[0]) - t0,
                ttft_ms=(_mean_ms(g["ttft_a"].to_numpy()), _mean_ms(g["ttft_b"].to_numpy())),
                tpot_ms=(_mean_ms(multi["tpot_a"].to_numpy()), _mean_ms(multi["tpot_b"].to_numpy())),
            )
        )
    return out


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}" if abs(v) >= 100 else f"{v:.2f}"


def _err(e: float | None) -> str:
    return "-" if e is None else f"{e * 100:+.1f}%"


def format_by_arrival(groups: list[ArrivalGroup]) -> str:
    """The table compare prints under --by-arrival."""
    if not groups:
        return "by arrival: no request finished in both runs"
    n = groups[-1].last
    lines = [f"by arrival: the {n:,} requests both runs finished, in A's arrival order, in {len(groups)} groups"]
    header = f"{'requests':<13}{'from (s)':>9}{'TTFT A':>11}{'TTFT B':>11}{'rel. err':>10}{'TPOT A':>9}{'TPOT B':>9}{'rel. err':>10}"
    lines += [header, "-" * len(header)]
    for g in groups:
        lines.append(
            f"{f'{g.first}-{g.last}':<13}{g.from_s:>9.1f}{_ms(g.ttft_ms[0]):>11}{_ms(g.ttft_ms[1]):>11}{_err(g.ttft_err):>10}"
            f"{_ms(g.tpot_ms[0]):>9}{_ms(g.tpot_ms[1]):>9}{_err(g.tpot_err):>10}"
        )
    lines.append("(TTFT and TPOT: each group's mean, ms)")
    return "\n".join(lines)


def to_json(groups: list[ArrivalGroup]) -> list[dict]:
    return [
        {
            "requests": [g.first, g.last],
            "from_s": g.from_s,
            "mean_ttft_ms": {"a": g.ttft_ms[0], "b": g.ttft_ms[1], "rel_err": g.ttft_err},
            "mean_tpot_ms": {"a": g.tpot_ms[0], "b": g.tpot_ms[1], "rel_err": g.tpot_err},
        }
        for g in groups
    ]
