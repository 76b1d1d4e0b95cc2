"""Run folders kept as they were written: the regression net for changes that must not change results.

tests/golden/<name>/ holds what `testbed <command>` wrote for each entry of GOLDEN_COMMANDS
(run.json, requests.parquet, steps.parquet; for a sweep also sweep.parquet and its points).
tests/test_golden_runs.py runs the same commands again and compares every table and
every run.json field (except the package versions).

A change that is meant to change results (a scheduler fix, a new cost) writes them again:

    .venv/bin/python tests/golden_runs.py      # from the repository root

and says so in its commit message.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOLDEN_DIR = REPO / "tests" / "golden"

# name -> testbed arguments; "{out}" is the run folder (or sweep folder) to write.
# Small, but each takes a branch a reader would worry about: a radix cache under lpm,
# chunked prefill, retraction (the KV pool is tight), page size 16, overlap on and off.
GOLDEN_COMMANDS: dict[str, list[str]] = {
    "replay-lpm-chunked-retract": [
        "replay",
        "traces/a.json",
        "--mode",
        "sim",
        "--max-requests",
        "40",
        "--policy",
        "lpm",
        "--chunked-prefill-size",
        "256",
        "--kv-tokens",
        "5000",
        "--out",
        "{out}",
        "-q",
    ],
    "sweep-overlap-page-size": [
        "sweep",
        "traces/a.json",
        "--max-requests",
        "20",
        "--grid",
        "overlap=on,off",
        "--grid",
        "page-size=16",
        "--workers",
        "1",
        "--out",
        "{out}",
        "-q",
    ],
}
VOLATILE = ("wall.json",)  # when it ran and how long it took: differs between any two runs


def run_command(name: str, out: Path) -> subprocess.CompletedProcess:
    args = [a.replace("{out}", str(out)) for a in GOLDEN_COMMANDS[name]]
    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def write_golden() -> None:
    for name in GOLDEN_COMMANDS:
        out = GOLDEN_DIR / name
        shutil.rmtree(out, ignore_errors=True)
        proc = run_command(name, out)
        if proc.returncode != 0:
            sys.exit(f"{name}: exit {proc.returncode}\n{proc.stderr}")
        for f in out.rglob("*"):
            if f.name in VOLATILE:
                f.unlink()
        print(f"wrote {out.relative_to(REPO)}")


if __name__ == "__main__":
    write_golden()
