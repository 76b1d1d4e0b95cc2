"""Hardware specs, the roofline cost model and KV sizing, on real model and hardware numbers."""

from __future__ import annotations

import json
import time

import pytest

from scheduler.core.forward_plan import ForwardMode, ForwardPlan
from scheduler.model_config import load_model_config
from simulator.costs.cost_model import CostModel, CpuStageCosts, StageCost
from simulator.costs.roofline import RooflineCostModel
from simulator.hardware.kv_capacity import kv_capacity_tokens
from simulator.hardware.specs import (
    HardwareConfigError,
    HardwareSpec,
    bundled_hardware_names,
    load_hardware,
)


def make_plan(prefix_lens: list[int], extend_lens: list[int], mode: ForwardMode | None = None) -> ForwardPlan:
    assert len(prefix_lens) == len(extend_lens)
    b = len(prefix_lens)
    if mode is None:
        mode = ForwardMode.DECODE if all(e == 1 for e in extend_lens) else ForwardMode.EXTEND
    n, s, p, a, longest = ForwardPlan.summarize(prefix_lens, extend_lens)
    return ForwardPlan(
        mode=mode,
        req_pool_indices=list(range(b)),
        prefix_lens=list(prefix_lens),
        extend_lens=list(extend_lens),
        seq_lens=[x + y for x, y in zip(prefix_lens, extend_lens)],
        sampling=[],
        sample=[True] * b,
        out_cache_loc=[],
        num_tokens=n,
        sum_seq_len=s,
        sum_prefix_len=p,
        attention_pairs=a,
        max_seq_len=longest,
    )


def decode(batch: int, context: int) -> ForwardPlan:
    """A decode step of `batch` requests, each with `context` tokens after it."""
    return make_plan([context - 1] * batch, [1] * batch)


def prefill(new_tokens: int, prefix: int = 0) -> ForwardPlan:
    return make_plan([prefix], [new_tokens])


@pytest.fixture(scope="module")
def llama_h100() -> RooflineCostModel:
    return RooflineCostModel(load_model_config("llama-3.1-8b"), load_hardware("h100"))


@pytest.fixture(scope="module")
def tiny_cpu() -> RooflineCostModel:
    return RooflineCostModel(load_model_config("tiny-llama"), load_hardware("cpu"))


# ------------------------------------------------------------------ hardware
def test_bundled_hardware():
    assert {"h100", "h200", "a100", "cpu"} <= set(bundled_hardware_names())
    h100 = load_hardware("H100")
    assert h100.name == "h100"
    assert h100.peak_flops == 989e12 and h100.mem_bandwidth == 3.35e12
    assert 79 * 2**30 < h100.memory_bytes <= 80 * 2**30
    h200 = load_hardware("h200")
    assert h200.mem_bandwidth == 4.8e12 and h200.memory_bytes > 130 * 2**30
    a100 = load_hardware("a100")
    assert a100.peak_flops == 312e12 and a100.mem_bandwidth == 2.039e12
    cpu = load_hardware("cpu")
    assert cpu.kernel_launch_s >= 1e-3 > h100.kernel_launch_s


def test_hardware_round_trip_and_path(tmp_path):
    spec = load_hardware("h100")
    path = tmp_path / "my-gpu.json"
    d = spec.to_dict()
    d["name"] = "my-gpu"
    d["cpu"]["schedule"]["base_s"] = 1e-3
    path.write_text(json.dumps(d))
    mine = load_hardware(str(path))
    assert mine.name == "my-gpu"
    assert mine.cpu.schedule.base_s == 1e-3
    assert mine.peak_flops == spec.peak_flops


def test_hardware_errors(tmp_path):
    with pytest.raises(HardwareConfigError) as e:
        load_hardware("tpu-v9")
    assert "tpu-v9" in str(e.value) and "h100" in str(e.value)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"peak_flops": 1e12, "mem_bandwidth": 1e11, "memory_bytes": 1, "flops": 3}))
    with pytest.raises(HardwareConfigError, match="unknown keys"):
        load_hardware(bad)
    with pytest.raises(HardwareConfigError, match="compute_efficiency"):
        HardwareSpec("x", 1e12, 1e11, 1 << 30, compute_efficiency=1.5)


