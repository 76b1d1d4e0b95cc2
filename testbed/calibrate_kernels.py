"""testbed calibrate --source aiconfigurator: a profile of a GPU system from AIConfigurator's measured kernels.

No engine runs: the profile is composed from the database's kernel timings for the model's shapes
over TP GPUs (simulator/kernel_profile.py), in seconds, and written where --out says, in the
profile format `--profile` reads.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from scheduler.forward_plan import ForwardMode
from scheduler.model_config import ModelConfig, load_model_config
from simulator.kernel_db import KernelDatabaseError, available
from simulator.kernel_holdout import uniform_plan
from simulator.kernel_profile import build_kernel_profile
from testbed.errors import ConfigError

DEFAULT_MODEL = "llama-3.1-8b"


def profile_text(profile: dict) -> str:
    """JSON with every list of numbers on one line: the kernel tables stay a small, readable file."""
    text = json.dumps(profile, indent=1)
    return re.sub(r"\[[-+0-9.eE,\s]*\]", lambda m: re.sub(r"\s+", "", m.group(0)).replace(",", ", "), text) + "\n"


def hbm_floor_s(model: ModelConfig, tp: int, mem_bandwidth: float) -> float:
    """One decode step can not beat reading one GPU's weights once from memory."""
    return model.weight_bytes(2, tp) / mem_bandwidth


def decode_at_batch_1_s(profile: dict, context: int = 1024) -> float:
    from simulator.kernel_cost import KernelProfileCostModel

    return KernelProfileCostModel(profile).forward_time(uniform_plan(ForwardMode.DECODE, 1, 1, context - 1))


def calibrate_kernels(system: str | None, backend: str, backend_version: str | None, model_name: str | None, tp: int,
                      out: str | Path, progress=None) -> dict:
    """Build the profile and write it; bad input raises ConfigError (one line, exit 2)."""
    if not system:
        try:
            systems = ", ".join(available())
        except KernelDatabaseError as e:
            raise ConfigError(str(e)) from None
        raise ConfigError(f"--source aiconfigurator needs --system: one of {systems}")
    model = load_model_config(model_name or DEFAULT_MODEL)
    try:
        profile = build_kernel_profile(system, backend, backend_version, model, tp, progress)
    except KernelDatabaseError as e:
        raise ConfigError(str(e)) from None
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(profile_text(profile))
    return profile


def summary_lines(profile: dict, out: str | Path) -> list[str]:
    db, spec = profile["database"], profile["hardware_spec"]
    model, tp = load_model_config(profile["model"]), profile["tp"]
    lines = [f"profile {out}: {profile['model']} at TP {tp} on {db['system']}, {db['backend']} {db['backend_version']} kernels "
             f"(aiconfigurator-core {db['package_version']}), {profile['wall_s']} s"]
    decode, floor = decode_at_batch_1_s(profile), hbm_floor_s(model, tp, spec["mem_bandwidth"])
    lines.append(f"  decode at batch 1, context 1024: {decode * 1e3:.2f} ms; weights / memory bandwidth "
                 f"(the floor): {floor * 1e3:.2f} ms ({decode / floor:.2f}x)")
    for kind, e in profile["holdout"].items():
        if not e.get("points"):
            lines.append(f"  {kind}: no measured shapes to check against (this version's attention tables come from another)")
        else:
            lines.append(f"  {kind}: error at {e['points']} measured shapes off a half grid: median {e['median_rel_err'] * 100:.1f}%, "
                         f"p90 {e['p90_rel_err'] * 100:.1f}%, max {e['max_rel_err'] * 100:.1f}%")
    return lines
