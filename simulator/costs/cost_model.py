"""What the simulator charges for device work and for each CPU stage of the loop.

Three cost models fit the same ``CostModel`` protocol:

- ``simulator.costs.roofline.RooflineCostModel``: analytic, from the model's FLOPs
  and bytes over the hardware's peaks; works for any model and hardware.
- ``simulator.costs.kernel_cost.KernelProfileCostModel``: forwards priced from a
  profile of AIConfigurator's measured GPU kernels.
- ``simulator.costs.profile_cost.ProfileCostModel``: a profile calibrated on this
  project's engine (``testbed calibrate``), with fitted ``CpuStageCosts``.

Both are called on the simulator's hot path (~100k plans per replay), so they
must read only the plan's precomputed summaries, never loop over requests.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

from scheduler.core.forward_plan import ForwardPlan

CPU_STAGES = ("schedule", "launch", "process")


@runtime_checkable
class CostModel(Protocol):
    name: str

    def forward_time(self, plan: ForwardPlan) -> float:
        """Seconds of device time for one forward of ``plan``."""
        ...

    def cpu_time(self, stage: str, num_reqs: int, num_tokens: int) -> float:
        """Seconds of host time for one loop stage: "schedule", "launch" or "process"."""
        ...


@dataclass(frozen=True)
class StageCost:
    """Linear cost of one CPU stage: base + per request + per token."""

    base_s: float = 0.0
    per_req_s: float = 0.0
    per_token_s: float = 0.0

    def __call__(self, num_reqs: int, num_tokens: int) -> float:
        return self.base_s + self.per_req_s * num_reqs + self.per_token_s * num_tokens


@dataclass(frozen=True)
class CpuStageCosts:
    """Host-side costs of the scheduler loop's stages.

    schedule: pick the next batch (radix match, PrefillAdder, ScheduleBatch -> ForwardPlan).
    launch:   build input tensors and enqueue the forward (kernel launches or a CUDA graph replay).
    process:  read back sampled ids, append tokens, check stop conditions, free finished KV.

    Defaults are roughly SGLang on a fast host; calibration replaces them.
    """

    schedule: StageCost = field(default_factory=lambda: StageCost(100e-6, 2e-6, 0.0))
    launch: StageCost = field(default_factory=lambda: StageCost(300e-6, 1e-6, 0.02e-6))
    process: StageCost = field(default_factory=lambda: StageCost(50e-6, 3e-6, 0.0))

    def time(self, stage: str, num_reqs: int, num_tokens: int) -> float:
        if stage == "schedule":
            return self.schedule(num_reqs, num_tokens)
        if stage == "launch":
            return self.launch(num_reqs, num_tokens)
        if stage == "process":
            return self.process(num_reqs, num_tokens)
        raise ValueError(f"unknown CPU stage {stage!r}; expected one of {', '.join(CPU_STAGES)}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CpuStageCosts":
        unknown = set(d) - set(CPU_STAGES)
        if unknown:
            raise ValueError(f"unknown CPU stage(s) {sorted(unknown)}; expected {', '.join(CPU_STAGES)}")
        default = cls()
        return cls(**{s: StageCost(**d[s]) if s in d else getattr(default, s) for s in CPU_STAGES})

    def to_dict(self) -> dict[str, dict[str, float]]:
        return {s: asdict(getattr(self, s)) for s in CPU_STAGES}
