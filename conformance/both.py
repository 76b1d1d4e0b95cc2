"""python3 -m conformance.both: both oracles, one after the other, and their total (`make conformance`).

Each oracle runs in its own environment: SGLang's scheduler (`python -m conformance`, in
.conformance-venv) and vLLM's (`python -m conformance.vllm_main`, in .conformance-vllm-venv), with
the same arguments (--seed, --scenarios). Their output passes through as it comes; each ends
with its own line, `conformance sglang 0.5.23: N scenarios, S steps, D divergences` and
`conformance vllm 0.19.0: ...`, and this prints the total last:
`conformance: N scenarios, S steps, D divergences`. Exit code 1 when an oracle found a divergence
or failed. Standard library only: it runs on the system Python, outside both environments.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

SUMMARY = re.compile(r"^conformance (\S+) (\S+): (\d+) scenarios, (\d+) steps, (\d+) divergences$")


def run_oracle(python: str, module: str, args: list[str]) -> tuple[int, tuple[int, int, int] | None]:
    """Run one oracle, passing its output through; its exit code and summary (None if it printed none)."""
    summary = None
    with subprocess.Popen([python, "-m", module, *args], stdout=subprocess.PIPE, text=True, bufsize=1) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(line, end="", flush=True)
            m = SUMMARY.match(line.rstrip("\n"))
            if m:
                summary = (int(m[3]), int(m[4]), int(m[5]))
    return proc.returncode, summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m conformance.both", description=__doc__.splitlines()[0])
    p.add_argument("--sglang-python", required=True, help="the Python of SGLang's oracle environment")
    p.add_argument("--vllm-python", required=True, help="the Python of vLLM's oracle environment")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for both oracles (after --)")
    a = p.parse_args(argv)
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    totals, failed = [0, 0, 0], []
    for name, python, module in (("sglang", a.sglang_python, "conformance"), ("vllm", a.vllm_python, "conformance.vllm_main")):
        try:
            code, summary = run_oracle(python, module, args)
        except KeyboardInterrupt:
            print(f"\nconformance: interrupted during the {name} oracle", file=sys.stderr)
            return 130
        except OSError as e:
            print(f"conformance: the {name} oracle did not start ({python}: {e.strerror or e})", file=sys.stderr)
            return 2
        if summary is None:
            failed.append(f"{name} (exit code {code}, no summary line)")
            continue
        totals = [t + s for t, s in zip(totals, summary)]
        if code not in (0, 1):
            failed.append(f"{name} (exit code {code})")
    print(f"conformance: {totals[0]} scenarios, {totals[1]} steps, {totals[2]} divergences")
    if failed:
        print(f"conformance: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 1 if totals[2] else 0


if __name__ == "__main__":
    sys.exit(main())
