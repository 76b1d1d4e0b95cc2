"""testbed calibrate's second half: a profile fitted to what calibrate.py measured.

The CPU cost of each loop stage (base + per request + per token), the forward models fitted to
the grid's forwards and to those the replays ran in place (a replayed forward far slower than
the first fit says was starved of the cores, and is left out), how much slower a forward runs
beside the CPU stages with overlap, and every fit's error on what it did not see.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from simulator.profiles import profile_fit as pf

OUTLIER_RATIO = 3.0


def fit_cpu_stages(cpu: list[dict]) -> tuple[dict, dict]:
    """base + per request + per token for each stage, and the error of each stage's total."""
    fitted, errors = {}, {}
    for stage in ("schedule", "launch", "process"):
        rows = [m for m in cpu if m["stage"] == stage]
        x = [[1.0, m["num_reqs"], m["num_tokens"]] for m in rows]
        t = [m["seconds"] for m in rows]
        fitted[stage] = pf.fit(pf.CPU_FEATURES, x, t, relative=False).to_dict()
        f = pf.LinearFit.from_dict(pf.CPU_FEATURES, fitted[stage])
        # A stage's total over a run is what the simulator must get right.
        errors[stage] = abs(sum(f.predict(xi) for xi in x) - sum(t)) / sum(t) if t else None
    return fitted, errors


def step_pricer(fitted: dict) -> Callable[[dict], float]:
    """What the fitted forward models say a replayed forward (a steps.parquet row) takes."""
    ext = pf.LinearFit.from_dict(pf.EXTEND_FEATURES, fitted["extend"])
    dec = pf.LinearFit.from_dict(pf.DECODE_FEATURES, fitted["decode"])
    knee = fitted["extend"]["knee"]

    def price(m: dict) -> float:
        if m["mode"] == "decode":
            return dec.predict(pf.decode_features(m["batch_size"], m["prefix_tokens"] + m["num_tokens"], m["max_seq_len"]))
        return ext.predict(pf.extend_step_features(m["batch_size"], m["num_tokens"], m["prefix_tokens"], m["attention_pairs"], knee))

    return price


def priced_forwards(fitted: dict, forwards: list[dict], kind: str) -> list[tuple[float, float, dict]]:
    """(measured, predicted, row) of the replayed forwards of one mode, starved outliers
    (OUTLIER_RATIO x the median measured/predicted ratio) left out."""
    price = step_pricer(fitted)
    rows = [(m["seconds"], price(m), m) for m in forwards if (m["mode"] == "decode") == (kind == "decode")]
    rows = [(t, q, m) for t, q, m in rows if q > 0]
    if not rows:
        return []
    median = float(np.median([t / q for t, q, _ in rows]))
    return [(t, q, m) for t, q, m in rows if t / q <= OUTLIER_RATIO * median]


def total_ratios(fitted: dict, forwards: list[dict]) -> dict[str, float]:
    """Per forward mode: measured total time / predicted total time of the replayed forwards."""
    out = {}
    for kind in ("extend", "decode"):
        kept = priced_forwards(fitted, forwards, kind)
        out[kind] = sum(t for t, _, _ in kept) / sum(q for _, q, _ in kept) if kept else 1.0
    return out


def overlap_model(fitted: dict, forwards: list[dict]) -> dict[str, dict[str, float]]:
    """Per forward mode, how much longer a forward of the overlapped replay took than the
    no-overlap fit says: fixed_s + per_req_s x batch size (least squares, non-negative).

    On a CPU the forward's thread competes with the loop's for the cores and the GIL:
    the loop's work for the other step (which grows with the batch) delays the forward
    by about its own length, whatever the forward's size. (A factor on the forward's time
    fitted the replay's small forwards as well, 1.42 for extends, but would add 42% to a
    2,000-token prefill, where the real Azure code runs took about 17% longer with overlap.)
    On a GPU both should be about 0."""
    out = {}
    for kind in ("extend", "decode"):
        kept = priced_forwards(fitted, forwards, kind)
        if len(kept) < 2:
            out[kind] = {"fixed_s": 0.0, "per_req_s": 0.0}
            continue
        fixed, per_req = pf.nnls(np.array([[1.0, m["batch_size"]] for _, _, m in kept]), np.array([t - q for t, q, _ in kept]))
        out[kind] = {"fixed_s": float(fixed), "per_req_s": float(per_req)}
    return out


