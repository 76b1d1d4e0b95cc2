"""python -m conformance.vllm_minimize FILE: shrink a divergent vLLM scenario.

Greedy: drop requests, shorten prompts (from the end, keeping shared prefixes), lower
max_new_tokens, move arrivals earlier, shrink the pool and the budgets, as long as the scenario
still diverges with the same likely cause (conformance.vllm_compare.classify). Prints the
smallest scenario found (JSON) and its divergence. Runs in the vLLM oracle environment.
"""

from __future__ import annotations

import os
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable, "-m", "conformance.vllm_minimize", *sys.argv[1:]])

import argparse  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

from conformance.vllm_compare import classify, first_divergence  # noqa: E402
from conformance.vllm_ours import run_ours  # noqa: E402
from conformance.vllm_scenario import VllmScenario  # noqa: E402


def divergence(sc: VllmScenario):
    from conformance.vllm_oracle import run_vllm

    try:
        theirs = run_vllm(sc)
        ours = run_ours(sc)
    except Exception as e:  # noqa: BLE001 - a crash is a kind of its own
        return None, f"crash {type(e).__name__}"
    d = first_divergence(ours, theirs)
    return d, (None if d is None else classify(d, ours))


def size(sc: VllmScenario) -> tuple:
    return (len(sc.requests), sum(len(r.prompt) + r.max_new_tokens for r in sc.requests), sc.kv_tokens)


def candidates(sc: VllmScenario):
    """Smaller variants of sc, the biggest cuts first."""
    for i in range(len(sc.requests)):
        c = copy.deepcopy(sc)
        del c.requests[i]
        if c.requests:
            yield c
    for i, r in enumerate(sc.requests):
        for cut in (len(r.prompt) // 2, len(r.prompt) // 4, sc.block_size, 1):
            if 0 < cut < len(r.prompt):
                c = copy.deepcopy(sc)
                c.requests[i].prompt = r.prompt[: len(r.prompt) - cut]
                yield c
        for m in (1, r.max_new_tokens // 2, r.max_new_tokens - 1):
            if 0 < m < r.max_new_tokens:
                c = copy.deepcopy(sc)
                c.requests[i].max_new_tokens = m
                if c.requests[i].eos_at is not None and c.requests[i].eos_at >= m:
                    c.requests[i].eos_at = None
                yield c
        if r.arrival_step > 0:
            for a in (0, r.arrival_step // 2, r.arrival_step - 1):
                c = copy.deepcopy(sc)
                c.requests[i].arrival_step = a
                yield c
        if not r.ignore_eos and r.eos_at is None:
            c = copy.deepcopy(sc)
            c.requests[i].ignore_eos = True
            yield c
        if r.priority:
            c = copy.deepcopy(sc)
            c.requests[i].priority = 0
            yield c
    for kv in (sc.kv_tokens // 2, sc.kv_tokens * 3 // 4, sc.kv_tokens - sc.block_size):
        kv -= kv % sc.block_size
        longest = max(len(r.prompt) + r.max_new_tokens for r in sc.requests)
        if longest <= kv < sc.kv_tokens:
            c = copy.deepcopy(sc)
            c.kv_tokens = kv
            yield c
    longest = max(len(r.prompt) + r.max_new_tokens for r in sc.requests)
    if sc.context_len > longest:
        c = copy.deepcopy(sc)
        c.context_len = longest
        yield c


def minimize(sc: VllmScenario, max_tries: int = 5000) -> VllmScenario:
    d, kind = divergence(sc)
    if d is None:
        raise SystemExit("the scenario does not diverge")
    tries = 0
    improved = True
    while improved and tries < max_tries:
        improved = False
        for c in candidates(sc):
            tries += 1
            d2, kind2 = divergence(c)
            if d2 is not None and kind2 == kind and size(c) < size(sc):
                sc = c
                improved = True
                break
    return sc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m conformance.vllm_minimize", description=__doc__.splitlines()[0])
    p.add_argument("scenario", type=Path)
    p.add_argument("-o", "--output", type=Path, default=None, help="write the smallest scenario here")
    args = p.parse_args(argv)
    sc = minimize(VllmScenario.from_json(args.scenario.read_text()))
    d, kind = divergence(sc)
    sc.name = sc.name + "-min"
    print("scenario:", sc.to_json())
    print(f"step {d.step} ({d.what}) [{kind}]")
    print("ours:", json.dumps(d.ours))
    print("vllm:", json.dumps(d.vllm))
    if args.output is not None:
        args.output.write_text(sc.to_json() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
