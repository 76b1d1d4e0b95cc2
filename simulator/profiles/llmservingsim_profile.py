"""A kernel profile from LLMServingSim's timings of one GPU: the GPU's own kernels where AIConfigurator has none.

LLMServingSim's profiler (github.com/casys-kaist/LLMServingSim, `profiler/`) times each vLLM module
of a model's decoder layer on a GPU, for each TP degree it emulates on that GPU, and lays them out
as `meta.yaml` (the GPU, the vLLM version, the model) beside `tp<N>/`:

- `dense.csv` (`layer, tokens, time_us`): each module of one layer, and the model's embedding and
  final norm, by tokens in the batch;
- `per_sequence.csv` (`layer, sequences, time_us`): the LM head and the sampler, by sequences;
- `attention.csv`: one layer's attention for a prefill chunk over a cached prefix, decode batches,
  and both together (llmservingsim_attention.py).

Such a folder is a cost source of its own: this module lays it out in kernel_profile.py's format
(`source` "llmservingsim"), priced by the same KernelProfileCostModel. A forward is composed as
LLMServingSim composes it (its `profiler/models/<architecture>.yaml` sequence): each layer runs
layernorm, qkv_proj, [qk_norm], rotary_emb, attention, o_proj, layernorm, gate_up_proj, act_fn
and down_proj (dense.csv's `layernorm` twice); a forward adds the embedding and the final norm, and
each sequence the LM head and the sampler. Two things the files do not hold:

- TP's all-reduces (after o_proj and down_proj; LLMServingSim attaches them from its cluster
  config): a ring over the link given (interconnect_link.py), else over the hardware spec's
  interconnect;
- prefill batches of more than one request: attention.csv has one prefill chunk a row, so b equal
  chunks are priced as b times one (the kernel's work adds up once it is compute bound; a batch of
  short chunks, which shares one launch, is priced high).

A forward outside a CUDA graph pays vLLM's host dispatch, as a profile of the database does
(eager_dispatch.py). Mixtures of experts are refused: their expert timings are by token load,
which this reader does not lay out.
"""

from __future__ import annotations

import csv
import re
from datetime import datetime, timezone
from pathlib import Path

from scheduler.model_config import ModelConfig, bundled_model_of, load_model_config
from simulator.costs.llmservingsim_attention import AttentionTimingsError, read_timings
from simulator.costs.mixed_attention import from_llmservingsim as mixed_decode_factor_of
from simulator.costs.precision import BF16, Precision
from simulator.hardware.specs import hardware_of_device, load_hardware
from simulator.profiles.eager_dispatch import backend_dispatch_s
from simulator.profiles.interconnect_link import InterconnectLink
from simulator.profiles.kernel_catalog import KernelDatabaseError
from simulator.profiles.kernel_profile import profile_header

SOURCE = "llmservingsim"  # the profile's "source" (simulator/costs/sources.py)
PER_FORWARD = ("embedding", "final_layernorm")  # dense.csv's modules run once a forward, not a layer
TWICE_A_LAYER = ("layernorm",)  # the input and the post-attention RMSNorm, one row in dense.csv
ALL_REDUCES_A_LAYER = 2  # after o_proj and after down_proj (RowParallelLinear)


class TimingsFolderError(ValueError):
    """A folder of LLMServingSim's timings that cannot make a profile; str() names the file and why."""


def timings_meta(folder: Path) -> dict[str, str]:
    """meta.yaml's top-level scalars (gpu, vllm_version, model, variant...), as text."""
    path = folder / "meta.yaml"
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        raise TimingsFolderError(f"{path}: cannot read it ({e.strerror})") from None
    return {m.group(1): m.group(2).strip().strip("'\"") for m in re.finditer(r"^(\w+):[ \t]*(\S.*)$", text, re.M)}


