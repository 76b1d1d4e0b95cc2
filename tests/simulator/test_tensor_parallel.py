"""--tp: a model split over GPUs (weights, KV heads, KV pool), the roofline's all-reduces, and
--hardware naming one of AIConfigurator's systems."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import assert_clean_error

from scheduler.core.forward_plan import ForwardMode
from scheduler.model_config import ModelConfigError, load_model_config
from simulator.costs.roofline import RooflineCostModel
from simulator.hardware.kv_capacity import kv_capacity_tokens
from simulator.hardware.specs import HardwareConfigError, load_hardware
from simulator.profiles.kernel_catalog import system_spec
from simulator.profiles.kernel_holdout import uniform_plan
from testbed.options import ReplayOptions, resolved_options

REPO = Path(__file__).resolve().parents[2]


def test_a_model_split_over_gpus_holds_a_share_of_weights_and_kv():
    m = load_model_config("llama-3.1-70b")
    assert m.params_per_gpu(1) == m.num_params
    for tp in (2, 4, 8):
        # Heads, MLP columns and vocabulary divide; norms are replicated (a few MB).
        assert m.params_per_gpu(tp) == pytest.approx(m.num_params / tp, rel=0.002)
        assert m.kv_bytes_per_token(2, tp) == m.kv_bytes_per_token() // tp
    # 16 GPUs over 8 KV heads: each KV head lives on two GPUs, so a GPU holds 1 head, not 1/2.
    m.check_tp(16)
    assert m.kv_heads_per_gpu(16) == 1 and m.kv_bytes_per_token(2, 16) == m.kv_bytes_per_token() // 8


@pytest.mark.parametrize(
    "model, tp, needle",
    [
        ("llama-3.1-8b", 3, "32 attention heads"),
        ("qwen2.5-7b", 8, "28 attention heads"),
        ("llama-2-7b", 64, "64 does not divide"),
    ],
)
def test_a_tp_that_does_not_split_the_model_is_refused(model, tp, needle):
    with pytest.raises(ModelConfigError, match=needle):
        load_model_config(model).check_tp(tp)


def test_kv_capacity_comes_from_every_gpus_share():
    m, hw = load_model_config("llama-3.1-70b"), load_hardware("h100")
    with pytest.raises(ValueError, match="does not fit"):
        kv_capacity_tokens(m, hw)  # 141 GB of weights on one 80 GB GPU
    for tp in (4, 8):
        free = hw.memory_bytes * 0.88 - m.weight_bytes(2, tp) - hw.activation_reserve_bytes
        assert kv_capacity_tokens(m, hw, tp=tp) == int(free // m.kv_bytes_per_token(2, tp))
    assert kv_capacity_tokens(m, hw, tp=8) > 2 * kv_capacity_tokens(m, hw, tp=4)


def test_roofline_tp2_is_faster_per_step_but_slower_than_half():
    m, hw = load_model_config("llama-3.1-8b"), load_hardware("h100")
    one, two = RooflineCostModel(m, hw), RooflineCostModel(m, hw, tp=2)
    for plan in (
        uniform_plan(ForwardMode.DECODE, 32, 1, 2000),
        uniform_plan(ForwardMode.DECODE, 1, 1, 100),
        uniform_plan(ForwardMode.EXTEND, 1, 4096, 0),
        uniform_plan(ForwardMode.EXTEND, 4, 1000, 3000),
    ):
        t1, t2 = one.forward_time(plan), two.forward_time(plan)
        assert t1 / 2 < t2 < t1
    # The all-reduces: 2 per layer and one after the embedding, over the interconnect.
    plan = uniform_plan(ForwardMode.EXTEND, 1, 4096, 0)
    per = hw.interconnect_latency_s + 2 * (2 - 1) / 2 * 4096 * m.hidden_size * 2 / hw.interconnect_bandwidth
    assert two.breakdown(plan)["all_reduce_s"] == pytest.approx((2 * m.num_hidden_layers + 1) * per)
    assert one.breakdown(plan)["all_reduce_s"] == 0


def test_hardware_without_an_interconnect_takes_tp_1_only():
    with pytest.raises(HardwareConfigError, match="no interconnect"):
        RooflineCostModel(load_model_config("tiny-llama"), load_hardware("cpu"), tp=2)


@pytest.mark.parametrize("system", ["h100_sxm", "rtx_pro_6000_server", "a30", "l4"])
def test_the_databases_systems_are_hardware_specs(system):
    spec, hw = system_spec(system), load_hardware(system)
    assert hw.name == system
    assert hw.memory_bytes == spec["gpu"]["mem_capacity"] and hw.mem_bandwidth == spec["gpu"]["mem_bw"]
    assert hw.peak_flops == spec["gpu"]["bfloat16_tc_flops"] and hw.interconnect_bandwidth == spec["node"]["intra_node_bw"]
    # The roofline works for it: a decode step of an 8B model is about its weights over the bandwidth.
    m = load_model_config("llama-3.1-8b")
    t = RooflineCostModel(m, hw).forward_time(uniform_plan(ForwardMode.DECODE, 1, 1, 100))
    assert m.weight_bytes() / hw.mem_bandwidth < t < 3 * m.weight_bytes() / hw.mem_bandwidth


def test_replay_a_70b_model_at_tp4_on_a_database_system(tmp_path):
    """The README's command: roofline, TP 4, the database's h100_sxm spec."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "testbed.cli",
            "replay",
            "traces/a.json",
            "--mode",
            "sim",
            "--model",
            "llama-3.1-70b",
            "--tp",
            "4",
            "--hardware",
            "h100_sxm",
            "--max-requests",
            "40",
            "--out",
            str(out),
            "-q",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((out / "run.json").read_text())
    assert meta["options"]["tp"] == 4 and meta["hardware"] == "h100_sxm" and meta["cost_model"].endswith(",tp4")
    m = load_model_config("llama-3.1-70b")
    # Each GPU reserves what SGLang's rule does for a GPU of a TP-4 group.
    fraction = meta["options"]["mem_fraction_static"]
    assert fraction == resolved_options(ReplayOptions(hardware="h100_sxm", tp=4)).mem_fraction_static
    assert meta["summary"]["kv_tokens"] == kv_capacity_tokens(m, load_hardware("h100_sxm"), fraction, tp=4)


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, needles",
    [
        (["--model", "llama-3.1-8b", "--tp", "3"], ["--tp 3", "32 attention heads"]),
        (["--model", "llama-3.1-70b"], ["does not fit"]),
        (["--mode", "real", "--tp", "2"], ["--tp 2", "one device"]),
        (["--hardware", "h100_sxn"], ["h100_sxn", "h100_sxm"]),
    ],
)
def test_replay_bad_tp_or_hardware_is_one_line_exit_2(args, needles):
    proc = subprocess.run(
        [sys.executable, "-m", "testbed.cli", "replay", "traces/a.json", *args, "-q"], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert_clean_error(proc, *needles)
