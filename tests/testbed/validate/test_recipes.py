"""Server settings of the recipes behind measured points (testbed/validate/recipes.py): InferenceMAX's
SGLang DeepSeek-R1 servers on the B200 and B300 take in new requests once every 10 or 30 decode
steps (--scheduler-recv-interval), and validate replays them so; a points file can say it too."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from cli_helpers import assert_clean_error
from validate_helpers import simulable_point, validate_one_row

from testbed.validate.harness import harness_of
from testbed.validate.recipes import kv_cache_dtype, scheduler_recv_interval
from testbed.validate.simulate import PointSimulator

REPO = Path(__file__).resolve().parents[3]


def _b200_r1(points, **more):
    return simulable_point(points, system="b200_sxm", backend="sglang", model_path="deepseek-ai/DeepSeek-R1", isl=1024, osl=1024, **more)


def test_inferencemax_deepseek_on_b200_polls_every_10_or_30_decode_steps(points):
    few, many = _b200_r1(points, tp=8, concurrency=8), _b200_r1(points, tp=8, concurrency=32)
    assert harness_of(few) == harness_of(many) == "inferencemax"
    assert scheduler_recv_interval(few, "inferencemax") == 10
    assert scheduler_recv_interval(many, "inferencemax") == 30
    assert scheduler_recv_interval(many, "fixed") == 1  # another client's points: not that recipe
    h200 = simulable_point(points, system="h200_sxm", backend="sglang", model_path="deepseek-ai/DeepSeek-R1", isl=1024, osl=1024)
    assert scheduler_recv_interval(h200, "inferencemax") == 1  # its H200 recipe does not set it
    told = dataclasses.replace(many, scheduler_recv_interval=5)
    assert scheduler_recv_interval(told, "inferencemax") == 5  # the file's column wins


def test_inferencemax_keeps_the_kv_cache_in_fp8_where_its_recipes_did(points):
    llama = simulable_point(points, system="h200_sxm", backend="vllm", model_path="meta-llama/Llama-3.1-70B", isl=1024, osl=1024)
    assert kv_cache_dtype(llama, "inferencemax") == "fp8"
    assert kv_cache_dtype(llama, "fixed") == "auto"  # another client's points: not that recipe
    minimax = simulable_point(points, system="h200_sxm", backend="vllm", model_path="MiniMaxAI/MiniMax-M2.5", isl=1024, osl=1024)
    assert kv_cache_dtype(minimax, "inferencemax") == "auto"
    told = dataclasses.replace(llama, kv_cache_dtype="bf16")
    assert kv_cache_dtype(told, "inferencemax") == "bf16"  # the file's column wins


@pytest.mark.slow
def test_an_fp8_kv_cache_holds_the_clients_a_bf16_one_cannot(points):
    """70B on one H200, 64 clients of 1,024 + 8,192 tokens: a bf16 KV cache cannot hold them, so
    requests queue for seconds; the recipe's fp8 cache holds twice the tokens, and the queue shrinks."""
    p = simulable_point(
        points, system="h200_sxm", backend="vllm", model_path="meta-llama/Llama-3.1-70B", tp=1, isl=1024, osl=8192, concurrency=64
    )
    bf16 = dataclasses.replace(p, kv_cache_dtype="auto")
    sim = PointSimulator()
    try:
        fp8_kv, bf16_kv = sim.simulate(p), sim.simulate(bf16)
    finally:
        sim.close()
    assert fp8_kv.ttft_ms < bf16_kv.ttft_ms / 5


@pytest.mark.slow
def test_the_recipes_interval_delays_first_tokens(points):
    """32 clients on eight B200s: polling every 30 decode steps holds a new request back for up to
    30 of them, so TTFT comes out several decode steps longer than the engine's default gives."""
    p = _b200_r1(points, tp=8, concurrency=32)
    every_step = dataclasses.replace(p, scheduler_recv_interval=1)
    sim = PointSimulator()
    try:
        recipe, default = sim.simulate(p), sim.simulate(every_step)
    finally:
        sim.close()
    assert recipe.ttft_ms > default.ttft_ms + 5 * default.tpot_ms
    assert recipe.ttft_ms < default.ttft_ms + 31 * recipe.tpot_ms


@pytest.mark.slow
def test_the_columns_are_read_and_checked(tmp_path):
    llama = {"backend": "vllm", "mode": "agg", "model_path": "meta-llama/Llama-3.1-70B"}
    bad = tmp_path / "bad.csv"
    assert_clean_error(validate_one_row(bad, {"scheduler_recv_interval": "0"}, **llama), f"{bad}:2", "scheduler_recv_interval", "0")
    assert_clean_error(validate_one_row(bad, {"kv_cache_dtype": "int4"}, **llama), f"{bad}:2", "kv_cache_dtype", "int4", "fp8")
    skipped = validate_one_row(tmp_path / "vllm.csv", {"scheduler_recv_interval": "10"}, **llama)
    assert skipped.returncode == 0, skipped.stderr
    assert "skipped 1: scheduler_recv_interval 10" in skipped.stdout, skipped.stdout
