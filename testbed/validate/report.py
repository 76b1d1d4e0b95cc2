"""What `testbed validate` prints and writes: per-group errors, the summary line, CSV and HTML."""

from __future__ import annotations

import csv
import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from testbed.validate.points import MeasuredPoint
from testbed.validate.recipes import server_recipe


@dataclass
class PointResult:
    point: MeasuredPoint
    skipped: str | None = None  # why the simulator did not run it
    sim_ttft_ms: float | None = None
    sim_tpot_ms: float | None = None
    kernels: str | None = None
    harness: str | None = None  # the benchmark client simulated (harness.py)
    sim_seconds: float | None = None  # wall time of its simulation (0 for a load simulated before)
    kernel_bound: float | None = None  # the kernels' least time for the load over the measured (kernel_bound.py)
    aic_ttft_ms: float | None = None
    aic_tpot_ms: float | None = None
    aic_note: str | None = None  # why AIConfigurator has no estimate, or which database it used

    def error(self, source: str, metric: str) -> float | None:
        """(estimate - measured) / measured; source sim or aic, metric ttft or tpot."""
        value = getattr(self, f"{source}_{metric}_ms")
        measured = getattr(self.point, f"{metric}_ms")
        if value is None or not math.isfinite(value):
            return None
        return (value - measured) / measured


@dataclass(frozen=True)
class ErrorStats:
    points: int
    median: float | None  # of the absolute relative error
    p90: float | None

    @classmethod
    def of(cls, errors: list[float | None]) -> "ErrorStats":
        a = np.abs([e for e in errors if e is not None])
        if not len(a):
            return cls(0, None, None)
        return cls(len(a), float(np.median(a)), float(np.percentile(a, 90)))


def stats(results: list[PointResult], source: str, metric: str) -> ErrorStats:
    return ErrorStats.of([r.error(source, metric) for r in results if r.skipped is None])


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:.1f}%"


GROUP_HEADER = (
    "system",
    "backend",
    "model",
    "precision",
    "points",
    "TTFT med",
    "TTFT p90",
    "TPOT med",
    "TPOT p90",
    "AIC TTFT med",
    "AIC TTFT p90",
    "AIC TPOT med",
    "AIC TPOT p90",
)


def group_rows(results: list[PointResult]) -> list[tuple[str, ...]]:
    """One row per (system, backend, model, precision) with simulated points: their errors, and AIConfigurator's."""
    groups: dict[tuple, list[PointResult]] = defaultdict(list)
    for r in results:
        if r.skipped is None:
            groups[r.point.group].append(r)
    rows = []
    for key in sorted(groups):
        rs = groups[key]
        figures = []
        for source in ("sim", "aic"):
            for metric in ("ttft", "tpot"):
                s = stats(rs, source, metric)
                figures += [pct(s.median), pct(s.p90)]
        rows.append((*key, str(len(rs)), *figures))
    return rows


