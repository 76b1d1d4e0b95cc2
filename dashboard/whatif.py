"""What-if: one trace, a grid of scheduler options, one simulated run folder per point.

Pure of Streamlit: the What-if page builds a WhatIfGrid from its widgets and
calls run_variants with a progress callback.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, fields, replace
from datetime import datetime
from pathlib import Path
from typing import Callable, Sequence

from testbed.errors import USER_ERRORS, ConfigError
from testbed.options import ReplayOptions, check_options
from testbed.replay import replay
from testbed.schedulers import scheduler_kind

MAX_VARIANTS = 24  # each is a whole replay; more is a sweep (`testbed sweep`), not a page


@dataclass(frozen=True)
class WhatIfGrid:
    """The values tried for each option; every combination is one run."""

    policies: tuple[str, ...] = ("fcfs",)
    schedulers: tuple[str, ...] = ("sglang",)
    chunk_sizes: tuple[int, ...] = (8192,)  # SGLang's chunked prefill size; vLLM's step token budget
    kv_tokens: tuple[int | None, ...] = (None,)  # None: from the model and the hardware (or the profile)
    overlaps: tuple[bool, ...] = (True,)
    load_scales: tuple[float, ...] = (1.0,)  # 2 = twice the arrival rate (time_scale 0.5)
    page_sizes: tuple[int, ...] = (1,)
    profiles: tuple[str | None, ...] = (None,)  # None: the roofline cost model

    def size(self) -> int:
        n = 1
        for f in fields(self):
            n *= max(1, len(getattr(self, f.name)))
        return n


@dataclass(frozen=True)
class Variant:
    label: str  # the options that vary, e.g. "lpm, chunk 2048, load x2"
    opts: ReplayOptions


@dataclass(frozen=True)
class VariantResult:
    variant: Variant
    run_dir: Path | None  # None: it did not start
    error: str | None = None


def parse_values(text: str, cast: Callable[[str], object], default: object = None) -> tuple:
    """'8192, 2048' -> (8192, 2048); an empty field or 'default' -> (default,). ValueError names the bad item."""
    items = [t for t in re.split(r"[,\s]+", text.strip()) if t]
    if not items:
        return (default,)
    out = []
    for item in items:
        if item.lower() == "default":
            out.append(default)
            continue
        try:
            out.append(cast(item))
        except ValueError:
            raise ValueError(f"not a number: {item!r}") from None
    return tuple(dict.fromkeys(out))  # keep order, drop repeats


def profile_model(profile: str) -> str:
    """The model a profile was calibrated for: a profiled variant runs that model (the cost model is its)."""
    try:
        return json.loads(Path(profile).read_text())["model"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"--profile {profile}: not a profile ({e})") from None


def _label(values: dict[str, object], varied: set[str]) -> str:
    parts = []
    for name, v in values.items():
        if name not in varied:
            continue
        if name in ("policy", "scheduler"):
            parts.append(str(v))
        elif name == "chunk":
            parts.append(f"chunk {v}")
        elif name == "kv":
            parts.append(f"kv {v if v is not None else 'default'}")
        elif name == "overlap":
            parts.append(f"overlap {'on' if v else 'off'}")
        elif name == "load":
            parts.append(f"load x{v:g}")
        elif name == "page":
            parts.append(f"page {v}")
        elif name == "profile":
            parts.append(f"profile {Path(v).stem}" if v else "roofline")
    return ", ".join(parts) or "base"


def variants(base: ReplayOptions, grid: WhatIfGrid) -> list[Variant]:
    """Every combination of the grid over the base options (mode sim), in grid order."""
    axes = {
        "policy": grid.policies,
        "scheduler": grid.schedulers,
        "chunk": grid.chunk_sizes,
        "kv": grid.kv_tokens,
        "overlap": grid.overlaps,
        "load": grid.load_scales,
        "page": grid.page_sizes,
        "profile": grid.profiles,
    }
    varied = {name for name, values in axes.items() if len(values) > 1}
    out = []
    for combo in itertools.product(*axes.values()):
        v = dict(zip(axes, combo))
        opts = replace(
            base,
            mode="sim",
            policy=v["policy"],
            scheduler=v["scheduler"],
            # "Chunk size" is the option that bounds a step's prompt tokens: SGLang's chunked prefill
            # size, vLLM's token budget.
            **{scheduler_kind(v["scheduler"]).chunk_option: v["chunk"]},
            kv_tokens=v["kv"],
            overlap=v["overlap"],
            time_scale=1.0 / v["load"],
            page_size=v["page"],
            profile=v["profile"],
            model=profile_model(v["profile"]) if v["profile"] else base.model,
        )
        out.append(Variant(_label(v, varied), opts))
    return out


def split_runnable(todo: Sequence[Variant]) -> tuple[list[Variant], list[tuple[Variant, str]]]:
    """The variants whose options can run, and the others with why (lpm with vLLM's scheduler):
    every combination is tried, and one that makes no sense is skipped, not run into an error."""
    ok, skipped = [], []
    for variant in todo:
        try:
            check_options(variant.opts)
        except ConfigError as e:
            skipped.append((variant, str(e)))
            continue
        ok.append(variant)
    return ok, skipped


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-").lower()


def run_dir_for(runs_dir: Path, trace: str, stamp: str, i: int, variant: Variant) -> Path:
    return runs_dir / f"whatif-{Path(trace).stem}-{stamp}-{i + 1:02d}-{_slug(variant.label)}"


def run_variants(
    trace: str,
    todo: Sequence[Variant],
    runs_dir: Path,
    progress: Callable[[int, int, int, int], None] | None = None,
) -> list[VariantResult]:
    """Replay the trace once per variant, each into its own run folder under runs_dir.
    progress(variant index, number of variants, requests done, requests in the trace).
    A variant whose options cannot run is reported and skipped; the others still run."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    results = []
    for i, variant in enumerate(todo):
        out = run_dir_for(runs_dir, trace, stamp, i, variant)
        report = (lambda p, i=i: progress(i, len(todo), p.done, p.total)) if progress else None
        try:
            result = replay(trace, variant.opts, out=out, progress=report)
        except USER_ERRORS as e:
            results.append(VariantResult(variant, out if out.exists() else None, str(e)))
            continue
        results.append(VariantResult(variant, result.run_dir))
    return results
