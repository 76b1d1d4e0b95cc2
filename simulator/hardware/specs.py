"""Accelerator (or CPU) specs the roofline cost model and KV sizing read.

Bundled specs live as JSON in ``simulator/hardware/``; a user's own spec is a
JSON file with the same keys (see ``HardwareSpec.from_dict``). With
AIConfigurator's database installed (``pip install -e '.[aiconfigurator]'``), its
system names (h100_sxm, rtx_pro_6000_server, ...) are specs too, read from its
system YAML: memory, bandwidth, bf16 and fp8 FLOPs, interconnect.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator.costs.cost_model import CpuStageCosts

HARDWARE_DIR = Path(__file__).parent  # the bundled specs, beside this file


class HardwareConfigError(ValueError):
    """An unknown hardware name or a malformed hardware JSON."""


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    peak_flops: float  # dense bf16 FLOP/s (no sparsity)
    mem_bandwidth: float  # bytes/s of device memory
    memory_bytes: int  # device memory as the driver reports it
    # Dense fp8 FLOP/s of the tensor cores (no sparsity; the datasheet's figure), which the GEMMs of
    # fp8 weights (--quantization fp8) run at. 0: no fp8 tensor cores (A100, a CPU): the engines
    # dequantize fp8 weights into bf16 GEMMs there (weight-only, Marlin), at peak_flops.
    peak_flops_fp8: float = 0.0
    # Dense fp4 FLOP/s (NVFP4, Blackwell's tensor cores; the datasheet's figure), which the GEMMs of
    # --quantization nvfp4 run at. 0: no fp4 tensor cores: the engines run NVFP4 weights weight-only
    # there (Marlin: dequantized into bf16 GEMMs), at peak_flops.
    peak_flops_fp4: float = 0.0
    # Fractions of the peaks that real kernels reach: large GEMMs get ~60-70% of
    # peak FLOPs, streaming weights and KV gets ~80% of peak bandwidth.
    compute_efficiency: float = 0.65
    bandwidth_efficiency: float = 0.8
    kernel_launch_s: float = 50e-6  # fixed device-side cost of one forward
    per_layer_overhead_s: float = 4e-6  # small-kernel tails and gaps, per decoder layer
    # Memory that activations, sampling and workspaces take out of the static pool.
    activation_reserve_bytes: int = 1 << 30
    # Tensor parallelism: bytes/s one GPU sends to the others (one direction: NVLink, or PCIe
    # without it) and the fixed time of one all-reduce. 0 bandwidth: no interconnect, TP 1 only.
    interconnect_bandwidth: float = 0.0
    interconnect_latency_s: float = 10e-6
    # The GPU's compute capability, major x 10 + minor (AIConfigurator's sm_version: 90 Hopper, 100
    # Blackwell); 0: unknown, or not a GPU. Some engine defaults follow it (SGLang's KV dtype for DSA).
    sm_version: int = 0
    cpu: CpuStageCosts = field(default_factory=CpuStageCosts)
    description: str = ""

    def __post_init__(self) -> None:
        for key in ("peak_flops", "mem_bandwidth", "memory_bytes"):
            if getattr(self, key) <= 0:
                raise HardwareConfigError(f"hardware {self.name!r}: {key} must be > 0")
        if self.peak_flops_fp8 < 0:
            raise HardwareConfigError(f"hardware {self.name!r}: peak_flops_fp8 must be >= 0 (0: no fp8 tensor cores)")
        if self.peak_flops_fp4 < 0:
            raise HardwareConfigError(f"hardware {self.name!r}: peak_flops_fp4 must be >= 0 (0: no fp4 tensor cores)")
        if self.interconnect_bandwidth < 0 or self.interconnect_latency_s < 0:
            raise HardwareConfigError(f"hardware {self.name!r}: interconnect_bandwidth and interconnect_latency_s must be >= 0")
        for key in ("compute_efficiency", "bandwidth_efficiency"):
            if not 0 < getattr(self, key) <= 1:
                raise HardwareConfigError(f"hardware {self.name!r}: {key} must be in (0, 1]")

    @classmethod
    def from_dict(cls, d: dict[str, Any], name: str | None = None) -> "HardwareSpec":
        d = dict(d)
        try:
            cpu = CpuStageCosts.from_dict(d.pop("cpu", {}))
        except (TypeError, ValueError) as e:  # unknown stage or coefficient name
            raise HardwareConfigError(f"hardware {name!r}: bad 'cpu' section: {e}") from e
        known = set(cls.__dataclass_fields__) - {"cpu"}
        unknown = set(d) - known
        if unknown:
            raise HardwareConfigError(f"hardware {name!r}: unknown keys {sorted(unknown)}")
        if name is not None:
            d.setdefault("name", name)
        try:
            return cls(cpu=cpu, **d)
        except TypeError as e:  # a missing required key
            raise HardwareConfigError(f"hardware {name!r}: {e}") from e

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "cpu"}
        d["cpu"] = self.cpu.to_dict()
        return d


def bundled_hardware_names() -> list[str]:
    return sorted(p.stem for p in HARDWARE_DIR.glob("*.json"))


def database_system_spec(system: str) -> HardwareSpec:
    """The spec of one of AIConfigurator's systems, from its YAML (the package is not imported)."""
    from simulator.profiles import kernel_catalog

    try:
        spec = kernel_catalog.system_spec(system)
        gpu, node = spec["gpu"], spec.get("node", {})
        return HardwareSpec(
            name=system,
            peak_flops=float(gpu["bfloat16_tc_flops"]),
            mem_bandwidth=float(gpu["mem_bw"]),
            memory_bytes=int(gpu["mem_capacity"]),
            # The YAML's fp8_tc_flops (dense); absent where the GPU has no fp8 tensor cores (A100).
            peak_flops_fp8=float(gpu.get("fp8_tc_flops") or 0.0),
            peak_flops_fp4=float(gpu.get("fp4_tc_flops") or 0.0),
            bandwidth_efficiency=float(gpu.get("mem_bw_empirical_scaling_factor", 0.8)),
            interconnect_bandwidth=float(node.get("intra_node_bw", 0.0)),
            interconnect_latency_s=float(node.get("p2p_latency", 10e-6)),
            sm_version=int(gpu.get("sm_version") or 0),
            description=f"AIConfigurator system {system}: {gpu['bfloat16_tc_flops'] / 1e12:.0f} TFLOP/s bf16"
            + (f", {gpu['fp8_tc_flops'] / 1e12:.0f} fp8" if gpu.get("fp8_tc_flops") else ", no fp8 tensor cores")
            + ", "
            f"{gpu['mem_bw'] / 1e12:.2f} TB/s, {gpu['mem_capacity'] / 2**30:.1f} GiB, "
            f"{node.get('intra_node_bw', 0) / 1e9:.0f} GB/s to the other GPUs of a node",
        )
    except kernel_catalog.KernelDatabaseError as e:
        raise HardwareConfigError(str(e)) from None
    except (KeyError, TypeError, ValueError) as e:
        raise HardwareConfigError(f"AIConfigurator system {system!r}: its YAML lacks a usable {e}") from None


