"""Run folders for the dashboard tests: sim replays of a small generated trace, made by the test session."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import numpy as np

from testbed.options import ReplayOptions
from testbed.replay import replay
from testbed.traces.gen import GenConfig, generate_trace

# Shared system prompts (a cache hit rate above 0), enough load to batch.
TRACE = GenConfig(
    num_requests=50, rate=8.0, input_len="uniform:50,400", output_len="uniform:10,80", system_prompts=2, shared_fraction=0.8, seed=3
)
# Everything at once, outputs beyond the 4096 tokens admission reserves for each, a KV pool
# that admits two at a time but cannot finish two: decode must retract.
BURST = GenConfig(num_requests=6, rate=1000.0, input_len="uniform:10,60", output_len="uniform:4500,6000", seed=0)
RUNS = {  # name -> options, replays of TRACE
    "sim-fcfs": ReplayOptions(),
    "sim-lpm": ReplayOptions(policy="lpm"),
    "sim-no-overlap": ReplayOptions(overlap=False),
}
RETRACT = "sim-retract"  # a replay of BURST
INCOMPLETE = "sim-incomplete"
BROKEN = "broken"  # a copy of a run whose run.json is not JSON
NOT_A_RUN = "not-a-run"  # a folder without run.json


def make_trace(path: Path) -> Path:
    generate_trace(TRACE).write(path)
    return path


def make_runs(runs_dir: Path, trace: Path) -> dict[str, Path]:
    """Every run of RUNS, one that retracts, an interrupted one, a broken one and a stray folder, under runs_dir."""
    out = {}
    for name, opts in RUNS.items():
        out[name] = replay(str(trace), opts, out=runs_dir / name).run_dir
    burst = generate_trace(BURST)
    burst_path = trace.with_name("burst.json")
    burst.write(burst_path)
    kv = 2 * (max(r.input_len for r in burst.requests) + 1 + 4096) + 64
    out[RETRACT] = replay(str(burst_path), ReplayOptions(kv_tokens=kv), out=runs_dir / RETRACT).run_dir

    def interrupt(p) -> None:
        if p.done >= 10:
            raise KeyboardInterrupt  # what Ctrl-C does to a replay

    try:
        replay(str(trace), ReplayOptions(), out=runs_dir / INCOMPLETE, progress=interrupt)
    except KeyboardInterrupt:
        pass
    out[INCOMPLETE] = runs_dir / INCOMPLETE
    shutil.copytree(out["sim-fcfs"], runs_dir / BROKEN)
    (runs_dir / BROKEN / "run.json").write_text('{"status": "complete", "summary": ')
    out[BROKEN] = runs_dir / BROKEN
    (runs_dir / NOT_A_RUN).mkdir()
    (runs_dir / NOT_A_RUN / "notes.txt").write_text("not a run\n")
    out[NOT_A_RUN] = runs_dir / NOT_A_RUN
    return out


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())["summary"]


def status(run_dir: Path) -> str:
    return json.loads((run_dir / "run.json").read_text())["status"]


def plotly_array(value) -> list:
    """A figure's array as the browser gets it: plotly sends numpy arrays as base64 typed arrays."""
    if isinstance(value, dict) and "bdata" in value:
        a = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        return a.reshape([int(n) for n in str(value.get("shape", len(a))).split(",")]).tolist()
    return value
