"""Decode attention priced from a GPU's own timings of the engine (LLMServingSim's attention.csv).

The database's decode attention of the RTX PRO 6000 reads small KV caches faster than its memory
can (from a warm L2); LLMServingSim's timings of the same GPU under vLLM 0.19 read them from memory.
A profile built with `decode_attention` (of the same model and TP) prices decode batches from them.
"""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from scheduler.core.forward_plan import ForwardMode
from simulator.costs.kernel_cost import KernelProfileCostModel
from simulator.costs.llmservingsim_attention import AttentionTimingsError
from simulator.costs.measured_decode_attention import from_llmservingsim
from simulator.profiles.kernel_holdout import uniform_plan
from simulator.profiles.kernel_profile import build_kernel_profile

REPO = Path(__file__).resolve().parents[2]
OPS = REPO.parent / "shared" / "ground_truth" / "ops-rtxpro6000-llama-3.1-8b"
TIMINGS = OPS / "attention.csv"
KV_BYTES_A_TOKEN = 2 * 8 * 128 * 2  # Llama-3.1-8B's K and V of one layer: 8 KV heads of 128, bf16
RTX_PRO_6000_BANDWIDTH = 1.792e12  # bytes/s, the profile's hardware spec
pytestmark = pytest.mark.skipif(not TIMINGS.is_file(), reason="needs ../shared/ground_truth")


def measured_us(nd: int, kd: int) -> float:
    with open(TIMINGS, newline="") as f:
        for row in csv.DictReader(f):
            if (int(row["prefill_chunk"]), int(row["kv_prefill"]), int(row["n_decode"]), int(row["kv_decode"])) == (0, 0, nd, kd):
                return float(row["time_us"])
    raise KeyError((nd, kd))


@pytest.fixture(scope="module")
def profiles() -> tuple[dict, dict]:
    plain = build_kernel_profile("rtx_pro_6000_server", "vllm", None, "llama-3.1-8b", 1, holdout=False)
    measured = build_kernel_profile("rtx_pro_6000_server", "vllm", None, "llama-3.1-8b", 1, holdout=False, decode_attention=TIMINGS)
    return plain, measured


def cell(profile: dict, b: int, c: int) -> float:
    table = profile["kernels"]["decode_attention"]
    return table["seconds"][table["batch"].index(b)][table["context"].index(c)]


def test_the_databases_small_kv_caches_read_faster_than_memory_and_the_measured_ones_do_not(profiles):
    plain, measured = profiles
    # 32 requests of 1,024 tokens: 134 MB of KV a layer, about the GPU's 128 MB of L2.
    rate = 32 * 1024 * KV_BYTES_A_TOKEN / RTX_PRO_6000_BANDWIDTH
    assert rate / cell(plain, 32, 1024) > 0.95  # the database: at the memory's full bandwidth
    assert rate / cell(measured, 32, 1024) < 0.7
    assert cell(measured, 32, 1024) == pytest.approx(measured_us(32, 1024) * 1e-6)
    # Past the L2 (4 GB of KV) both read from memory and agree within a few percent.
    assert cell(measured, 256, 4096) == pytest.approx(cell(plain, 256, 4096), rel=0.05)


def test_outside_the_measured_grid_the_database_is_scaled_as_at_the_nearest_measured_shape(profiles):
    plain, measured = profiles
    edge = measured_us(256, 1024) * 1e-6 / cell(plain, 256, 1024)
    assert cell(measured, 1024, 1024) == pytest.approx(cell(plain, 1024, 1024) * edge)
    edge = measured_us(32, 16384) * 1e-6 / cell(plain, 32, 16384)
    assert cell(measured, 32, 65536) == pytest.approx(cell(plain, 32, 65536) * edge)
    assert "ops-rtxpro6000" in measured["precision"]["decode_attention"]["measured"]["source"]


def test_only_decode_forwards_change_and_by_the_measured_attention(profiles):
    plain, measured = (KernelProfileCostModel(p) for p in profiles)
    extend = uniform_plan(ForwardMode.EXTEND, 1, 2048, 0)
    assert measured.forward_time(extend) == plain.forward_time(extend)
    decode = uniform_plan(ForwardMode.DECODE, 32, 1, 1023)  # 32 requests of 1,024 tokens
    layers = profiles[0]["kernels"]["layers"]
    extra = layers * (measured_us(32, 1024) * 1e-6 - cell(profiles[0], 32, 1024))
    assert measured.forward_time(decode) - plain.forward_time(decode) == pytest.approx(extra, rel=1e-6)


def test_a_file_without_decode_batches_alone_is_refused_naming_it(tmp_path):
    only_mixed = tmp_path / "attention.csv"
    only_mixed.write_text("prefill_chunk,kv_prefill,n_decode,kv_decode,time_us\n16,0,8,1024,30.0\n16,0,0,0,9.0\n")
    with pytest.raises(AttentionTimingsError, match=f"{only_mixed}: needs decode batches measured alone"):
        from_llmservingsim(only_mixed)


def test_validate_takes_the_decode_timings_only_of_the_runs_model(tmp_path):
    """Timings of another model beside the run still give the mixed factor (a ratio), not the times."""
    from testbed.runs.import_run import import_run
    from testbed.validate.runs import gpu_timings_of, kernel_profile, settings_of

    run_folder = REPO.parent / "shared" / "ground_truth" / "vllm-rtxpro6000-llama-3.1-8b"
    if not (run_folder / "requests.jsonl").is_file():
        pytest.skip("needs ../shared/ground_truth")
    here = tmp_path / "runs"
    shutil.copytree(run_folder, here / run_folder.name)
    shutil.copytree(OPS, here / OPS.name)
    import_run(here / run_folder.name / "requests.jsonl", tmp_path / "real", "llmservingsim")
    run = settings_of(here / run_folder.name, tmp_path / "real", None)
    found = gpu_timings_of(run)
    assert found is not None and found.same_model and found.tp == 1
    _, said = kernel_profile(run, {}, tmp_path)
    assert "decode and mixed batches' attention from" in said
    meta = here / OPS.name / "meta.yaml"
    meta.write_text(meta.read_text().replace("model: meta-llama/Llama-3.1-8B", "model: Qwen/Qwen3-32B"))
    found = gpu_timings_of(run)
    assert found is not None and not found.same_model
    _, said = kernel_profile(run, {}, tmp_path)
    assert "mixed batches from" in said and "decode and mixed" not in said