def _by_op(path: Path, axis: str) -> dict[str, dict[int, float]]:
    """A dense.csv or per_sequence.csv: seconds by op, then by tokens (or sequences)."""
    table: dict[str, dict[int, float]] = {}
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            if not {"layer", axis, "time_us"} <= set(reader.fieldnames or []):
                raise TimingsFolderError(f"{path}: not LLMServingSim's timings: needs columns layer, {axis}, time_us")
            for line, row in enumerate(reader, start=2):
                try:
                    table.setdefault(row["layer"], {})[int(row[axis])] = float(row["time_us"]) * 1e-6
                except (TypeError, ValueError):
                    raise TimingsFolderError(f"{path}:{line}: not a number in {axis} or time_us") from None
    except OSError as e:
        raise TimingsFolderError(f"{path}: cannot read it ({e.strerror})") from None
    return table


def _on_grid(by_x: dict[int, float], grid: list[int], path: Path, op: str) -> list[float]:
    missing = [x for x in grid if x not in by_x]
    if missing:
        raise TimingsFolderError(f"{path}: {op} has no row at {missing[0]} (every op needs the same grid)")
    return [by_x[x] for x in grid]


def _full_grid(cells: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """A full grid (x by y) of the cells: the ys measured at half the xs or more, and the xs measured at
    all of those. A file may hold two sweeps that share a few shapes (the RTX PRO 6000's: steps of
    1.5x, 13 chunk sizes by 11 prefixes, and of 2x, 8 by 12); this keeps the larger whole."""
    ys_at: dict[int, set[int]] = {}
    for x, y in cells:
        ys_at.setdefault(x, set()).add(y)
    counts: dict[int, int] = {}
    for ys in ys_at.values():
        for y in ys:
            counts[y] = counts.get(y, 0) + 1
    common = {y for y, n in counts.items() if 2 * n >= len(ys_at)}
    return sorted(x for x, ys in ys_at.items() if common <= ys), sorted(common)


def build_llmservingsim_profile(
    folder: str | Path, model: ModelConfig | str, tp: int = 1, hardware: str | None = None, link: InterconnectLink | None = None
) -> dict:
    """The kernel profile of `model` at TP `tp` from the LLMServingSim timings in `folder` (its meta.yaml,
    and tp<tp>/ with dense.csv, per_sequence.csv and attention.csv). hardware: the GPU's spec (a bundled
    name, an AIConfigurator system or a JSON; default: the one meta.yaml's gpu names), for the KV pool
    and, without `link`, the interconnect of TP's all-reduces."""
    folder = Path(folder)
    meta = timings_meta(folder)
    if isinstance(model, str):
        model = load_model_config(model)
    if model.is_moe:
        raise TimingsFolderError(f"{folder}: {model.name} is a mixture of experts; LLMServingSim's expert timings are not read yet")
    timed = bundled_model_of(meta.get("model", ""))
    if timed != model.name:
        raise TimingsFolderError(f"{folder / 'meta.yaml'}: timings of {meta.get('model')!r}, not of {model.name}")
    tp_dir = folder / f"tp{tp}"
    if not tp_dir.is_dir():
        have = sorted(d.name for d in folder.glob("tp*") if d.is_dir())
        raise TimingsFolderError(f"{folder}: no timings at TP {tp} (tp{tp}/); it has {', '.join(have) or 'none'}")
    gpu = hardware or hardware_of_device(meta.get("gpu", ""))
    if gpu is None:
        raise TimingsFolderError(f"{folder / 'meta.yaml'}: no bundled hardware spec for its gpu {meta.get('gpu')!r}; give one (--hardware)")
    spec = load_hardware(gpu)

    dense = _by_op(tp_dir / "dense.csv", "tokens")
    heads = _by_op(tp_dir / "per_sequence.csv", "sequences")
    layer_ops = [op for op in dense if op not in PER_FORWARD]
    if not layer_ops or any(op not in dense for op in PER_FORWARD) or not {"lm_head", "sampler"} <= heads.keys():
        raise TimingsFolderError(
            f"{tp_dir}: needs a layer's ops, {', '.join(PER_FORWARD)} (dense.csv) and lm_head, sampler (per_sequence.csv)"
        )
    tokens = sorted(dense[layer_ops[0]])
    per_layer = {op: [(2.0 if op in TWICE_A_LAYER else 1.0) * t for t in _on_grid(dense[op], tokens, tp_dir, op)] for op in layer_ops}
    over = None  # the link TP's all-reduces cross (none at TP 1)
    if tp > 1:
        if link is None and spec.interconnect_bandwidth <= 0:
            raise TimingsFolderError(f"{folder}: TP {tp} on {gpu}, whose spec has no interconnect; give the link (--link-gbps)")
        over = link or InterconnectLink(spec.interconnect_bandwidth, spec.interconnect_latency_s, f"the {gpu} spec's interconnect")
        per_layer["all_reduce"] = [ALL_REDUCES_A_LAYER * over.all_reduce(n * model.hidden_size, tp) for n in tokens]
    requests = sorted(heads["lm_head"])
    lm_head = [
        a + b
        for a, b in zip(_on_grid(heads["lm_head"], requests, tp_dir, "lm_head"), _on_grid(heads["sampler"], requests, tp_dir, "sampler"))
    ]

    attention = tp_dir / "attention.csv"
    try:
        times = read_timings(attention)
        mixed = mixed_decode_factor_of(attention)
    except AttentionTimingsError as e:
        raise TimingsFolderError(str(e)) from None
    chunks, prefixes = _full_grid([(pc, kp) for pc, kp, nd, kd in times if pc and not nd])
    batches, contexts = _full_grid([(nd, kd) for pc, kp, nd, kd in times if nd and not pc])

    def at(shape: tuple[int, int, int, int]) -> float:
        if shape not in times:
            raise TimingsFolderError(f"{attention}: no row of prefill_chunk, kv_prefill, n_decode, kv_decode = {shape} (needs a full grid)")
        return times[shape] * 1e-6

    one_chunk = [[at((s, p, 0, 0)) for p in prefixes] for s in chunks]
    prefill = [[[b * t for t in row] for row in one_chunk] for b in (1, 2)]  # b equal chunks: b times one
    decode = [[at((0, 0, b, c)) for c in contexts] for b in batches]

    try:
        eager_overhead_s = backend_dispatch_s("vllm", model, model.num_hidden_layers)
    except KernelDatabaseError as e:  # vLLM's host dispatch is AIConfigurator's term
        raise TimingsFolderError(f"{folder}: vLLM's eager dispatch term: {e}") from None
    precision = Precision.resolve(model.torch_dtype, None, "auto", model.checkpoint_quantization, model.checkpoint_quantizes_experts_only)
    if precision.weights != BF16 or meta.get("variant", "bf16") != "bf16":
        raise TimingsFolderError(f"{folder}: timings of {meta.get('variant')!r} weights; only bf16 ones are read")
    source = f"{tp_dir}/ (LLMServingSim's timings under vLLM {meta.get('vllm_version', '?')})"
    return {
        **profile_header(SOURCE, model, tp),
        "expert_imbalance": None,
        "hardware": gpu,
        "hardware_spec": spec.to_dict(),
        "database": {
            "source": SOURCE,
            "timings": str(tp_dir),
            "gpu": meta.get("gpu"),
            "backend": "vllm",
            "backend_version": meta.get("vllm_version"),
        },
        "all_reduce": over.describe() if over else None,
        "precision": precision.to_dict()
        | {
            "gemm": {"quant_mode": BF16, "kernel": f"vLLM's modules as timed in {source}"},
            "lm_head": {"quant_mode": BF16, "kernel": "LogitsProcessor and Sampler, per_sequence.csv"},
            "prefill_attention": {"kv_cache": BF16, "kernel": "attention.csv's prefill chunks (b of them: b times one)"},
            "decode_attention": {"kv_cache": BF16, "kernel": "attention.csv's decode batches"},
        },
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "kernels": {
            "layers": model.num_hidden_layers,
            "tokens": tokens,
            "per_layer": per_layer,
            "per_forward": {op: _on_grid(dense[op], tokens, tp_dir, op) for op in PER_FORWARD},
            "requests": requests,
            "lm_head": lm_head,
            "prefill_attention": {"batch": [1, 2], "new_tokens": chunks, "prefix": prefixes, "seconds": prefill},
            "decode_attention": {"batch": batches, "context": contexts, "seconds": decode},
            "eager_overhead_s": eager_overhead_s,
            "mixed_decode_factor": mixed.to_dict(),
        },
    }
