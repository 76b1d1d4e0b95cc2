"""Reading a profile file: a calibration of this project's engine, or kernels (AIConfigurator's database's, or a GPU's LLMServingSim timings).

Both are testbed profiles (format and version: simulator/costs/profile_cost.py); `source` says which
(absent: "engine", the profiles `testbed calibrate` wrote before there were two). Each becomes
its own CostModel, with what a replay needs besides: the model (and TP) it was made for
(`check_model`), and the KV pool (`engine_kv_tokens`, or `hardware_spec` to size it from).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from simulator.costs.cuda_graphs import CudaGraphPolicy
from simulator.costs.kernel_cost import KernelProfileCostModel
from simulator.costs.profile_cost import ProfileCostModel, ProfileError, read_profile
from simulator.profiles.kernel_profile import SOURCE as AICONFIGURATOR
from simulator.profiles.llmservingsim_profile import SOURCE as LLMSERVINGSIM

ENGINE = "engine"

CostModelFromProfile = Callable[[dict, str, bool, "CudaGraphPolicy | None"], "ProfileCostModel | KernelProfileCostModel"]

# The cost sources a profile file can hold, by its `source`: each makes its own CostModel from
# (the profile, its path, overlap, the engine's CUDA-graph rule). A new source is one entry here.
COST_SOURCES: dict[str, CostModelFromProfile] = {
    ENGINE: lambda profile, path, overlap, graphs: ProfileCostModel(profile, path, overlap),
    AICONFIGURATOR: lambda profile, path, overlap, graphs: KernelProfileCostModel(profile, path, graphs),
    LLMSERVINGSIM: lambda profile, path, overlap, graphs: KernelProfileCostModel(profile, path, graphs),
}


def load_profile(
    path: str | Path, overlap: bool = False, graphs: CudaGraphPolicy | None = None
) -> ProfileCostModel | KernelProfileCostModel:
    """graphs: the serving engine's CUDA-graph rule (a kernel profile prices eager forwards higher)."""
    profile = read_profile(path)
    source = profile.get("source", ENGINE)
    make = COST_SOURCES.get(source)
    if make is None:
        raise ProfileError(f"{path}: unknown profile source {source!r}; expected {' or '.join(COST_SOURCES)}")
    return make(profile, str(path), overlap, graphs)
