"""A vLLM conformance scenario: the requests and options both vLLM's v1 scheduler and our
VllmScheduler get, the per-step record both report, and how to draw a scenario.

Plain data (JSON round trip), no torch and no vLLM: printed as it is when a step diverges, so
that `python -m conformance.vllm_main --scenario FILE` replays it. Requests are the SGLang
harness's ScenarioRequest and sample the same tokens (conformance.scenario.sampled_token).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field

from conformance.scenario import ScenarioRequest, sampled_token

VLLM_VERSION = "0.19.0"
BLOCK_SIZES = (1, 8, 16, 16, 16)


@dataclass
class VllmScenario:
    name: str
    kv_tokens: int  # the pool: kv_tokens // block_size blocks (vLLM gets one more: its null block)
    context_len: int  # vLLM's max_model_len
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    policy: str = "fcfs"  # fcfs | priority
    async_scheduling: bool = False
    requests: list[ScenarioRequest] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "VllmScenario":
        d = json.loads(text)
        if "scenario" in d and isinstance(d["scenario"], dict):  # a whole divergence record
            d = d["scenario"]
        d["requests"] = [ScenarioRequest(**r) for r in d["requests"]]
        return cls(**d)

    @property
    def num_blocks(self) -> int:
        return self.kv_tokens // self.block_size

    def arrival_order(self) -> list[int]:
        """Request indices in arrival order (stable): both sides receive them so."""
        return sorted(range(len(self.requests)), key=lambda i: self.requests[i].arrival_step)


@dataclass
class VllmStep:
    """One launched forward, as both sides report it right after scheduling it."""

    reqs: list[tuple[str, int]]  # (rid, tokens scheduled), in the scheduler's order
    preempted: list[str]  # preempted since the previous forward, in order
    finished: list[str]  # finished since the previous forward (sorted)
    free_blocks: int  # free blocks, cached-but-unreferenced ones included (vLLM's free queue)
    cache_hit_tokens: int  # prefix-cache tokens of the requests admitted (new or resumed) this step
    num_running: int
    num_waiting: int
    # Not compared: cached blocks evicted so far (each side counts its own), to tell a divergence
    # that follows from the eviction policy from one that does not.
    evicted: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


FIELDS = ("reqs", "preempted", "finished", "free_blocks", "cache_hit_tokens", "num_running", "num_waiting")


@dataclass
class VllmRun:
    steps: list[VllmStep]
    rejected: list[str]  # refused at arrival
    outputs: dict[str, int]  # rid -> output tokens
    error: str | None = None  # stuck, or the scheduler raised


def rejected_at_arrival(sc: VllmScenario, r: ScenarioRequest) -> bool:
    """What the API server refuses before the engine sees it (prompt + max_tokens beyond
    max_model_len); our core does the same in add_request. The generator draws none."""
    return len(r.prompt) + r.max_new_tokens > sc.context_len


def random_scenario(rng: random.Random, index: int, async_scheduling: bool | None = None) -> VllmScenario:
    """One scenario drawn so that the interesting paths run: shared prefixes and multi-turn
    prompts (prefix hits, also on output blocks), long prompts that chunk, EOS, KV pools from
    tight (preemption) to ample, max_num_seqs and token budgets that bind, both policies."""
    block_size = rng.choice(BLOCK_SIZES)
    policy = rng.choice(("fcfs", "fcfs", "priority"))
    num_reqs = rng.randint(2, 20)
    vocab = 30000
    systems = [[rng.randrange(10, vocab) for _ in range(rng.choice((8, 40, 120, 300)))] for _ in range(rng.randint(1, 3))]
    reqs: list[ScenarioRequest] = []
    step = 0
    max_prompt = rng.choice((32, 128, 512, 1500))
    for i in range(num_reqs):
        step += rng.choice((0, 0, 0, 1, 1, 2, 5, 12))
        rid = f"r{i}"
        prompt: list[int] = []
        if rng.random() < 0.6:
            prompt += rng.choice(systems)
        if reqs and rng.random() < 0.25:
            prev = rng.choice(reqs)
            prompt = list(prev.prompt)
            if rng.random() < 0.6:  # a next turn: the earlier answer is part of the prompt
                n = prev.max_new_tokens if prev.eos_at is None or prev.ignore_eos else prev.eos_at + 1
                prompt += [sampled_token(prev, k) for k in range(n)]
        prompt += [rng.randrange(10, vocab) for _ in range(rng.randint(1, max_prompt))]
        ignore_eos = rng.random() < 0.7
        max_new = rng.choice((1, 2, 3, 8, 17, 40, 120))
        eos_at = None if ignore_eos or rng.random() < 0.3 else rng.randrange(max_new)
        reqs.append(ScenarioRequest(rid, step, prompt, max_new, ignore_eos, eos_at, rng.randint(0, 3)))
    longest = max(len(r.prompt) + r.max_new_tokens for r in reqs)
    total = sum(len(r.prompt) + r.max_new_tokens for r in reqs)
    # Pools from "just fits the longest request" (preemption, waiting) to "everything fits".
    kv = rng.choice((longest + rng.randint(0, 48), longest + rng.randint(16, 200), (longest + total) // 3, total + 64))
    kv = max(kv, longest)
    kv = -(-kv // block_size) * block_size
    context_len = rng.choice((longest, longest + rng.randint(1, 64), 4096, 32768))
    context_len = max(context_len, longest)
    max_num_seqs = rng.choice((2, 4, 8, 256, 256))
    budget = rng.choice((16, 64, 256, 2048, 8192))
    budget = max(budget, max_num_seqs)  # vLLM: max_num_batched_tokens >= max_num_seqs
    return VllmScenario(
        name=f"v{index}",
        kv_tokens=kv,
        context_len=context_len,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        enable_prefix_caching=rng.random() < 0.75,
        policy=policy,
        async_scheduling=rng.random() < 0.5 if async_scheduling is None else async_scheduling,
        requests=reqs,
    )