# ---------------------------------------------------------------- CPU stages
def test_cpu_stage_costs():
    costs = CpuStageCosts(schedule=StageCost(100e-6, 2e-6, 0.0))
    assert costs.time("schedule", 0, 0) == pytest.approx(100e-6)
    assert costs.time("schedule", 10, 500) == pytest.approx(120e-6)
    assert costs.time("launch", 1, 1) > 0 and costs.time("process", 1, 1) > 0
    with pytest.raises(ValueError, match="unknown CPU stage"):
        costs.time("sample", 1, 1)
    assert CpuStageCosts.from_dict(costs.to_dict()) == costs


def test_cpu_time_from_hardware(llama_h100, tiny_cpu):
    hw = llama_h100.hw
    assert llama_h100.cpu_time("schedule", 4, 100) == pytest.approx(hw.cpu.schedule(4, 100))
    assert llama_h100.cpu_time("launch", 1, 1) >= 300e-6
    assert llama_h100.cpu_time("process", 64, 64) > llama_h100.cpu_time("process", 1, 1)
    # The slow host of the CPU profile charges more for the same work.
    assert tiny_cpu.cpu_time("schedule", 8, 8) > llama_h100.cpu_time("schedule", 8, 8)


# ------------------------------------------------------------------ roofline
def test_satisfies_protocol(llama_h100):
    assert isinstance(llama_h100, CostModel)
    assert llama_h100.name == "roofline:llama-3.1-8b@h100"


def test_llama_h100_sanity(llama_h100):
    assert 5e-3 <= llama_h100.forward_time(decode(1, 1024)) <= 8e-3
    assert 8e-3 <= llama_h100.forward_time(decode(64, 1024)) <= 15e-3
    assert 0.15 <= llama_h100.forward_time(prefill(8192)) <= 0.4


def test_decode_grows_with_batch_and_context(llama_h100):
    batches = [llama_h100.forward_time(decode(b, 1024)) for b in (1, 2, 8, 32, 64, 128, 256)]
    assert batches == sorted(batches) and batches[-1] > batches[0]
    contexts = [llama_h100.forward_time(decode(32, c)) for c in (128, 1024, 4096, 32768)]
    assert contexts == sorted(contexts) and contexts[-1] > 2 * contexts[0]


def test_prefill_grows_with_tokens_and_prefix(llama_h100):
    lengths = [llama_h100.forward_time(prefill(n)) for n in (16, 256, 1024, 4096, 8192)]
    assert lengths == sorted(lengths)
    # Long prefill is compute bound: roughly linear, attention makes it superlinear.
    assert lengths[-1] > 1.9 * lengths[-2]
    prefixes = [llama_h100.forward_time(prefill(1024, p)) for p in (0, 1024, 8192, 65536)]
    assert prefixes == sorted(prefixes) and prefixes[-1] > prefixes[0]
    # Reusing a cached prefix is far cheaper than recomputing it.
    assert llama_h100.forward_time(prefill(1024, 7168)) < 0.5 * llama_h100.forward_time(prefill(8192))


def test_mixed_batch_costs_at_least_its_parts(llama_h100):
    mixed = make_plan([0] + [1023] * 32, [512] + [1] * 32, ForwardMode.MIXED)
    t = llama_h100.forward_time(mixed)
    assert t >= llama_h100.forward_time(prefill(512))
    assert t >= llama_h100.forward_time(decode(32, 1024))
    # ...but one forward shares the weight reads, so it beats running both.
    assert t < llama_h100.forward_time(prefill(512)) + llama_h100.forward_time(decode(32, 1024))


def test_per_component_is_an_upper_bound_of_classic_roofline():
    model, hw = load_model_config("llama-3.1-8b"), load_hardware("h100")
    split = RooflineCostModel(model, hw)
    classic = RooflineCostModel(model, hw, per_component=False)
    for plan in (decode(1, 1024), decode(64, 4096), prefill(8192), prefill(512, 4096)):
        assert split.forward_time(plan) >= classic.forward_time(plan) * (1 - 1e-12) > 0


