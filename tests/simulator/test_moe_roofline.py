"""The roofline of mixtures of experts and MLA (simulator/costs/moe_roofline.py), the experts' load
(expert_load.py) and KV sizing with --ep / --dp."""

from __future__ import annotations

import random

import numpy as np
import pytest

from scheduler.core.forward_plan import ForwardMode, ForwardPlan, synthetic_plan
from scheduler.core.ids import ids
from scheduler.model_config import ModelConfigError, load_model_config
from simulator.costs.expert_load import ExpertLoad, apportion, remote_ranks_per_token
from simulator.costs.moe_roofline import MoeRooflineCostModel, decode_floor_s, roofline_cost_model
from simulator.costs.precision import Precision
from simulator.costs.roofline import RooflineCostModel
from simulator.hardware.kv_capacity import kv_capacity_tokens
from simulator.hardware.specs import load_hardware

# (model, hardware, tp, ep, dp): each bundled family on GPUs it fits.
LAYOUTS = [
    ("qwen3-30b-a3b", "h100", 1, 1, 1),
    ("qwen3-235b-a22b", "h100", 8, 8, 1),
    ("mixtral-8x7b", "h100", 2, 1, 1),
    ("deepseek-v3", "h200", 8, 1, 1),
    ("deepseek-r1", "h200", 1, 8, 8),
    ("gpt-oss-120b", "h100", 1, 1, 1),
]


def _precision(model) -> Precision:
    return Precision.resolve(model.torch_dtype, None, "auto", model.checkpoint_quantization, model.checkpoint_quantizes_experts_only)


def _cost(name, hw, tp=1, ep=1, dp=1, alpha=None, per_component=True):
    m = load_model_config(name)
    return MoeRooflineCostModel(m, load_hardware(hw), 2, per_component, tp, _precision(m), ep, dp, alpha)


def _decode(batch: int, context: int) -> ForwardPlan:
    return synthetic_plan(ForwardMode.DECODE, [context] * batch, [1] * batch, False)


@pytest.mark.parametrize("name, hw, tp, ep, dp", LAYOUTS)
def test_a_batch_1_decode_step_reads_the_active_weights_at_hbm_bandwidth(name, hw, tp, ep, dp):
    """At batch 1 a decode step is the weights one token touches (everything but the routed experts,
    and its k experts) over HBM bandwidth: the roofline's memory terms are that floor at the spec's
    bandwidth efficiency (plus a short context's KV and activations), the step no faster than it."""
    cost = _cost(name, hw, tp, ep, dp)
    model, spec = cost.model, cost.hw
    floor = decode_floor_s(model, spec, cost.precision, tp, ep, dp)
    b = cost.breakdown(_decode(1, 100))
    assert b["experts_touched"] == pytest.approx(model.num_experts_per_tok / ep)
    weights = b["dense_memory_s"] + b["expert_memory_s"]
    assert weights == pytest.approx(floor / spec.bandwidth_efficiency, rel=0.01)
    assert floor < b["total_s"] < floor / spec.bandwidth_efficiency + b["overhead_s"] + b["communication_s"] + 1e-4
    # A batch that touches every expert reads far more: all of them, E / ep a rank.
    big = cost.breakdown(_decode(512, 100))
    assert big["experts_touched"] == pytest.approx(model.num_experts / ep, rel=0.01)
    assert big["expert_memory_s"] > 3 * b["expert_memory_s"]


def test_the_balanced_load_is_the_expected_experts_a_batch_touches():
    load = ExpertLoad(256, 8, ep=8)
    for n in (1, 7, 64, 1000):
        a, u = load.busiest_rank(n)
        assert a == n * 8 / 8
        assert u == pytest.approx(32 * (1 - (1 - 8 / 256) ** n))
    # Monte Carlo of distinct top-8 picks agrees.
    rng = np.random.default_rng(1)
    touched = [len({int(e) for _ in range(64) for e in rng.choice(256, 8, replace=False)}) for _ in range(200)]
    assert np.mean(touched) == pytest.approx(256 * (1 - (1 - 8 / 256) ** 64), rel=0.02)


