"""A conformance scenario: the requests and options both schedulers get, and how to draw one.

Plain data (JSON round trip), no torch and no SGLang: printed as it is when a step diverges,
so that the divergence can be replayed from the printout.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field

EOS_TOKEN_ID = 2
POLICIES = ("fcfs", "lpm", "dfs-weight", "lof", "random", "priority")


@dataclass
class ScenarioRequest:
    rid: str
    arrival_step: int  # received before the scheduler decides this step (a logical clock)
    prompt: list[int]
    max_new_tokens: int
    ignore_eos: bool = True
    eos_at: int | None = None  # output index whose sampled token is EOS (ignore_eos False)
    priority: int = 0


@dataclass
class Scenario:
    name: str
    kv_tokens: int
    context_len: int
    page_size: int = 1
    chunked_prefill_size: int | None = 8192
    max_prefill_tokens: int = 16384
    policy: str = "fcfs"
    disable_radix_cache: bool = False
    overlap: bool = False
    max_running_requests: int | None = None
    schedule_conservativeness: float = 1.0
    enable_mixed_chunk: bool = False
    enable_priority_scheduling: bool = False
    priority_preemption_threshold: int = 10
    requests: list[ScenarioRequest] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "Scenario":
        d = json.loads(text)
        d["requests"] = [ScenarioRequest(**r) for r in d["requests"]]
        return cls(**d)


def sampled_token(req: ScenarioRequest, output_index: int) -> int:
    """The token the model 'samples' as a request's output_index-th output: the same on both sides."""
    if not req.ignore_eos and req.eos_at == output_index:
        return EOS_TOKEN_ID
    return 1000 + (hash_rid(req.rid) * 131 + output_index * 7) % 5000


def hash_rid(rid: str) -> int:
    return sum((i + 1) * ord(c) for i, c in enumerate(rid))


def random_scenario(rng: random.Random, index: int, overlap: bool | None = None) -> Scenario:
    """One scenario drawn so that the interesting paths run: shared prefixes, chunking,
    KV pressure that forces retraction, page sizes 1 and 16, every policy."""
    page_size = rng.choice((1, 1, 16))
    policy = rng.choice(POLICIES)
    num_reqs = rng.randint(2, 24)
    # Shared prefixes: a few system prompts; multi-turn: a prompt extends an earlier one.
    vocab = 30000
    systems = [[rng.randrange(10, vocab) for _ in range(rng.choice((8, 40, 120)))] for _ in range(rng.randint(1, 3))]
    reqs: list[ScenarioRequest] = []
    step = 0
    max_prompt = rng.choice((64, 256, 1024))
    for i in range(num_reqs):
        step += rng.choice((0, 0, 0, 1, 1, 3, 8))
        prompt: list[int] = []
        if rng.random() < 0.6:
            prompt += rng.choice(systems)
        if reqs and rng.random() < 0.2:
            prompt = list(rng.choice(reqs).prompt)
        prompt += [rng.randrange(10, vocab) for _ in range(rng.randint(1, max_prompt))]
        ignore_eos = rng.random() < 0.8
        max_new = rng.choice((1, 2, 4, 16, 64, 200))
        eos_at = None if ignore_eos or rng.random() < 0.3 else rng.randrange(max_new)
        reqs.append(ScenarioRequest(f"r{i}", step, prompt, max_new, ignore_eos, eos_at, rng.randint(0, 3) * 5))
    longest = max(len(r.prompt) + r.max_new_tokens for r in reqs)
    total = sum(len(r.prompt) + r.max_new_tokens for r in reqs)
    # Pools from "just fits the longest request" (retraction, waiting) to "everything fits".
    kv = rng.choice((longest + rng.randint(8, 64), (longest + total) // 3, total + 64))
    kv = max(kv, longest + 32)
    kv -= kv % page_size
    chunk = rng.choice((None, 64, 256, 2048))
    if chunk is not None:
        chunk = max(chunk, page_size)
    return Scenario(
        name=f"s{index}",
        kv_tokens=kv,
        context_len=rng.choice((4096, 32768)),
        page_size=page_size,
        chunked_prefill_size=chunk,
        max_prefill_tokens=rng.choice((512, 16384)),
        policy=policy,
        disable_radix_cache=rng.random() < 0.25,
        overlap=rng.random() < 0.5 if overlap is None else overlap,
        max_running_requests=rng.choice((None, None, 4, 16)),
        schedule_conservativeness=rng.choice((1.0, 1.0, 0.3, 1.5)),
        enable_mixed_chunk=chunk is not None and rng.random() < 0.3,
        enable_priority_scheduling=rng.random() < 0.25,
        priority_preemption_threshold=rng.choice((0, 5, 10)),
        requests=reqs,
    )
