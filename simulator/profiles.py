"""Reading a profile file: a calibration of this project's engine, or kernels from AIConfigurator's database.

Both are testbed profiles (format and version: simulator/profile_cost.py); `source` says which
(absent: "engine", the profiles `testbed calibrate` wrote before there were two). Each becomes
its own CostModel, with what a replay needs besides: the model (and TP) it was made for
(`check_model`), and the KV pool (`engine_kv_tokens`, or `hardware_spec` to size it from).
"""

from __future__ import annotations

from pathlib import Path

from simulator.cuda_graphs import CudaGraphPolicy
from simulator.kernel_cost import KernelProfileCostModel
from simulator.kernel_profile import SOURCE as AICONFIGURATOR
from simulator.profile_cost import ProfileCostModel, ProfileError, read_profile

ENGINE = "engine"


def load_profile(path: str | Path, overlap: bool = False, graphs: CudaGraphPolicy | None = None) -> ProfileCostModel | KernelProfileCostModel:
    """graphs: the serving engine's CUDA-graph rule (a kernel profile prices eager forwards higher)."""
    profile = read_profile(path)
    source = profile.get("source", ENGINE)
    if source == ENGINE:
        return ProfileCostModel(profile, str(path), overlap)
    if source == AICONFIGURATOR:
        return KernelProfileCostModel(profile, str(path), graphs)
    raise ProfileError(f"{path}: unknown profile source {source!r}; expected {ENGINE} or {AICONFIGURATOR}")
