"""One scheduler as the testbed runs it: its name, its own options, its defaults, its config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from scheduler.core.protocol import SchedulerCore
from scheduler.model_config import ModelConfig
from simulator.costs.cuda_graphs import CudaGraphPolicy
from testbed.replay_options import ReplayOptions


@dataclass(frozen=True)
class SchedulerKind:
    name: str  # --scheduler NAME
    label: str  # as a sentence names it: SGLang, vLLM
    policies: tuple[str, ...]  # the --policy values its waiting queue takes
    # Options no other scheduler has -> what this one uses for what another scheduler's option does
    # (keyed by the other's option): the one line refusing a foreign option says it.
    own_options: tuple[str, ...]
    counterparts: Mapping[str, str]
    chunk_option: str  # the option that bounds the prompt tokens one step computes
    with_defaults: Callable[[ReplayOptions], ReplayOptions]  # its page size and budgets, where unset
    config: Callable[[ReplayOptions, ModelConfig, int], Any]  # (options with defaults, model, KV tokens)
    new: Callable[[Any], SchedulerCore]  # a scheduler of that config
    # The same in a PD cluster's prefill role and decode role (scheduler/disagg/).
    new_prefill: Callable[[Any], SchedulerCore]
    new_decode: Callable[[Any], SchedulerCore]
    cuda_graphs: Callable[[ReplayOptions], CudaGraphPolicy]  # which forwards its engine replays from a graph

    def instead_of(self, option: str) -> str:
        return self.counterparts.get(option, "it has no such option")
