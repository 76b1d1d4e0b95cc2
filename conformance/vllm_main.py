"""python -m conformance.vllm_main: lockstep differential test of our VllmScheduler against vLLM's own.

Runs in the vLLM oracle environment (bash conformance/vllm_recipe.sh builds it), from the repo
root. Draws --scenarios random scenarios from --seed, runs each through vLLM 0.19.0's v1
Scheduler (AsyncScheduler with async scheduling) and through ours on a logical clock, compares
every step (scheduled requests and token counts, preemptions in order, finishes, free blocks,
prefix-cache hits, running and waiting counts), prints each divergent scenario (the first in
full: its JSON, the step, both decisions; --show-all prints every one so) and ends with
`conformance vllm 0.19.0: N scenarios, S steps, D divergences`. Exit code 1 when D > 0.
--scenario FILE reruns one scenario (the JSON a divergence prints).
"""

from __future__ import annotations

import os
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    # vLLM's block hashes (and so its prefix hits) must not depend on the process: fix the seed
    # before Python starts, as vLLM's own launcher would need.
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable, "-m", "conformance.vllm_main", *sys.argv[1:]])

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

from conformance.vllm_compare import EXPECTED_DIFFERENCES, classify, first_divergence  # noqa: E402
from conformance.vllm_ours import run_ours  # noqa: E402
from conformance.vllm_scenario import VLLM_VERSION, VllmScenario, random_scenario  # noqa: E402

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
PROGRESS_EVERY_S = 10.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m conformance.vllm_main", description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0, help="seed of the scenario generator (default %(default)s)")
    p.add_argument("--scenarios", type=int, default=300, help="how many random scenarios (default %(default)s)")
    p.add_argument("--scenario", type=Path, default=None, help="run this one scenario (a JSON file, as a divergence prints it)")
    p.add_argument(
        "--async",
        dest="async_mode",
        choices=("random", "on", "off"),
        default="random",
        help="async scheduling of the scenarios (default: drawn per scenario)",
    )
    p.add_argument("--show-all", action="store_true", help="print every divergence in full, not only the first")
    p.add_argument("--trace", action="store_true", help="print both runs step by step (with --scenario)")
    p.add_argument("--save-divergences", type=Path, default=None, help="write each divergent scenario's JSON into this folder")
    p.add_argument("--list-expected", action="store_true", help="print the differences kept on purpose, and exit")
    args = p.parse_args(argv)
    if args.list_expected:
        for d in EXPECTED_DIFFERENCES:
            print(f"- {d}")
        return 0

    if args.scenario is not None:
        try:
            scenarios = [VllmScenario.from_json(args.scenario.read_text())]
        except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError) as e:
            print(f"python -m conformance.vllm_main: error: --scenario {args.scenario}: {e}", file=sys.stderr)
            return EXIT_USAGE
    else:
        rng = random.Random(args.seed)
        mode = {"random": None, "on": True, "off": False}[args.async_mode]
        scenarios = [random_scenario(rng, i, async_scheduling=mode) for i in range(args.scenarios)]

    start = time.perf_counter()
    from conformance.vllm_oracle import VLLM_VERSION as installed  # imports vLLM (~10 s)
    from conformance.vllm_oracle import run_vllm

    if installed != VLLM_VERSION:
        print(f"warning: the oracle environment has vllm {installed}, the harness follows {VLLM_VERSION}", file=sys.stderr)
    print(
        f"conformance against vllm {installed}: {len(scenarios)} scenarios (seed {args.seed}); import {time.perf_counter() - start:.1f} s",
        flush=True,
    )
    if args.save_divergences is not None:
        args.save_divergences.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    next_line = start + PROGRESS_EVERY_S
    steps = divergent = 0
    kinds: dict[str, int] = {}
    try:
        for done, sc in enumerate(scenarios, 1):
            try:
                theirs = run_vllm(sc)
                ours = run_ours(sc)
            except Exception:  # a crash on either side is a divergence of its own
                divergent += 1
                print(f"\ncrash: scenario {sc.name}\nscenario: {sc.to_json()}\n{traceback.format_exc()}", flush=True)
                continue
            steps += len(theirs.steps)
            if args.trace:
                print_trace(ours, theirs)
            d = first_divergence(ours, theirs)
            if d is not None:
                divergent += 1
                kind = classify(d, ours)
                kinds[kind] = kinds.get(kind, 0) + 1
                if divergent == 1 or args.show_all:
                    print(
                        f"\n{'first divergence' if divergent == 1 else 'divergence'}: scenario {sc.name}, step {d.step} ({d.what}) [{kind}]"
                    )
                    print("scenario:", sc.to_json())
                    print("ours:", json.dumps(d.ours))
                    print("vllm:", json.dumps(d.vllm), flush=True)
                else:
                    print(f"divergence: scenario {sc.name}, step {d.step} ({d.what}) [{kind}]", flush=True)
                if args.save_divergences is not None:
                    (args.save_divergences / f"{sc.name}.json").write_text(sc.to_json() + "\n")
            now = time.perf_counter()
            if now >= next_line and done < len(scenarios):
                next_line = now + PROGRESS_EVERY_S
                print(f"  {done}/{len(scenarios)} scenarios, {divergent} divergences, {now - start:.0f} s", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print(f"\ninterrupted: {divergent} divergences so far", file=sys.stderr)
        return EXIT_INTERRUPTED
    tally = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    print(f"({time.perf_counter() - start:.1f} s{'; divergences by likely cause: ' + tally if tally else ''})")
    print(f"conformance vllm {VLLM_VERSION}: {len(scenarios)} scenarios, {steps} steps, {divergent} divergences")
    return 1 if divergent else 0


def print_trace(ours, theirs) -> None:
    """Both runs step by step; a '!' marks the steps whose records differ."""
    from conformance.vllm_scenario import FIELDS

    def line(st):
        if st is None:
            return "-"
        d = st.to_dict()
        reqs = " ".join(f"{r}:{n}" for r, n in d.pop("reqs"))
        return f"[{reqs}] " + " ".join(f"{k}={d[k]}" for k in FIELDS[1:])

    for i in range(max(len(ours.steps), len(theirs.steps))):
        a = ours.steps[i] if i < len(ours.steps) else None
        b = theirs.steps[i] if i < len(theirs.steps) else None
        same = a is not None and b is not None and all(getattr(a, f) == getattr(b, f) for f in FIELDS)
        mark = " " if same else "!"
        print(f"{mark}{i:4d} ours {line(a)}")
        if mark == "!":
            print(f"      vllm {line(b)}")
    print("outputs ours:", ours.outputs, "error:", ours.error)
    print("outputs vllm:", theirs.outputs, "error:", theirs.error)


if __name__ == "__main__":
    sys.exit(main())