def fit_profile(
    extend: list[dict],
    decode: list[dict],
    cpu: list[dict],
    insitu: list[dict] | None = None,
    overlap_cpu: list[dict] | None = None,
    overlap_forwards: list[dict] | None = None,
) -> tuple[dict, dict]:
    """Fit the forward models on the grid and the in-place forwards together, the CPU stages on the replay;
    with a replay under overlap, how much slower forwards and CPU stages are there."""
    insitu = insitu or []
    in_ext = [m for m in insitu if m["mode"] != "decode"]
    in_dec = [m for m in insitu if m["mode"] == "decode"]
    grid_batches = [([m["prefix_len"]] * m["batch_size"], [m["num_tokens"] // m["batch_size"]] * m["batch_size"]) for m in extend]
    grid_ext = [lambda knee, p=p, e=e: pf.extend_features(p, e, knee) for p, e in grid_batches]
    step_ext = [
        lambda knee, m=m: pf.extend_step_features(m["batch_size"], m["num_tokens"], m["prefix_tokens"], m["attention_pairs"], knee)
        for m in in_ext
    ]
    grid_dec = [pf.decode_features(m["batch_size"], m["sum_seq_len"], m["max_seq_len"]) for m in decode]
    step_dec = [pf.decode_features(m["batch_size"], m["prefix_tokens"] + m["num_tokens"], m["max_seq_len"]) for m in in_dec]
    grid_et, step_et = [m["median_s"] for m in extend], [m["seconds"] for m in in_ext]
    grid_dt, step_dt = [m["median_s"] for m in decode], [m["seconds"] for m in in_dec]

    def fit_both(step_keep_ext: list[int], step_keep_dec: list[int]):
        rows = grid_ext + [step_ext[i] for i in step_keep_ext]
        et = grid_et + [step_et[i] for i in step_keep_ext]
        extend_fit, knee = pf.fit_extend(rows, et)
        dx = grid_dec + [step_dec[i] for i in step_keep_dec]
        dt = grid_dt + [step_dt[i] for i in step_keep_dec]
        return extend_fit, knee, [row(knee) for row in rows], et, pf.fit(pf.DECODE_FEATURES, dx, dt, relative=True), dx, dt

    extend_fit, knee, ex, et, decode_fit, dx, dt = fit_both(list(range(len(in_ext))), list(range(len(in_dec))))
    # A replayed forward far slower than the first fit says (x OUTLIER_RATIO) was starved of the
    # cores by another process, not slowed by its shape: fit again without those.
    keep_ext = [i for i, row in enumerate(step_ext) if step_et[i] <= OUTLIER_RATIO * extend_fit.predict(row(knee))]
    keep_dec = [i for i, x in enumerate(step_dec) if step_dt[i] <= OUTLIER_RATIO * decode_fit.predict(x)]
    extend_fit, knee, ex, et, decode_fit, dx, dt = fit_both(keep_ext, keep_dec)
    fitted = {"extend": extend_fit.to_dict() | {"knee": knee}, "decode": decode_fit.to_dict(), "cpu": {}}
    errors = {
        "extend": pf.holdout_error(pf.EXTEND_FEATURES, ex, et, relative=True),
        "decode": pf.holdout_error(pf.DECODE_FEATURES, dx, dt, relative=True),
    }
    # The relative-error fit gives the shape; a step's noise is skewed (a forward is sometimes much
    # slower, never much faster), so it prices the typical forward, below the mean. A request's
    # TPOT is a mean over its steps, and a run's clock their sum: match the replay's total time.
    if insitu:
        level = total_ratios(fitted, insitu)
        for kind in ("extend", "decode"):
            fitted[kind] = {k: (v * level[kind] if k != "knee" else v) for k, v in fitted[kind].items()}
        errors["replay_level"] = level
    # How well the final fits price each of the replay's own forwards.
    for kind, rows, kept in (("extend", in_ext, keep_ext), ("decode", in_dec, keep_dec)):
        if rows:
            price = step_pricer(fitted)
            pred = [price(m) for m in rows]
            t = [m["seconds"] for m in rows]
            errs = [abs(q - ti) / ti for q, ti in zip(pred, t)]
            errors[f"replay_{kind}"] = {
                "points": len(t),
                "outliers": len(t) - len(kept),
                "median_rel_err": float(np.median(errs)),
                "total_rel_err": float(sum(pred) / sum(t) - 1),
            }
    fitted["cpu"], cpu_errors = fit_cpu_stages(cpu)
    errors |= {f"cpu_{stage}_total_rel_err": e for stage, e in cpu_errors.items()}
    if overlap_cpu:
        fitted["cpu_overlap"], _ = fit_cpu_stages(overlap_cpu)
    if overlap_forwards:
        fitted["overlap_forward"] = overlap_model(fitted, overlap_forwards)
    return fitted, errors
