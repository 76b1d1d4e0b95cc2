"""What a forward outside a CUDA graph costs its host: launching every layer's kernels one by one.

An eager forward's kernels are queued from Python, op by op, while the GPU runs the ones already
queued, so it takes the longer of its kernels and its dispatch (simulator/costs/kernel_cost.py).
Per-kernel timings (AIConfigurator's database) leave the dispatch out; this module says what it is
for each backend.

- vLLM: AIConfigurator's own term (`_prefill_dispatch_overhead_ms`, 0.8 ms a layer, calibrated by
  AIConfigurator on its silicon corpus). vLLM runs a compiled model (fused ops) even outside its
  graphs, so few launches a layer.
- TRT-LLM: none (AIConfigurator's).
- SGLang: its extend batches always run eagerly (its graphs are decode-only), its modules
  uncompiled. AIConfigurator puts no dispatch on SGLang; its measured points say otherwise for a
  mixture-of-experts layer (router, top-k, token sort, quantization and grouped GEMMs, shared
  experts, and for MLA a dozen small projections and norms beside them):
  SGLANG_MOE_LAYER_DISPATCH_S below. A dense layer launches a handful of kernels; the file has no
  SGLang dense point at a load light enough to show its dispatch (its Qwen3-32B and Llama-3.1-8B
  points are batch-bound waves), so it stays at AIConfigurator's none.
"""

from __future__ import annotations

from scheduler.model_config import ModelConfig
from simulator.profiles.kernel_catalog import require_package
from simulator.profiles.kernel_db import KernelDatabase

# Host time to dispatch one mixture-of-experts layer of an eager SGLang forward, at TP 4-8 on the
# hosts of AIConfigurator's H200, B200 and B300 systems. Where it comes from: silicon_sample.csv's
# SGLang points at 4 clients and ~1k-token prompts, where a prefill's kernels take 35-130 ms and the
# measured TTFT is 200-310 ms (DeepSeek-R1/V3 on the H200: 260 ms against 63 ms of kernels and
# queueing; GLM-5: 312 ms on the H200, 216 on the B200; Qwen3.5-397B: 230-280 ms on the B200), while
# at 8k-token prompts (kernels 400 ms and more) the measurement is back near the kernels: the host,
# not the GPU, sets the time of a short prefill. Those points put it at 2.8-4.7 ms a layer (4.5 on
# the B300's DeepSeek, 1.5 at most on its GLM-5): one value for every host, as the database has one
# kernel time for every host. Over all 581 SGLang points (`testbed validate --filter backend=sglang`,
# docs/benchmarks.md) it takes the TTFT median from 57.2% to 33.5% and leaves TPOT's (15.6% -> 15.7%);
# 2 ms a layer gave 46.2%.
SGLANG_MOE_LAYER_DISPATCH_S = 3.5e-3


def eager_dispatch_s(db: KernelDatabase, model: ModelConfig, layers: int) -> float:
    """Seconds of host dispatch a forward of `model`'s `layers` costs outside a CUDA graph on db's backend."""
    return backend_dispatch_s(db.backend, model, layers)


def backend_dispatch_s(backend: str, model: ModelConfig, layers: int) -> float:
    """eager_dispatch_s of a backend by name (a profile from another source than the database)."""
    if backend == "sglang":
        return model.num_moe_layers * SGLANG_MOE_LAYER_DISPATCH_S
    return _aiconfigurator_dispatch_s(backend, layers)


def _aiconfigurator_dispatch_s(backend: str, layers: int) -> float:
    """The backend's own term in AIConfigurator (``_prefill_dispatch_overhead_ms``: CPU-side dispatch
    across the layers; vLLM 0.8 ms a layer, calibrated on its silicon corpus; TRT-LLM none).
    KernelDatabaseError, in one line, where aiconfigurator-core is not installed."""
    require_package()
    from aiconfigurator_core.sdk.backends.factory import get_backend

    class _Layers:  # all the method reads of a model
        _num_layers = layers

    return get_backend(backend)._prefill_dispatch_overhead_ms(_Layers()) * 1e-3