def table(rows: list[tuple[str, ...]], header: tuple[str, ...], left: int = 4) -> str:
    """Columns padded to their widest cell; the first `left` aligned left, the figures right."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    return "\n".join([line(header), line(tuple("-" * w for w in widths)), *(line(r) for r in rows)])


def skip_counts(results: list[PointResult]) -> list[tuple[str, int]]:
    """Skipped points by what stops them (a reason's part before its colon: 'backend trtllm', 'disagg', ...), most first."""
    return Counter(r.skipped.split(": ")[0] for r in results if r.skipped).most_common()


def harness_line(results: list[PointResult]) -> str | None:
    """Which benchmark client each simulated point was replayed as (harness.py), so the reader
    knows what was assumed: 'simulated as the client of: inferencemax 896 points, fixed 297 points'."""
    counts = Counter(r.harness for r in results if r.skipped is None and r.harness)
    if not counts:
        return None
    return "simulated as the client of: " + ", ".join(f"{h} {n:,} point{'s' if n > 1 else ''}" for h, n in counts.most_common())


def faster_than_kernels_line(results: list[PointResult]) -> str | None:
    """How many points were measured faster than their kernels allow under any schedule, if any."""
    from testbed.validate.kernel_bound import BOUND_EXCEEDED

    past = [r for r in results if r.kernel_bound is not None and r.kernel_bound > BOUND_EXCEEDED]
    if not past:
        return None
    groups = Counter(f"{r.point.system} {r.point.backend} {r.point.model_path} {r.point.precision}" for r in past)
    where = ", ".join(f"{g} ({n})" for g, n in groups.most_common())
    n = f"{len(past)} point was" if len(past) == 1 else f"{len(past)} points were"
    return (
        f"faster than their kernels: {n} measured more than {BOUND_EXCEEDED - 1:.0%} faster than the "
        f"database's kernels allow under any schedule (kernel_bound in points.csv), so their error is in the kernels "
        f"or in what the measurement ran, not in the schedule: {where}"
    )


def summary_line(results: list[PointResult]) -> str:
    s = {(src, m): stats(results, src, m) for src in ("sim", "aic") for m in ("ttft", "tpot")}
    skipped = sum(1 for r in results if r.skipped)

    def figures(src: str) -> str:
        t, p = s[(src, "ttft")], s[(src, "tpot")]
        return f"TTFT median {pct(t.median)} p90 {pct(t.p90)}, TPOT median {pct(p.median)} p90 {pct(p.p90)}"

    return f"validate: {len(results)} points, {skipped} skipped, {figures('sim')} (AIConfigurator: {figures('aic')})"


CSV_COLUMNS = (
    "id",
    "line",
    "system",
    "backend",
    "backend_version",
    "model_path",
    "precision",
    "isl",
    "osl",
    "concurrency",
    "tp",
    "harness",
    "scheduler_recv_interval",
    "kv_cache_dtype",
    "server_flags",
    "recipe",
    "sim_seconds",
    "measured_ttft_ms",
    "measured_tpot_ms",
    "sim_ttft_ms",
    "sim_tpot_ms",
    "sim_ttft_err",
    "sim_tpot_err",
    "kernels",
    "kernel_bound",
    "aic_ttft_ms",
    "aic_tpot_ms",
    "aic_ttft_err",
    "aic_tpot_err",
    "aic_note",
    "skipped",
)


def write_csv(results: list[PointResult], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for r in results:
            p = r.point
            err = {f"{s}_{m}_err": r.error(s, m) for s in ("sim", "aic") for m in ("ttft", "tpot")}
            recipe = None if r.harness is None else server_recipe(p, r.harness)
            values = {
                "id": p.id,
                "line": p.line,
                "system": p.system,
                "backend": p.backend,
                "backend_version": p.backend_version,
                "model_path": p.model_path,
                "precision": p.precision,
                "isl": p.isl,
                "osl": p.osl,
                "concurrency": p.concurrency,
                "tp": p.tp,
                "harness": r.harness,
                "scheduler_recv_interval": None if recipe is None else recipe.scheduler_recv_interval,
                "kv_cache_dtype": None if recipe is None else recipe.kv_cache_dtype,
                "server_flags": None if recipe is None else recipe.flags(p.backend),  # the recipe's settings the replay took
                "recipe": None if recipe is None else recipe.source,
                "sim_seconds": None if r.sim_seconds is None else round(r.sim_seconds, 3),
                "measured_ttft_ms": p.ttft_ms,
                "measured_tpot_ms": p.tpot_ms,
                "sim_ttft_ms": r.sim_ttft_ms,
                "sim_tpot_ms": r.sim_tpot_ms,
                "kernels": r.kernels,
                "kernel_bound": None if r.kernel_bound is None else round(r.kernel_bound, 3),
                "aic_ttft_ms": r.aic_ttft_ms,
                "aic_tpot_ms": r.aic_tpot_ms,
                "aic_note": r.aic_note,
                "skipped": r.skipped,
            } | err
            w.writerow(["" if values[c] is None else values[c] for c in CSV_COLUMNS])


def write_html(results: list[PointResult], path: Path, title: str) -> None:
    """Sim (and AIConfigurator) against measured, log-log, one colour per system; the error table below."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    done = [r for r in results if r.skipped is None]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("mean TTFT (ms)", "mean TPOT (ms)"))
    palette = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
    systems = sorted({r.point.system for r in done})
    for k, system in enumerate(systems):
        rs = [r for r in done if r.point.system == system]
        colour = palette[k % len(palette)]
        for col, metric in ((1, "ttft"), (2, "tpot")):
            labels = [
                f"{r.point.model_path} {r.point.backend} {r.point.precision} tp{r.point.tp} "
                f"{r.point.isl}/{r.point.osl} c{r.point.concurrency}"
                for r in rs
            ]
            fig.add_trace(
                go.Scatter(
                    x=[getattr(r.point, f"{metric}_ms") for r in rs],
                    y=[getattr(r, f"sim_{metric}_ms") for r in rs],
                    mode="markers",
                    marker={"color": colour},
                    name=f"{system} sim",
                    legendgroup=f"{system} sim",
                    showlegend=col == 1,
                    text=labels,
                ),
                row=1,
                col=col,
            )
            fig.add_trace(
                go.Scatter(
                    x=[getattr(r.point, f"{metric}_ms") for r in rs],
                    y=[getattr(r, f"aic_{metric}_ms") for r in rs],
                    mode="markers",
                    marker={"color": colour, "symbol": "x", "opacity": 0.5},
                    name=f"{system} AIConfigurator",
                    legendgroup=f"{system} aic",
                    showlegend=col == 1,
                    text=labels,
                ),
                row=1,
                col=col,
            )
    values = [v for r in done for v in (r.point.ttft_ms, r.point.tpot_ms, r.sim_ttft_ms, r.sim_tpot_ms) if v and v > 0]
    lo, hi = (min(values) / 2, max(values) * 2) if values else (1, 1000)
    for col in (1, 2):
        fig.add_trace(
            go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", line={"color": "grey", "dash": "dot"}, name="equal", showlegend=col == 1),
            row=1,
            col=col,
        )
        fig.update_xaxes(type="log", title_text="measured", row=1, col=col)
        fig.update_yaxes(type="log", title_text="estimated", row=1, col=col)
    fig.update_layout(title=title, height=600)
    rows = group_rows(results)
    head = "".join(f"<th>{h}</th>" for h in GROUP_HEADER)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    skipped = "".join(f"<li>{reason}: {n}</li>" for reason, n in skip_counts(results))
    html = (
        f"<html><head><meta charset='utf-8'><title>{title}</title></head><body>"
        + fig.to_html(full_html=False, include_plotlyjs="inline")
        + f"<h3>Absolute relative error by group</h3><table border='1' cellspacing='0' cellpadding='3'><tr>{head}</tr>{body}</table>"
        + f"<h3>Skipped</h3><ul>{skipped}</ul><p>{faster_than_kernels_line(results) or ''}</p>"
        + f"<p><code>{summary_line(results)}</code></p></body></html>"
    )
    path.write_text(html)
