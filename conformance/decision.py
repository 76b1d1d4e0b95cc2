"""One step's decision as both schedulers report it (scheduler.step_clock.StepRecord), and a run's outcome."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.step_clock import StepRecord

StepDecision = StepRecord


@dataclass
class RunResult:
    steps: list[StepDecision]
    rejected: list[str]  # requests refused at arrival
    outputs: dict[str, int]  # rid -> output tokens produced
    error: str | None = None  # the scheduler raised or stalled