def test_the_power_law_load_is_deterministic_and_never_lighter_on_the_busiest_rank():
    balanced, skewed = ExpertLoad(256, 8, ep=8), ExpertLoad(256, 8, ep=8, alpha=1.01)
    for n in (1, 16, 256, 8192):
        a, u = skewed.busiest_rank(n)
        assert (a, u) == ExpertLoad(256, 8, ep=8, alpha=1.01).busiest_rank(n)  # seeded
        assert a >= balanced.busiest_rank(n)[0] - 1e-9 and a <= n * 8
        assert 0 < u <= 32
    # One rank of all: every assignment is its; the skew only touches fewer experts.
    a1, u1 = ExpertLoad(128, 8, 1, 1.01).busiest_rank(64)
    assert a1 == 512 and u1 < ExpertLoad(128, 8).busiest_rank(64)[1]


def test_apportion_keeps_the_total_and_remote_ranks_count_distinct_ones():
    rng = np.random.default_rng(0)
    counts = apportion(rng.random((10, 33)), 1000)
    assert (counts.sum(axis=1) == 1000).all() and (counts >= 0).all()
    assert remote_ranks_per_token(256, 8, 1) == 0.0
    assert remote_ranks_per_token(8, 8, 8) == pytest.approx(7)  # every expert, so every other rank
    assert 0 < remote_ranks_per_token(256, 8, 8) < 7


def test_imbalance_slows_a_prefill_over_ep_ranks():
    balanced, skewed = _cost("deepseek-v3", "h200", 8, 8), _cost("deepseek-v3", "h200", 8, 8, alpha=1.01)
    prefill = synthetic_plan(ForwardMode.EXTEND, [0], [8192], False)
    assert skewed.forward_time(prefill) > 1.05 * balanced.forward_time(prefill)
    assert skewed.name.endswith(",imbalance1.01") and ",ep8" in skewed.name


@pytest.mark.parametrize("per_component", [True, False])
@pytest.mark.parametrize(
    "name, hw, tp, ep, dp, alpha",
    [(*layout, None) for layout in LAYOUTS] + [("deepseek-v3", "h200", 8, 8, 1, 1.01), ("qwen3-30b-a3b", "h100", 1, 4, 4, 0.8)],
)
def test_a_stretch_is_priced_as_each_step_alone(name, hw, tp, ep, dp, alpha, per_component):
    """decode_forward_times equals forward_time on each step's plan, float for float (MLA's two paths,
    gpt-oss's sliding windows, DP shares, the power law's cache)."""
    cost = _cost(name, hw, tp, ep, dp, alpha, per_component)
    rnd = random.Random(7)
    for bs, longest in ((1, 3000), (5, 100), (64, 30_000), (256, 50)):
        seq_lens = [rnd.randint(1, longest) for _ in range(bs)]
        bulk = cost.decode_forward_times(bs, sum(seq_lens), max(seq_lens) + 1, 60)
        for j in range(60):
            before = [s + j for s in seq_lens]
            plan = ForwardPlan(
                ForwardMode.DECODE,
                list(range(bs)),
                before,
                [1] * bs,
                [s + 1 for s in before],
                [],
                [True] * bs,
                ids(),
                num_tokens=bs,
                sum_seq_len=sum(before) + bs,
                sum_prefix_len=sum(before),
                attention_pairs=float(sum(before) + bs),
                max_seq_len=max(before) + 1,
            )
            assert bulk[j] == cost.forward_time(plan)


def test_mla_decode_reads_the_latent_and_prefill_decompresses():
    cost = _cost("deepseek-v3", "h200", 8)
    decode = cost.breakdown(_decode(64, 4000))
    # The latent of every request's context, bf16: 70,272 bytes a token, whole on every GPU of TP 8.
    kv_s = 64 * 4001 * 70272 / (cost.hw.mem_bandwidth * cost.hw.bandwidth_efficiency)
    assert decode["attn_memory_s"] == pytest.approx(kv_s, rel=0.001)
    # Absorbed in decode: 2 x 16 heads x (2 x 512 + 64) x 61 layers a pair.
    pairs = 64 * 4001
    assert decode["attn_compute_s"] == pytest.approx(pairs * 2 * 16 * 1088 * 61 / (cost.hw.peak_flops * cost.hw.compute_efficiency))
    # A fresh prompt takes the decompressed path: 2 x 16 x (128 + 64 + 128) x 61 a pair, no prefix to expand.
    prefill = synthetic_plan(ForwardMode.EXTEND, [0], [4096], False)
    b = cost.breakdown(prefill)
    assert b["attn_compute_s"] == pytest.approx(
        prefill.attention_pairs * 2 * 16 * 320 * 61 / (cost.hw.peak_flops * cost.hw.compute_efficiency)
    )


