"""Routing policies: which instance a request goes to, given what the router knows of each.

- round-robin, random;
- least-requests: the fewest running + waiting requests;
- least-tokens: the fewest outstanding tokens (the prompt and output tokens of the requests
  sent to it and not finished);
- power-of-two: two instances drawn at random, the one with fewer requests;
- cache-aware: SGLang's router. When the load is imbalanced (max - min running + waiting above
  the absolute threshold and max above the relative threshold times min) the least loaded;
  else the instance its prefix index matches best when that match rate is above the cache
  threshold; else the instance with the smallest index (the most room in its cache);
- weighted: scorers summed with weights (llm-d's scheduler): `prefix` (the match rate),
  `queue` (1 - requests / the most requests), `kv` (1 - KV use); the highest score wins.

Ties go to the lowest instance index.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Sequence

ROUTERS = ("round-robin", "random", "least-requests", "least-tokens", "power-of-two", "cache-aware", "weighted")
WEIGHT_NAMES = ("prefix", "queue", "kv")


@dataclass
class InstanceView:
    """What the router knows of one instance (as of its last refresh)."""

    requests: int = 0  # running + waiting, as the instance reports them
    outstanding_tokens: int = 0  # router-side: tokens of the requests it sent there, not finished
    kv_usage: float = 0.0  # KV in use / the pool


@dataclass
class RoutingConfig:
    policy: str = "round-robin"
    seed: int = 0
    cache_threshold: float = 0.5
    balance_abs_threshold: int = 32
    balance_rel_threshold: float = 1.0001
    weights: dict[str, float] = field(default_factory=lambda: {"prefix": 2.0, "queue": 1.0, "kv": 1.0})


def parse_weights(spec: str) -> dict[str, float]:
    """`prefix=2,queue=1,kv=1` -> {"prefix": 2.0, ...}; ValueError naming what is wrong."""
    out: dict[str, float] = {}
    for part in spec.split(","):
        name, eq, value = part.partition("=")
        name = name.strip()
        if not eq or name not in WEIGHT_NAMES:
            raise ValueError(f"{part!r}: give NAME=WEIGHT with NAME one of {', '.join(WEIGHT_NAMES)}")
        try:
            out[name] = float(value)
        except ValueError:
            raise ValueError(f"{part!r}: the weight is not a number") from None
        if not out[name] >= 0:
            raise ValueError(f"{part!r}: a weight must be >= 0")
    return out


class Policy:
    def __init__(self, config: RoutingConfig, num_instances: int) -> None:
        self.config = config
        self.n = num_instances
        self.rng = random.Random(config.seed)
        self.next_rr = 0

    def choose(self, views: Sequence[InstanceView], match_rates: Sequence[float] | None, index_sizes: Sequence[int]) -> int:
        """The instance for a request (match_rates: its prefix match on each; None when the policy
        reads none)."""
        name = self.config.policy
        if name == "round-robin":
            i, self.next_rr = self.next_rr, (self.next_rr + 1) % self.n
            return i
        if name == "random":
            return self.rng.randrange(self.n)
        if name == "least-requests":
            return _argmin([v.requests for v in views])
        if name == "least-tokens":
            return _argmin([v.outstanding_tokens for v in views])
        if name == "power-of-two":
            a, b = self.rng.sample(range(self.n), 2) if self.n > 1 else (0, 0)
            return a if (views[a].requests, a) <= (views[b].requests, b) else b
        if name == "cache-aware":
            return self._cache_aware(views, match_rates, index_sizes)
        if name == "weighted":
            return self._weighted(views, match_rates)
        raise ValueError(f"unknown router {name!r}")

    def _cache_aware(self, views, match_rates, index_sizes) -> int:
        c = self.config
        loads = [v.requests for v in views]
        hi, lo = max(loads), min(loads)
        if hi - lo > c.balance_abs_threshold and hi > c.balance_rel_threshold * lo:
            return _argmin(loads)
        best = _argmax(match_rates)
        if match_rates[best] > c.cache_threshold:
            return best
        return _argmin(index_sizes)

    def _weighted(self, views, match_rates) -> int:
        w = self.config.weights
        most = max(v.requests for v in views) or 1
        scores = [
            w.get("prefix", 0.0) * match_rates[i] + w.get("queue", 0.0) * (1 - v.requests / most) + w.get("kv", 0.0) * (1 - v.kv_usage)
            for i, v in enumerate(views)
        ]
        return _argmax(scores)

    @property
    def reads_prefixes(self) -> bool:
        return self.config.policy in ("cache-aware", "weighted")


def _argmin(values: Sequence[float]) -> int:
    return min(range(len(values)), key=lambda i: (values[i], i))


def _argmax(values: Sequence[float]) -> int:
    return min(range(len(values)), key=lambda i: (-values[i], i))
