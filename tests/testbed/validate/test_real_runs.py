"""`testbed validate --runs` on the real vLLM runs in ground_truth/ (LLMServingSim's, measured on GPUs
this repository was not built against): a TP-2 model whose GPUs all-reduce over PCIe, a mixture of
experts under data and expert parallelism, and an RTX 4090, which AIConfigurator has no kernels of.

Each is replayed with its engine's settings, its layout, the GPU's own timings beside it and the
link its cluster config gives, and lands where a user of the simulator would want it: TPOT within
5%, TTFT within 5% (15% on the mixture's p90, its queue at the end, and on the RTX 4090's spec sheet
alone), TTFT measured as vLLM stamped it: from its engine's intake of each request. Without the link, the TP-2 run's TPOT is a
quarter too fast: the database's all-reduces are of a machine whose GPUs talk peer to peer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from simulator.profiles.interconnect_link import InterconnectLink, llmservingsim_link
from testbed.validate.runs import validate_run

REPO = Path(__file__).resolve().parents[3]
RUNS = REPO / "ground_truth"


def _validated(tmp_path: Path, name: str, without: tuple[str, ...] = ()):
    """The run `name` validated from a copy of ground_truth/ (without the files named)."""
    here = tmp_path / "ground_truth"
    shutil.copytree(RUNS, here, ignore=shutil.ignore_patterns(*without))
    return validate_run(here / name, tmp_path / "out")


@pytest.mark.slow
def test_a_tp2_run_over_pcie_is_priced_with_its_link_and_its_gpus_attention(tmp_path):
    r = _validated(tmp_path, "vllm-rtxpro6000-qwen3-32b")
    assert r.skipped is None and (r.model, r.gpu, r.tp) == ("qwen3-32b", "rtx_pro_6000_server", 2)
    assert "ops-rtxpro6000-qwen3-32b/tp2/attention.csv" in r.kernels  # LLMServingSim's tp<N>/ layout
    assert "collectives over the run's link (16 GB/s, 20 us a hop" in r.kernels
    for figure in ("mean_tpot_ms", "p50_tpot_ms", "p90_tpot_ms", "mean_ttft_ms", "p50_ttft_ms"):
        assert abs(r.error(figure)) < 0.05, (figure, r.error(figure))

    alone = _validated(tmp_path / "no-link", "vllm-rtxpro6000-qwen3-32b", without=("config.json",))
    assert "link" not in alone.kernels
    assert alone.error("mean_tpot_ms") < -0.15  # the database's all-reduces: a faster machine's


@pytest.mark.slow
def test_a_mixture_of_experts_under_data_and_expert_parallelism_is_replayed_as_it_ran(tmp_path):
    r = _validated(tmp_path, "vllm-rtxpro6000-qwen3-30b-a3b")
    assert r.skipped is None
    assert r.model == "qwen3-30b-a3b"  # Qwen/Qwen3-30B-A3B-Instruct-2507: the architecture's bundled config
    assert r.layout == ", data parallel 2, experts over 2 GPUs"
    for figure in ("mean_tpot_ms", "p50_tpot_ms", "p90_tpot_ms", "mean_ttft_ms", "p50_ttft_ms"):
        assert abs(r.error(figure)) < 0.05, (figure, r.error(figure))
    assert abs(r.error("p90_ttft_ms")) < 0.15 and abs(r.error("mean_e2e_ms")) < 0.05
    # Most of its requests met no queue: their TTFT is one prefill, and the engine's wait for the step
    # in flight before it reads a request in is no part of it (from the arrival: p50 +17%).
    assert r.ttft_from == "queued"


@pytest.mark.slow
def test_a_gpu_the_database_lacks_runs_on_its_own_timings_else_on_its_spec_sheet(tmp_path):
    r = _validated(tmp_path, "vllm-rtx4090-llama-3.1-8b")
    assert r.skipped is None and r.gpu == "rtx4090"  # "NVIDIA GeForce RTX 4090", the bundled spec
    assert "its own kernels from ops-rtx4090-llama-3.1-8b/tp1/" in r.kernels  # LLMServingSim's timings of it
    for figure in ("mean_tpot_ms", "p50_tpot_ms", "p90_tpot_ms", "mean_ttft_ms", "p50_ttft_ms", "p90_ttft_ms"):
        assert abs(r.error(figure)) < 0.05, (figure, r.error(figure))

    roofline = _validated(tmp_path / "no-timings", "vllm-rtx4090-llama-3.1-8b", without=("ops-rtx4090*",))
    assert roofline.kernels == "AIConfigurator has no vLLM kernels of rtx4090"  # the roofline, from the spec sheet
    for figure in ("mean_tpot_ms", "p50_tpot_ms", "mean_ttft_ms", "p50_ttft_ms"):
        assert abs(roofline.error(figure)) < 0.15, (figure, roofline.error(figure))


def test_the_runs_pcie_link_all_reduces_several_times_slower_than_the_databases_machine():
    """A 128-token decode of Qwen3-32B over two RTX PRO 6000s: the database's rows (peer-to-peer) against
    the ring over the run's link, 16 GB/s and 20 us a hop, which its own decode steps agree with."""
    from simulator.profiles.kernel_db import KernelDatabase

    pcie = InterconnectLink(16e9, 20e-6, "the runs' cluster config")
    database = KernelDatabase.open("rtx_pro_6000_server", "vllm").all_reduce(128, 5120, 2)
    assert 3 < pcie.all_reduce(128 * 5120, 2) / database < 4
    # A ring's time falls per GPU's share as GPUs join, and grows by their hops; one GPU sends nothing.
    assert pcie.all_reduce(128 * 5120, 8) > pcie.all_reduce(128 * 5120, 2) and pcie.all_reduce(128 * 5120, 1) == 0.0
    with pytest.raises(ValueError, match="bandwidth above 0"):
        InterconnectLink(0.0, 1e-6, "test")


def test_a_cluster_config_gives_its_link_only_for_its_own_model_and_tp(tmp_path):
    config = tmp_path / "config.json"
    shutil.copy(RUNS / "vllm-rtxpro6000-qwen3-32b" / "config.json", config)
    link = llmservingsim_link(config, "qwen3-32b", 2)
    assert link is not None and (link.bandwidth, link.latency_s) == pytest.approx((16e9, 20e-6))
    assert llmservingsim_link(config, "qwen3-32b", 1) is None
    assert llmservingsim_link(config, "llama-3.1-8b", 2) is None
    two_levels = json.loads(config.read_text()) | {"link_bw": [128, 16], "link_latency": [500, 20000]}
    config.write_text(json.dumps(two_levels))
    link = llmservingsim_link(config, "qwen3-32b", 2)
    assert link is not None and (link.bandwidth, link.latency_s) == pytest.approx((128e9, 500e-9))  # a node's own, the first
    config.write_text("not json")
    assert llmservingsim_link(config, "qwen3-32b", 2) is None
