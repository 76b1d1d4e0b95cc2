"""python -m conformance: lockstep differential test of our scheduler against SGLang's.

Runs in the oracle environment (`make conformance` builds it). Draws --scenarios random
scenarios from --seed, runs each through both schedulers, compares every step, prints each
divergent scenario (the first in full: its JSON, the step, both decisions) and ends with
`conformance sglang 0.5.23: N scenarios, S steps, D divergences`. Exit code 1 when D > 0.
`make conformance` runs this and vLLM's oracle (conformance/both.py), and prints their total.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from conformance.compare import EXPECTED_DIFFERENCES, expected_reason, first_divergence
from conformance.ours import run_ours
from conformance.scenario import Scenario, random_scenario


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m conformance", description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0, help="seed of the scenario generator (default %(default)s)")
    p.add_argument("--scenarios", type=int, default=500, help="how many random scenarios (default %(default)s)")
    p.add_argument("--scenario", type=Path, default=None, help="run this one scenario (a JSON file, as a divergence prints it)")
    p.add_argument(
        "--overlap", choices=("random", "on", "off"), default="random", help="overlap mode of the scenarios (default: drawn per scenario)"
    )
    p.add_argument("--list-expected", action="store_true", help="print the differences kept on purpose, and exit")
    args = p.parse_args(argv)
    if args.list_expected:
        for d in EXPECTED_DIFFERENCES:
            print(f"- {d}")
        return 0

    if args.scenario is not None:
        try:
            scenarios = [Scenario.from_json(args.scenario.read_text())]
        except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError) as e:
            print(f"python -m conformance: error: --scenario {args.scenario}: {_reason(e)}", file=sys.stderr)
            return EXIT_USAGE
    else:
        rng = random.Random(args.seed)
        overlap = {"random": None, "on": True, "off": False}[args.overlap]
        scenarios = [random_scenario(rng, i, overlap=overlap) for i in range(args.scenarios)]

    tally = Tally(len(scenarios))
    try:
        from conformance.oracle import SGLANG_VERSION  # imports SGLang (~20 s)

        print(f"conformance against sglang {SGLANG_VERSION}: {len(scenarios)} scenarios (seed {args.seed})", flush=True)
        for sc in scenarios:
            check(sc, tally)
            tally.progress()
    except KeyboardInterrupt:
        print(f"\ninterrupted after {tally.done} of {tally.total} scenarios: {tally.divergent} divergences so far", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(f"({time.perf_counter() - tally.start:.1f} s; {tally.expected} scenarios end in an expected difference, see --list-expected)")
    print(f"conformance sglang {SGLANG_VERSION}: {len(scenarios)} scenarios, {tally.steps} steps, {tally.divergent} divergences")
    return 1 if tally.divergent else 0


EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
PROGRESS_EVERY_S = 10.0  # a line on stderr this often while scenarios run


def _reason(e: BaseException) -> str:
    if isinstance(e, OSError):
        return e.strerror or str(e)
    return f"not a scenario as a divergence prints it ({type(e).__name__}: {e})"


@dataclass
class Tally:
    total: int
    done: int = 0
    steps: int = 0
    divergent: int = 0
    expected: int = 0
    start: float = field(default_factory=time.perf_counter)
    _next_line: float = field(default_factory=lambda: time.perf_counter() + PROGRESS_EVERY_S)

    def progress(self) -> None:
        """A line now and then: a run of thousands of scenarios takes many minutes."""
        self.done += 1
        now = time.perf_counter()
        if now >= self._next_line and self.done < self.total:
            self._next_line = now + PROGRESS_EVERY_S
            print(
                f"  {self.done}/{self.total} scenarios, {self.divergent} divergences, {now - self.start:.0f} s", file=sys.stderr, flush=True
            )


def check(sc: Scenario, tally: Tally) -> None:
    """One scenario through both schedulers; prints its divergence, if any."""
    from conformance.oracle import run_sglang

    theirs = run_sglang(sc)
    ours = run_ours(sc)
    tally.steps += len(theirs.steps)
    d = first_divergence(ours, theirs)
    if d is None:
        return
    reason = expected_reason(ours, d, {r.rid: r.priority for r in sc.requests})
    if reason is not None:
        tally.expected += 1
        print(f"expected difference: scenario {sc.name}, step {d.step} ({reason})", flush=True)
        return
    tally.divergent += 1
    if tally.divergent == 1:
        print(f"\nfirst divergence: scenario {sc.name}, step {d.step} ({d.what})")
        print("scenario:", sc.to_json())
        print("ours:  ", json.dumps(d.ours))
        print("sglang:", json.dumps(d.sglang), flush=True)
    else:
        print(f"divergence: scenario {sc.name}, step {d.step} ({d.what})", flush=True)


if __name__ == "__main__":
    sys.exit(main())
