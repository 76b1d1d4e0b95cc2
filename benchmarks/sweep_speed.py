"""Sweep speed: a 24-point `testbed sweep` over the Azure LLM code trace, on local processes.

    .venv/bin/python benchmarks/sweep_speed.py                      # whole trace, 1 then 2 workers
    .venv/bin/python benchmarks/sweep_speed.py --workers 1 2 4 --max-requests 2000

The grid is the issue's example: policy fcfs,lpm x chunked_prefill_size 2048,8192 x
overlap on,off x time_scale 0.5,1,2 (Llama-3.1-8B on an H100, simulated). Each run is the
CLI as a user runs it; the script prints its wall time, the sum of the points' own replay
times (wall_s in sweep.parquet), the speedup over the first worker count, and checks that
every worker count gave the same metrics.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from testbed.studies.sweep import load_sweep  # noqa: E402

AZURE = REPO.parent / "shared" / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
GRID = ["policy=fcfs,lpm", "chunked_prefill_size=2048,8192", "overlap=on,off", "time_scale=0.5,1,2"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(AZURE))
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--max-requests", type=int, default=None, help="default: the whole trace")
    args = ap.parse_args()
    if not Path(args.trace).is_file():
        print(f"trace {args.trace} not found", file=sys.stderr)
        return 1
    cap = ["--max-requests", str(args.max_requests)] if args.max_requests else []
    grid = [x for axis in GRID for x in ("--grid", axis)]
    tables = {}
    print(f"trace {args.trace}{f' (first {args.max_requests} requests)' if args.max_requests else ''}; grid {' x '.join(GRID)}")
    # Other work on the machine slows the parallel run most: say how busy it was.
    print(f"{os.cpu_count()} CPUs; load average before: {os.getloadavg()[0]:.2f}")
    print(f"{'workers':>7}  {'points':>6}  {'wall s':>8}  {'sum of replays s':>16}  {'speedup':>7}  {'load avg after':>14}")
    first_wall = None
    for workers in args.workers:
        out = Path(tempfile.mkdtemp(prefix=f"sweep-speed-{workers}-"))
        try:
            start = time.perf_counter()
            cmd = [
                sys.executable,
                "-m",
                "testbed.cli",
                "sweep",
                args.trace,
                *grid,
                *cap,
                "--workers",
                str(workers),
                "--out",
                str(out / "s"),
                "-q",
            ]
            proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
            wall = time.perf_counter() - start
            if proc.returncode != 0:
                print(proc.stdout + proc.stderr, file=sys.stderr)
                return 1
            df, _ = load_sweep(out / "s")
        finally:
            shutil.rmtree(out, ignore_errors=True)
        first_wall = first_wall or wall
        tables[workers] = df.drop(columns="wall_s")
        print(
            f"{workers:>7}  {len(df):>6}  {wall:>8.1f}  {df['wall_s'].sum():>16.1f}  {first_wall / wall:>6.2f}x"
            f"  {os.getloadavg()[0]:>14.2f}",
            flush=True,
        )
    base = tables[args.workers[0]]
    same = all(t.equals(base) for t in tables.values())
    print(f"same metrics for every worker count: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
