"""The schedulers a replay can run, by name: what each makes of the replay options.

testbed/ asks this registry (scheduler_kind(opts.scheduler)) for a scheduler's defaults, the
options and policies that are its own, its config, a new scheduler, and the CUDA graphs its
engine captures; no module of testbed/ branches on a scheduler's name. A third scheduler is a
module beside sglang.py and vllm.py and one entry below.
"""

from __future__ import annotations

from testbed.errors import ConfigError
from testbed.replay_options import ReplayOptions, flag
from testbed.schedulers.kind import SchedulerKind
from testbed.schedulers.sglang import SGLANG
from testbed.schedulers.vllm import VLLM

SCHEDULER_KINDS: dict[str, SchedulerKind] = {k.name: k for k in (SGLANG, VLLM)}


def scheduler_kind(name: str) -> SchedulerKind:
    try:
        return SCHEDULER_KINDS[name]
    except KeyError:
        raise ConfigError(f"--scheduler {name}: choose one of {', '.join(SCHEDULER_KINDS)}") from None


def check_scheduler_options(opts: ReplayOptions) -> None:
    """A policy or an option of another scheduler: one line naming what this one does instead."""
    kind = scheduler_kind(opts.scheduler)
    if opts.policy not in kind.policies:
        owner = next((k for k in SCHEDULER_KINDS.values() if opts.policy in k.policies), None)
        whose = f"{owner.label}'s" if owner is not None else "no scheduler's"
        raise ConfigError(f"--policy {opts.policy} is {whose}; --scheduler {kind.name} orders its queue by {' or '.join(kind.policies)}")
    default = ReplayOptions()
    for other in SCHEDULER_KINDS.values():
        if other is kind:
            continue
        for name in other.own_options:
            if getattr(opts, name) != getattr(default, name):
                raise ConfigError(f"{flag(name)} belongs to --scheduler {other.name}; with --scheduler {kind.name} {kind.instead_of(name)}")
