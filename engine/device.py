"""Which device, dtype and attention backend a real run uses, and why (said to the user)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class DeviceChoice:
    device: torch.device
    dtype: torch.dtype
    attention_backend: str  # "torch" | "flashinfer"
    reason: str  # one line for the user


class DeviceError(ValueError):
    pass


def choose_device(device: str = "auto", dtype: str = "auto", attention_backend: str = "auto") -> DeviceChoice:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise DeviceError("--device cuda: no CUDA device is visible to torch")
    dev = torch.device(device)
    if dtype == "auto":
        # bf16 on GPUs; float32 on the CPU, where bf16 matmuls are slow and tests compare exactly.
        dtype = "bfloat16" if dev.type == "cuda" else "float32"
    if dtype not in DTYPES:
        raise DeviceError(f"--dtype {dtype}: choose one of auto, {', '.join(DTYPES)}")
    has_flashinfer = importlib.util.find_spec("flashinfer") is not None
    if attention_backend == "auto":
        if dev.type == "cuda" and has_flashinfer:
            attention_backend, why = "flashinfer", "flashinfer is installed"
        elif dev.type == "cuda":
            attention_backend, why = "torch", "flashinfer is not installed (pip install .[gpu])"
        else:
            attention_backend, why = "torch", "flashinfer needs CUDA"
    else:
        why = "as asked"
        if attention_backend == "flashinfer" and (dev.type != "cuda" or not has_flashinfer):
            raise DeviceError("--attention-backend flashinfer needs CUDA and the gpu extra (pip install .[gpu])")
        if attention_backend not in ("torch", "flashinfer"):
            raise DeviceError(f"--attention-backend {attention_backend}: choose auto, torch or flashinfer")
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    reason = f"device {name} ({dev}), {dtype}, attention backend {attention_backend} ({why})"
    return DeviceChoice(dev, DTYPES[dtype], attention_backend, reason)
