"""python -m conformance: lockstep differential test of our scheduler against SGLang's.

Runs in the oracle environment (`make conformance` builds it). Draws --scenarios random
scenarios from --seed, runs each through both schedulers, compares every step, prints each
divergent scenario (the first in full: its JSON, the step, both decisions) and ends with
`conformance: N scenarios, S steps, D divergences`. Exit code 1 when D > 0.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from conformance.compare import EXPECTED_DIFFERENCES, expected_reason, first_divergence
from conformance.ours import run_ours
from conformance.scenario import Scenario, random_scenario


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m conformance", description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0, help="seed of the scenario generator (default %(default)s)")
    p.add_argument("--scenarios", type=int, default=500, help="how many random scenarios (default %(default)s)")
    p.add_argument("--scenario", type=Path, default=None, help="run this one scenario (a JSON file, as a divergence prints it)")
    p.add_argument("--overlap", choices=("random", "on", "off"), default="random", help="overlap mode of the scenarios (default: drawn per scenario)")
    p.add_argument("--list-expected", action="store_true", help="print the differences kept on purpose, and exit")
    args = p.parse_args(argv)
    if args.list_expected:
        for d in EXPECTED_DIFFERENCES:
            print(f"- {d}")
        return 0

    from conformance.oracle import SGLANG_VERSION, run_sglang  # imports SGLang (~20 s)

    if args.scenario is not None:
        scenarios = [Scenario.from_json(args.scenario.read_text())]
    else:
        rng = random.Random(args.seed)
        overlap = {"random": None, "on": True, "off": False}[args.overlap]
        scenarios = [random_scenario(rng, i, overlap=overlap) for i in range(args.scenarios)]
    print(f"conformance against sglang {SGLANG_VERSION}: {len(scenarios)} scenarios (seed {args.seed})", flush=True)
    t0 = time.perf_counter()
    steps = 0
    divergent = 0
    expected = 0
    for sc in scenarios:
        theirs = run_sglang(sc)
        ours = run_ours(sc)
        steps += len(theirs.steps)
        d = first_divergence(ours, theirs)
        if d is None:
            continue
        reason = expected_reason(ours, d, {r.rid: r.priority for r in sc.requests})
        if reason is not None:
            expected += 1
            print(f"expected difference: scenario {sc.name}, step {d.step} ({reason})", flush=True)
            continue
        divergent += 1
        if divergent == 1:
            print(f"\nfirst divergence: scenario {sc.name}, step {d.step} ({d.what})")
            print("scenario:", sc.to_json())
            print("ours:  ", json.dumps(d.ours))
            print("sglang:", json.dumps(d.sglang), flush=True)
        else:
            print(f"divergence: scenario {sc.name}, step {d.step} ({d.what})", flush=True)
    print(f"({time.perf_counter() - t0:.1f} s; {expected} scenarios end in an expected difference, see --list-expected)")
    print(f"conformance: {len(scenarios)} scenarios, {steps} steps, {divergent} divergences")
    return 1 if divergent else 0


if __name__ == "__main__":
    sys.exit(main())