def test_faster_hardware_is_faster():
    model = load_model_config("llama-3.1-8b")
    times = {h: RooflineCostModel(model, load_hardware(h)) for h in ("a100", "h100", "h200")}
    d = decode(32, 2048)
    assert times["h200"].forward_time(d) < times["h100"].forward_time(d) < times["a100"].forward_time(d)
    p = prefill(4096)
    assert times["h100"].forward_time(p) < times["a100"].forward_time(p)


def test_smaller_model_is_faster():
    hw = load_hardware("h100")
    big = RooflineCostModel(load_model_config("llama-3.1-8b"), hw)
    small = RooflineCostModel(load_model_config("qwen2.5-0.5b"), hw)
    for plan in (decode(16, 1024), prefill(2048)):
        assert small.forward_time(plan) < big.forward_time(plan)


def test_tiny_llama_on_cpu(tiny_cpu):
    # Fixed per-forward cost dominates small forwards of a tiny model.
    d1 = tiny_cpu.forward_time(decode(1, 128))
    assert 1e-3 <= d1 <= 5e-3
    assert tiny_cpu.forward_time(decode(16, 1024)) > d1
    assert tiny_cpu.forward_time(prefill(2048)) > tiny_cpu.forward_time(prefill(128)) > d1


def test_idle_and_unsummarized_plans(llama_h100):
    idle = ForwardPlan(ForwardMode.IDLE, [], [], [], [], [], [], [], [], [])
    assert llama_h100.forward_time(idle) == 0.0
    raw = decode(4, 100)
    raw.num_tokens = 0  # summaries not filled
    with pytest.raises(ValueError, match="summaries"):
        llama_h100.forward_time(raw)


def test_breakdown_adds_up(llama_h100):
    b = llama_h100.breakdown(decode(64, 1024))
    total = b["overhead_s"] + max(b["dense_compute_s"], b["dense_memory_s"])
    total += max(b["attn_compute_s"], b["attn_memory_s"])
    assert total == pytest.approx(b["total_s"])
    assert b["dense_memory_s"] > b["dense_compute_s"]  # decode is memory bound


def test_forward_time_is_fast(llama_h100):
    plan = make_plan([1000] * 200, [1] * 199 + [300], ForwardMode.MIXED)
    n = 20000
    start = time.perf_counter()
    for _ in range(n):
        llama_h100.forward_time(plan)
    per_call = (time.perf_counter() - start) / n
    assert per_call < 10e-6, f"{per_call * 1e6:.2f} µs per call"


# --------------------------------------------------------------- KV capacity
def test_kv_capacity_llama_h100():
    model, hw = load_model_config("llama-3.1-8b"), load_hardware("h100")
    tokens = kv_capacity_tokens(model, hw)
    assert 400_000 <= tokens <= 500_000
    assert kv_capacity_tokens(model, hw, mem_fraction_static=0.5) < tokens
    paged = kv_capacity_tokens(model, hw, page_size=64)
    assert paged % 64 == 0 and tokens - 64 < paged <= tokens
    # fp8 weights and KV: half the bytes per token and more room left for them.
    assert kv_capacity_tokens(model, hw, dtype_bytes=1) > 2 * tokens
    assert kv_capacity_tokens(model, load_hardware("h200")) > 1.8 * tokens


def test_kv_capacity_errors():
    model = load_model_config("llama-3.1-8b")
    small = HardwareSpec("small-gpu", 100e12, 1e12, 16 * 2**30)
    with pytest.raises(ValueError, match="does not fit"):
        kv_capacity_tokens(model, small)
    with pytest.raises(ValueError, match="mem_fraction_static"):
        kv_capacity_tokens(model, load_hardware("h100"), mem_fraction_static=0)
    with pytest.raises(ValueError, match="page_size"):
        kv_capacity_tokens(model, load_hardware("h100"), page_size=0)


def test_kv_capacity_tiny_llama_cpu():
    tokens = kv_capacity_tokens(load_model_config("tiny-llama"), load_hardware("cpu"), page_size=16)
    assert tokens > 1_000_000 and tokens % 16 == 0
