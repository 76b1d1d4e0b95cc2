"""A cost profile composed from measured kernels: a model's forward, kernel by kernel, from AIConfigurator.

`build_kernel_profile(system, backend, backend_version, model, tp)` queries the database
(simulator/kernel_db.py) for every kernel of a Llama-family decoder layer, with the shapes one of
`tp` GPUs runs (the op list AIConfigurator's own LLAMA model uses):

    per layer, over the batch's n tokens:  qkv_proj   GEMM n x hidden -> (heads + 2 kv heads) x head_dim / TP
                                           o_proj     GEMM n x heads x head_dim / TP -> hidden
                                           gate_up_proj GEMM n x hidden -> 2 x intermediate / TP
                                           down_proj  GEMM n x intermediate / TP -> hidden
                                           norms      residual add + RMSNorm, twice
                                           act_fn     SiLU and multiply
                                           all_reduce two, after attention and after the MLP (TP > 1)
    per layer, attention:                  prefill attention of the extend requests (with RoPE and
                                           the KV write), decode attention of the decode requests
    once per forward:                      embedding (+ its all-reduce for TP > 1) over n tokens;
                                           lm_head GEMM over the batch's requests (one row each)

and tabulates them on grids (seconds; attention and per-layer ops for one layer):

    tokens              the database's measured GEMM token counts, then powers of 2 to 131072
    requests            1 to 4096 (lm_head)
    prefill attention   batch 1..256 x new tokens per request 1..131072 x cached prefix 0..131072
    decode attention    batch 1..2048 x context per request 1..131072

The grid points are the database's answers at those shapes: at its measured shapes the measured
time, elsewhere its own interpolation between measurements. `simulator/kernel_cost.py` prices a
forward from these tables; `simulator/kernel_holdout.py` reports how far its prices are from the
database at measured shapes off the grids. The result is a profile file (`testbed calibrate
--source aiconfigurator` writes it) that `--profile` reads.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable

from scheduler.model_config import ModelConfig, load_model_config
from simulator.hardware import database_system_spec
from simulator.kernel_db import KernelDatabase, KernelDatabaseError, system_spec
from simulator.profile_cost import PROFILE_FORMAT, PROFILE_VERSION

SOURCE = "aiconfigurator"  # the profile's "source" (simulator/profiles.py dispatches on it)
Progress = Callable[[str, int, int], None]  # (phase, done, total)

TOP = 131072  # grids reach Llama 3.1's context; past their ends prices extrapolate (kernel_cost.py)
POWERS = [2**k for k in range(18)]  # 1 .. 131072
PREFILL_BATCH = [2**k for k in range(9)]  # 1 .. 256: the database measures prefill batches up to 256
PREFIX = [0, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, TOP]
DECODE_BATCH = [2**k for k in range(12)]  # 1 .. 2048, the database's decode batches
DECODE_CONTEXT = POWERS
REQUESTS = sorted({*range(1, 17), *(2**k for k in range(5, 13))})  # lm_head rows: 1 .. 4096
LAYER_OPS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "norms", "act_fn", "all_reduce")
SHAPE_KEYS = ("architecture", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim", "intermediate_size", "vocab_size", "qk_norm")


def model_shapes(model: ModelConfig) -> dict:
    """What a kernel profile depends on: a model with other values here needs another profile."""
    return {k: getattr(model, k) for k in SHAPE_KEYS}


def _seconds(x: float) -> float:
    return float(f"{x:.5g}")  # 5 significant digits: far below the database's own noise, a small file


@dataclass(frozen=True)
class GpuShapes:
    """The dimensions one of `tp` GPUs computes with (as SGLang and vLLM shard a Llama-family model)."""

    layers: int
    hidden: int
    head_dim: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tp: int
    qk_norm: bool

    @classmethod
    def of(cls, model: ModelConfig, tp: int) -> "GpuShapes":
        return cls(model.num_hidden_layers, model.hidden_size, model.head_dim, model.num_attention_heads // tp,
                   model.kv_heads_per_gpu(tp), model.intermediate_size // tp, -(-model.vocab_size // tp), tp, model.qk_norm)

    def layer_kernels(self, db: KernelDatabase, n: int) -> dict[str, float]:
        """Seconds of each non-attention kernel of one layer over n tokens."""
        h, d = self.hidden, self.head_dim
        return {
            "qkv_proj": db.gemm(n, (self.heads + 2 * self.kv_heads) * d, h),
            "o_proj": db.gemm(n, h, self.heads * d),
            "gate_up_proj": db.gemm(n, 2 * self.intermediate, h),
            "down_proj": db.gemm(n, h, self.intermediate),
            "norms": 2 * db.elementwise(n, 2 * h, 2 * h),
            "act_fn": db.elementwise(n, 2 * self.intermediate, self.intermediate),
            "all_reduce": 2 * db.all_reduce(n, h, self.tp),
        }

    def embedding(self, db: KernelDatabase, n: int) -> float:
        return db.embedding(n, self.vocab, self.hidden) + db.all_reduce(n, self.hidden, self.tp)

    def lm_head(self, db: KernelDatabase, requests: int) -> float:
        return db.gemm(requests, self.vocab, self.hidden)

    def prefill_attention(self, db: KernelDatabase, batch: int, new_tokens: int, prefix: int) -> float:
        return db.context_attention(batch, new_tokens, prefix, self.heads, self.kv_heads, self.head_dim, self.qk_norm)

    def decode_attention(self, db: KernelDatabase, batch: int, context: int) -> float:
        return db.generation_attention(batch, context, self.heads, self.kv_heads, self.head_dim, self.qk_norm)


def check_tp(system: str, model: ModelConfig, tp: int) -> None:
    """TP must split the model and fit in one node of the system (the database measures all-reduce there)."""
    model.check_tp(tp)
    per_node = int(system_spec(system).get("node", {}).get("num_gpus_per_node", 8))
    if tp > per_node:
        raise KernelDatabaseError(f"--tp {tp}: {system} has {per_node} GPUs a node, and the database measures "
                                  f"all-reduce within one node")


def build_kernel_profile(system: str, backend: str, backend_version: str | None, model: ModelConfig | str, tp: int = 1,
                         progress: Progress | None = None) -> dict:
    """The profile of `model` (a ModelConfig, or a name or path load_model_config takes) over `tp` GPUs
    of `system`, from `backend`'s kernels (version None: the newest the database maintains)."""
    t0 = time.perf_counter()
    if isinstance(model, str):
        model = load_model_config(model)
    db = KernelDatabase.open(system, backend, backend_version)
    check_tp(system, model, tp)
    g = GpuShapes.of(model, tp)
    tokens = sorted(set(db.measured_gemm_tokens()) | set(POWERS))

    phases = [("dense", len(tokens) + len(REQUESTS)), ("prefill attention", len(PREFILL_BATCH) * len(POWERS)),
              ("decode attention", len(DECODE_BATCH))]
    total = sum(n for _, n in phases)
    done = 0

    def tick(phase: str) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(phase, done, total)

    per_layer: dict[str, list[float]] = {op: [] for op in LAYER_OPS}
    embedding = []
    for n in tokens:
        for op, t in g.layer_kernels(db, n).items():
            per_layer[op].append(_seconds(t))
        embedding.append(_seconds(g.embedding(db, n)))
        tick("dense")
    lm_head = []
    for r in REQUESTS:
        lm_head.append(_seconds(g.lm_head(db, r)))
        tick("dense")
    prefill = []
    for b in PREFILL_BATCH:
        plane = []
        for s in POWERS:
            plane.append([_seconds(g.prefill_attention(db, b, s, p)) for p in PREFIX])
            tick("prefill attention")
        prefill.append(plane)
    decode = []
    for b in DECODE_BATCH:
        decode.append([_seconds(g.decode_attention(db, b, s)) for s in DECODE_CONTEXT])
        tick("decode attention")

    hardware = database_system_spec(system)
    profile = {
        "format": PROFILE_FORMAT,
        "version": PROFILE_VERSION,
        "source": SOURCE,
        "model": model.name,
        "model_shapes": model_shapes(model),
        "tp": tp,
        "hardware": system,
        # KV capacity follows from one GPU's memory (kv_capacity.py); the roofline's spec of the system.
        "hardware_spec": hardware.to_dict(),
        "database": db.describe(),
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "kernels": {
            "layers": g.layers,
            "tokens": tokens,
            "per_layer": per_layer,
            "per_forward": {"embedding": embedding},
            "requests": REQUESTS,
            "lm_head": lm_head,
            "prefill_attention": {"batch": PREFILL_BATCH, "new_tokens": POWERS, "prefix": PREFIX, "seconds": prefill},
            "decode_attention": {"batch": DECODE_BATCH, "context": DECODE_CONTEXT, "seconds": decode},
            # What a forward outside a CUDA graph costs beyond its kernels (simulator/cuda_graphs.py).
            "eager_overhead_s": _seconds(db.eager_forward_overhead(g.layers)),
        },
    }
    from simulator.kernel_holdout import holdout_errors

    profile["holdout"] = holdout_errors(profile, db, g)
    profile["wall_s"] = round(time.perf_counter() - t0, 1)
    return profile