def test_sliding_window_layers_read_at_most_the_window():
    cost = _cost("gpt-oss-120b", "h100")
    short, long = cost.breakdown(_decode(8, 100)), cost.breakdown(_decode(8, 20_000))
    # Half the layers read the whole context, half at most 128 tokens: 20,000 tokens cost ~half of 200x.
    per_token = (long["attn_memory_s"] - short["attn_memory_s"]) / (8 * 19_900)
    full = 2 * 8 * 64 * 2 / (cost.hw.mem_bandwidth * cost.hw.bandwidth_efficiency)  # K and V of one layer: 8 heads of 64, bf16
    assert per_token == pytest.approx(18 * full, rel=0.01)


def test_dp_attention_shares_the_batch_and_pays_the_all_to_all():
    tp8 = _cost("deepseek-v3", "h200", 8, 8, 1)
    dp8 = _cost("deepseek-v3", "h200", 1, 8, 8)
    b = dp8.breakdown(_decode(64, 2000))
    assert b["busiest_rank_share"] == 8 / 64
    assert b["attn_memory_s"] == pytest.approx(tp8.breakdown(_decode(64, 2000))["attn_memory_s"] / 8, rel=1e-9)
    assert b["communication_s"] > 2 * 58 * dp8.hw.interconnect_latency_s  # dispatch and combine in every MoE layer
    assert dp8.breakdown(_decode(5, 2000))["busiest_rank_share"] == 1 / 5  # fewer requests than ranks: one each


def test_kv_pool_per_rank():
    h200 = load_hardware("h200")
    ds = load_model_config("deepseek-v3")
    fp8 = _precision(ds)
    assert fp8.weights == "fp8_block"  # the checkpoint's format, --quantization unset
    tp8 = kv_capacity_tokens(ds, h200, 0.88, tp=8, precision=fp8)
    per_gpu_weights = ds.weight_bytes(2, 8, linear_bytes=1)
    assert tp8 == int((h200.memory_bytes * 0.88 - per_gpu_weights - h200.activation_reserve_bytes) // 70272)
    dp8 = kv_capacity_tokens(ds, h200, 0.88, tp=1, precision=fp8, ep=8, dp=8)
    assert dp8 % 8 == 0 and dp8 > 3 * tp8  # each rank its own requests' latents, one rank's weights a bit larger
    with pytest.raises(ValueError, match=r"does not fit on 'h200' x 8 \(TP 8, DP 1, EP 8\)"):
        kv_capacity_tokens(ds, h200, 0.88, tp=8, precision=Precision(), ep=8)  # bf16 weights: 1.34 TB
    with pytest.raises(ValueError, match="does not fit"):
        kv_capacity_tokens(load_model_config("qwen3-235b-a22b"), load_hardware("h100"), 0.88)
    oss = load_model_config("gpt-oss-120b")
    assert kv_capacity_tokens(oss, load_hardware("h100"), 0.88, precision=_precision(oss)) > 10_000  # mxfp4 experts fit one H100


def test_the_dense_roofline_stays_for_dense_models():
    m, hw = load_model_config("llama-3.1-8b"), load_hardware("h100")
    cost = roofline_cost_model(m, hw, 2)
    assert type(cost) is RooflineCostModel
    plan = _decode(32, 1000)
    assert cost.forward_time(plan) == RooflineCostModel(m, hw, tp=2).forward_time(plan)
    with pytest.raises(ModelConfigError, match="dense model"):
        roofline_cost_model(m, hw, 2, ep=2)
    with pytest.raises(ValueError, match="dense model"):
        roofline_cost_model(m, hw, 1, expert_imbalance=1.01)
    assert type(roofline_cost_model(load_model_config("mixtral-8x7b"), hw, 2)) is MoeRooflineCostModel
