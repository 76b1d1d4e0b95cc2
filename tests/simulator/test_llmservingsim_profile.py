"""Kernel profiles from LLMServingSim's timings of a GPU (simulator/profiles/llmservingsim_profile.py,
`testbed calibrate --source llmservingsim`): the real timings in ground_truth/, checked against the
physics of a decode and against AIConfigurator's database, an independent source of the same GPU."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import assert_clean_error

from scheduler.core.forward_plan import ForwardMode
from scheduler.model_config import load_model_config
from simulator.costs.kernel_cost import KernelProfileCostModel
from simulator.profiles.interconnect_link import InterconnectLink
from simulator.profiles.kernel_holdout import uniform_plan
from simulator.profiles.llmservingsim_profile import TimingsFolderError, build_llmservingsim_profile
from testbed.calibrate_kernels import hbm_floor_s

REPO = Path(__file__).resolve().parents[2]
RTX4090 = REPO / "ground_truth" / "ops-rtx4090-llama-3.1-8b"
RTXPRO6000_QWEN = REPO / "ground_truth" / "ops-rtxpro6000-qwen3-32b"
PCIE = InterconnectLink(16e9, 20e-6, "the runs' cluster config")


def test_a_decode_at_batch_1_reads_the_weights_once_at_the_gpus_bandwidth():
    profile = build_llmservingsim_profile(RTX4090, "llama-3.1-8b")
    cost = KernelProfileCostModel(profile)
    floor = hbm_floor_s(load_model_config("llama-3.1-8b"), 1, profile["hardware_spec"]["mem_bandwidth"])
    assert 1.0 < cost.forward_time(uniform_plan(ForwardMode.DECODE, 1, 1, 1023)) / floor < 1.2


def test_a_layer_is_its_modules_once_and_its_norm_twice_as_llmservingsim_composes_it():
    with open(RTX4090 / "tp1" / "dense.csv", newline="") as f:
        at_64 = {r["layer"]: float(r["time_us"]) * 1e-6 for r in csv.DictReader(f) if r["tokens"] == "64"}
    k = build_llmservingsim_profile(RTX4090, "llama-3.1-8b")["kernels"]
    i = k["tokens"].index(64)
    layer = sum(t for op, t in at_64.items() if op not in ("embedding", "final_layernorm")) + at_64["layernorm"]
    assert sum(ts[i] for ts in k["per_layer"].values()) == pytest.approx(layer)
    assert sum(ts[i] for ts in k["per_forward"].values()) == pytest.approx(at_64["embedding"] + at_64["final_layernorm"])


def test_two_independent_sources_of_one_gpus_kernels_agree():
    """AIConfigurator's database and LLMServingSim's profiler timed the RTX PRO 6000 apart; over the same
    PCIe link, with the same decode attention, Qwen3-32B's forwards at TP 2 come out within 5%."""
    from simulator.profiles.kernel_profile import build_kernel_profile

    own = KernelProfileCostModel(build_llmservingsim_profile(RTXPRO6000_QWEN, "qwen3-32b", 2, hardware="rtx_pro_6000_server", link=PCIE))
    database = KernelProfileCostModel(
        build_kernel_profile(
            "rtx_pro_6000_server",
            "vllm",
            None,
            "qwen3-32b",
            2,
            holdout=False,
            link=PCIE,
            decode_attention=RTXPRO6000_QWEN / "tp2" / "attention.csv",
        )
    )
    plans = [uniform_plan(ForwardMode.DECODE, b, 1, 1023) for b in (1, 8, 32, 128)]
    plans += [uniform_plan(ForwardMode.EXTEND, 1, n, 0) for n in (512, 2048)]
    for plan in plans:
        assert own.kernel_time(plan) == pytest.approx(database.kernel_time(plan), rel=0.05), plan.num_tokens


def test_timings_of_another_model_or_tp_are_refused_naming_them():
    with pytest.raises(TimingsFolderError, match="timings of 'meta-llama/Llama-3.1-8B', not of qwen3-8b"):
        build_llmservingsim_profile(RTX4090, "qwen3-8b")
    with pytest.raises(TimingsFolderError, match="no timings at TP 2 \\(tp2/\\); it has tp1"):
        build_llmservingsim_profile(RTX4090, "llama-3.1-8b", 2)


@pytest.mark.slow
def test_calibrate_writes_a_profile_a_replay_takes(tmp_path):
    cli = [sys.executable, "-m", "testbed.cli"]
    out = tmp_path / "rtx4090.json"
    made = subprocess.run(
        [*cli, "calibrate", "--source", "llmservingsim", "--timings", RTX4090, "--out", out], capture_output=True, text=True, cwd=REPO
    )
    assert made.returncode == 0, made.stderr
    assert "llama-3.1-8b at TP 1 on rtx4090 (NVIDIA GeForce RTX 4090)" in made.stdout
    run = subprocess.run(
        [
            *cli,
            "replay",
            REPO / "traces" / "a.json",
            "--mode",
            "sim",
            "--scheduler",
            "vllm",
            "--model",
            "llama-3.1-8b",
            "--profile",
            out,
            "-q",
            "--out",
            tmp_path / "run",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert run.returncode == 0, run.stderr
    assert_clean_error(
        subprocess.run([*cli, "calibrate", "--source", "llmservingsim", "--timings", tmp_path], capture_output=True, text=True, cwd=REPO),
        "--timings",
        "no meta.yaml",
    )
    assert_clean_error(
        subprocess.run(
            [*cli, "calibrate", "--source", "llmservingsim", "--timings", RTX4090, "--tp", "2"], capture_output=True, text=True, cwd=REPO
        ),
        "no timings at TP 2",
    )


def test_each_gpus_own_grid_is_read_whole():
    """The RTX 4090's files sweep powers of two; the RTX PRO 6000's hold steps of 1.5x (16, 24, 36, ...
    2,048 new tokens over prefixes 0, 512, 768, ... 16,384) beside a smaller sweep of 2x: the larger
    sweep makes the table whole, not the few shapes the two share."""
    fine = build_llmservingsim_profile(RTXPRO6000_QWEN, "qwen3-32b", 2, hardware="rtx_pro_6000_server")["kernels"]["prefill_attention"]
    assert len(fine["new_tokens"]) == 13 and (fine["new_tokens"][0], fine["new_tokens"][-1]) == (16, 2048)
    assert len(fine["prefix"]) == 11 and (fine["prefix"][1], fine["prefix"][-1]) == (512, 16384)
    coarse = build_llmservingsim_profile(RTX4090, "llama-3.1-8b")["kernels"]["prefill_attention"]
    assert coarse["new_tokens"] == [2**k for k in range(4, 12)]