def hardware_of_device(device_name: str) -> str | None:
    """The bundled spec of a device as torch names it: cpu for the CPU, h100, h200, a100 or rtx4090
    for a GPU whose name says so ("NVIDIA H100 80GB HBM3", "NVIDIA GeForce RTX 4090"; compared
    without spaces); None for another GPU."""
    low = device_name.lower()
    if low == "cpu":
        return "cpu"
    squashed = low.replace(" ", "").replace("-", "")
    return next((n for n in bundled_hardware_names() if n != "cpu" and n in squashed), None)


def load_hardware(name_or_path: str | Path) -> HardwareSpec:
    """A bundled name (case-insensitive: h100, h200, a100, rtx4090, cpu), one of AIConfigurator's system
    names (h100_sxm, ...; with its database installed), or a path to a JSON spec."""
    from simulator.profiles import kernel_catalog

    key = str(name_or_path).lower()
    if key in bundled_hardware_names():
        path = HARDWARE_DIR / f"{key}.json"
    elif key in kernel_catalog.system_names():
        return database_system_spec(key)
    else:
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            systems = kernel_catalog.system_names()
            more = (
                f"; AIConfigurator's systems: {', '.join(systems)}"
                if systems
                else f"; AIConfigurator's system names (h100_sxm, ...) need {kernel_catalog.EXTRA_HINT}"
            )
            raise HardwareConfigError(
                f"unknown hardware {str(name_or_path)!r}: not a bundled spec or a JSON file; "
                f"bundled: {', '.join(bundled_hardware_names())}{more}"
            )
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise HardwareConfigError(f"{path} is not valid JSON: {e}") from e
    return HardwareSpec.from_dict(data, name=path.stem)
