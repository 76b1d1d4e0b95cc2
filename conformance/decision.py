"""One step's decision as both schedulers report it (scheduler.step_clock.StepRecord), and a run's outcome."""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.loop.step_clock import StepRecord

StepDecision = StepRecord


@dataclass
class RunResult:
    steps: list[StepDecision]
    rejected: list[str]  # requests refused at arrival
    outputs: dict[str, int]  # rid -> output tokens produced
    error: str | None = None  # the scheduler raised or stalled
    never_admitted: list[str] = field(default_factory=list)  # ours: rejected at arrival as no admission takes them
