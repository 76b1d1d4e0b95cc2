"""One step's decision as both schedulers report it: what the comparison compares."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class StepDecision:
    mode: str  # extend | decode | mixed
    reqs: list[tuple[str, int]]  # (rid, new tokens computed this step), in batch order
    retracted: list[str] = field(default_factory=list)  # retracted or preempted while scheduling it
    new_token_ratio: float = 0.0
    kv_used: int = 0  # KV slots held by requests or locked in the cache (not evictable, not free)
    kv_cached: int = 0  # evictable slots in the prefix cache
    num_waiting: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class RunResult:
    steps: list[StepDecision]
    rejected: list[str]  # requests refused at arrival
    outputs: dict[str, int]  # rid -> output tokens produced
    error: str | None = None  # the scheduler raised or stalled
