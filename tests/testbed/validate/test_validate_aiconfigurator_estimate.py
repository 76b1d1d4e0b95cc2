"""AIConfigurator's own estimate of measured agg points of its silicon_sample.csv (no mocks).

Two databases load (h200_sxm vLLM and SGLang, ~2-4 s each); everything else is milliseconds."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

aic = pytest.importorskip("aiconfigurator_core", reason="needs the aiconfigurator extra")

from testbed.validate.aiconfigurator_estimate import (  # noqa: E402
    AicEstimate,
    EstimateUnavailable,
    aiconfigurator_estimate,
    estimate_of,
    resolve_database_version,
)
from testbed.validate.points import MeasuredPoint, load_points  # noqa: E402

SILICON = Path(aic.__file__).parent / "systems" / "silicon_sample.csv"
VLLM_70B = "2026_04_06_llama_3_1_70b_h200_sxm_vllm_fp8_agg_1024x1024_c32_tp4_ep1_682"
SGLANG_8B = "meta_llama_llama_3_1_8b_instruct_meta_llama_llama_3_1_8b_instruct_h200_sxm_sglang_agg_4000x100_c40_tp1_epnone_31"
VLLM_70B_TP1_C64 = "2026_04_06_llama_3_1_70b_h200_sxm_vllm_fp8_agg_1024x8192_c64_tp1_ep1_467"


@pytest.fixture(scope="module")
def rows() -> dict[str, MeasuredPoint]:
    wanted = {VLLM_70B, SGLANG_8B, VLLM_70B_TP1_C64}
    found = {p.id: p for p in load_points(SILICON) if p.id in wanted}
    assert set(found) == wanted, f"points missing from {SILICON}: {wanted - set(found)}"
    return found


def _within(predicted: float, measured: float, factor: float) -> bool:
    return math.isfinite(predicted) and predicted > 0 and measured / factor <= predicted <= measured * factor


def test_vllm_llama_70b_fp8_point(rows):
    row = rows[VLLM_70B]
    assert (row.system, row.backend, row.gemm_quant, row.tp) == ("h200_sxm", "vllm", "fp8", 4)
    est = estimate_of(row)
    assert isinstance(est, AicEstimate)
    assert _within(est.ttft_ms, row.ttft_ms, 3), (est, row.ttft_ms)
    assert _within(est.tpot_ms, row.tpot_ms, 3), (est, row.tpot_ms)
    # The point names no version; the database's maintained one is used and reported.
    assert est.requested_version is None and est.database_version == resolve_database_version("h200_sxm", "vllm", None)
    assert est.model == "meta-llama/Meta-Llama-3.1-70B"  # the registry's name for meta-llama/Llama-3.1-70B
    assert est.batch_size == 32 == row.concurrency
    assert est.quant.startswith("gemm=fp8 ")


def test_sglang_llama_8b_point(rows):
    row = rows[SGLANG_8B]
    est = estimate_of(row)
    assert _within(est.ttft_ms, row.ttft_ms, 3), (est, row.ttft_ms)
    assert _within(est.tpot_ms, row.tpot_ms, 3), (est, row.tpot_ms)
    # 0.5.6.post2 is not in the database: the first maintained version after it is used, and said.
    assert est.requested_version == "0.5.6.post2" and est.database_version != est.requested_version
    assert not est.version_exact
    assert est.database_version == resolve_database_version("h200_sxm", "sglang", "0.5.6.post2")


def test_keyword_api_matches_the_row_and_caches(rows):
    row = rows[VLLM_70B]
    a = aiconfigurator_estimate(
        "h200_sxm", "vllm", None, "meta-llama/Llama-3.1-70B", isl=1024, osl=1024, concurrency=32, tp=4, gemm_quant="fp8"
    )
    assert a == estimate_of(row)
    # Concurrency grows -> TTFT and TPOT do not shrink (AIConfigurator's queueing and batch models).
    b = aiconfigurator_estimate("h200_sxm", "vllm", None, "meta-llama/Llama-3.1-70B", 1024, 1024, 64, 4, "fp8")
    assert b.ttft_ms >= a.ttft_ms and b.tpot_ms >= a.tpot_ms


def test_version_resolution():
    current = resolve_database_version("h200_sxm", "vllm", None)
    assert resolve_database_version("h200_sxm", "vllm", current) == current  # the point's own, when present
    assert resolve_database_version("h200_sxm", "vllm", "0.12.0") == current  # older: the first maintained after
    assert resolve_database_version("h200_sxm", "vllm", "nightly-5b8c30d62b754b57") == current  # not a version


def test_unknown_system_is_unavailable():
    with pytest.raises(EstimateUnavailable) as e:
        aiconfigurator_estimate("mi300x", "vllm", "0.12.0", "meta-llama/Llama-3.1-70B", 1024, 1024, 8, 4, "fp8")
    assert "mi300x" in e.value.reason and "h200_sxm" in e.value.reason  # names it, and what there is


def test_unknown_model_backend_and_quant_are_unavailable():
    with pytest.raises(EstimateUnavailable, match="registry"):  # no download from the Hub
        aiconfigurator_estimate("h200_sxm", "vllm", None, "acme/NotAModel-7B", 1024, 128, 8, 1, None)
    with pytest.raises(EstimateUnavailable, match="backend"):
        aiconfigurator_estimate("h200_sxm", "tgi", None, "Qwen/Qwen3-32B", 1024, 128, 8, 1, None)
    with pytest.raises(EstimateUnavailable, match="quant"):
        aiconfigurator_estimate("h200_sxm", "vllm", None, "Qwen/Qwen3-32B", 1024, 128, 8, 1, "fp7")


def test_batch_past_memory_is_unavailable(rows):
    # 64 requests of 9k tokens of a 70B model on one H200: AIConfigurator's CLI calls it OOM.
    with pytest.raises(EstimateUnavailable, match="out of memory"):
        estimate_of(rows[VLLM_70B_TP1_C64])
