"""Server settings of the recipes behind measured points (testbed/validate/recipes.py): each point
is replayed with the version of InferenceMAX's recipe in force the day it was measured (the SGLang
DeepSeek-R1 servers on the B200 and B300 take in new requests once every 10 or 30 decode steps; the
MiniMax servers turned expert parallelism on, then an fp8 KV cache and a step of twice the prompt);
a points file's columns win."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from cli_helpers import assert_clean_error
from validate_helpers import simulable_point, validate_one_row

from testbed.validate.harness import harness_of
from testbed.validate.recipes import RECIPES, ParallelLayout, ServerRecipe, recipe_version, server_recipe
from testbed.validate.simulate import PointSimulator

REPO = Path(__file__).resolve().parents[3]


def _b200_r1(points, **more):
    return simulable_point(points, system="b200_sxm", backend="sglang", model_path="deepseek-ai/DeepSeek-R1", isl=1024, osl=1024, **more)


def test_inferencemax_deepseek_on_b200_polls_every_10_or_30_decode_steps(points):
    few, many = _b200_r1(points, tp=8, concurrency=8), _b200_r1(points, tp=8, concurrency=32)
    assert harness_of(few) == harness_of(many) == "inferencemax"
    assert server_recipe(few, "inferencemax").scheduler_recv_interval == 10
    assert server_recipe(many, "inferencemax").scheduler_recv_interval == 30
    assert server_recipe(many, "inferencemax").chunked_prefill_size == 32768
    # (its --max-running-requests 128 is not replayed: the points show more running, recipes.py)
    assert server_recipe(many, "inferencemax").max_running_requests is None
    assert server_recipe(many, "fixed") == ServerRecipe()  # another client's points: not that recipe
    h200 = simulable_point(points, system="h200_sxm", backend="sglang", model_path="deepseek-ai/DeepSeek-R1", isl=1024, osl=1024)
    assert server_recipe(h200, "inferencemax").scheduler_recv_interval == 1  # its H200 recipe does not set it
    assert server_recipe(h200, "inferencemax").max_running_requests == 512  # but runs 512 requests at 1,024/1,024
    told = dataclasses.replace(many, scheduler_recv_interval=5)
    assert server_recipe(told, "inferencemax").scheduler_recv_interval == 5  # the file's column wins


def test_inferencemax_keeps_the_kv_cache_in_fp8_where_its_recipes_did(points):
    llama = simulable_point(points, system="h200_sxm", backend="vllm", model_path="meta-llama/Llama-3.1-70B", isl=1024, osl=1024)
    assert server_recipe(llama, "inferencemax").kv_cache_dtype == "fp8"
    assert server_recipe(llama, "fixed").kv_cache_dtype == "auto"  # another client's points: not that recipe
    minimax = simulable_point(points, system="h200_sxm", backend="vllm", model_path="MiniMaxAI/MiniMax-M2.5", isl=1024, osl=1024)
    assert server_recipe(minimax, "inferencemax").kv_cache_dtype == "auto"
    told = dataclasses.replace(llama, kv_cache_dtype="bf16")
    assert server_recipe(told, "inferencemax").kv_cache_dtype == "bf16"  # the file's column wins


def test_a_point_runs_the_recipe_of_the_day_it_was_measured(points):
    """minimaxm2.5_fp8_b200.sh: from 2026-03-11 `EP_SIZE -ge 1` turned expert parallelism on for every
    row at 0.95 of the memory; its 2026-04-03 upgrade kept the KV cache in fp8 and set the step to
    twice the prompt. A point measured before its recipe's first version runs the engine's defaults."""
    b200 = dict(system="b200_sxm", backend="vllm", model_path="MiniMaxAI/MiniMax-M2.5", precision="fp8", isl=1024, osl=1024, tp=2)
    march = simulable_point(points, measured_on="2026-03-11", **b200)
    april = simulable_point(points, measured_on="2026-04-08", **b200)
    first, upgraded = server_recipe(march, "inferencemax"), server_recipe(april, "inferencemax")
    assert (first.expert_parallel, first.memory_fraction, first.kv_cache_dtype, first.max_num_batched_tokens) == (True, 0.95, "auto", None)
    assert (upgraded.expert_parallel, upgraded.kv_cache_dtype, upgraded.max_num_batched_tokens) == (False, "fp8", 2048)
    assert "2026-04-03" in upgraded.source and "2026-03-11" in first.source
    assert upgraded.flags("vllm") == (
        "--kv-cache-dtype fp8 --max-num-batched-tokens 2048 --gpu-memory-utilization 0.9 --block-size 32 --max-cudagraph-capture-size 2048"
    )
    sim = PointSimulator()
    try:
        options = sim.options(march, "profile.json")
        assert (options.ep, options.mem_fraction_static, options.page_size) == (2, 0.95, 32)  # experts over both GPUs
        options = sim.options(april, "profile.json")
        assert (options.ep, options.max_num_batched_tokens, options.kv_cache_dtype) == (1, 2048, "fp8")
    finally:
        sim.close()
    b300 = simulable_point(points, system="b300_sxm", backend="vllm", model_path="MiniMaxAI/MiniMax-M2.5", measured_on="2026-04-03")
    assert server_recipe(b300, "inferencemax") == ServerRecipe()  # before minimaxm2.5_fp8_b300.sh (2026-04-17)


def test_a_dp_attention_row_runs_the_layout_its_script_ran(points):
    """A sweep config's `dp-attn: true` gives its rows attention_dp_size = TP and a batch_size of one
    rank's clients. MiniMax's fp4 scripts run them as `-tp 1 -dp $TP --enable-expert-parallel`; its
    fp8 scripts ignore DP_ATTENTION (`-tp $TP`, expert parallel where the row's ep is), and
    Kimi-K2.5's run `-tp $TP` alone, whatever the row's moe_ep_size."""
    minimax = dict(backend="vllm", model_path="MiniMaxAI/MiniMax-M2.5", attention_dp=2)
    fp4 = simulable_point(points, system="b200_sxm", precision="fp4", **minimax)
    assert fp4.concurrency == 2 * int(fp4.row["batch_size"])
    fp8 = simulable_point(points, system="b200_sxm", precision="fp8", **minimax)
    h100 = simulable_point(points, system="h100_sxm", backend="vllm", model_path="MiniMaxAI/MiniMax-M2.5", attention_dp=4)
    kimi = simulable_point(points, system="b200_sxm", model_path="moonshotai/Kimi-K2.5", attention_dp=4)
    sim = PointSimulator()
    try:
        assert sim.layout(fp4) == ParallelLayout(tp=1, dp=2, ep=2)
        options = sim.options(fp4, "profile.json")
        assert (options.tp, options.dp, options.enable_dp_attention, options.ep) == (1, 2, True, 2)
        assert sim.layout(fp8) == ParallelLayout(tp=2, dp=1, ep=2)
        assert sim.layout(h100) == ParallelLayout(tp=4, dp=1, ep=4)
        assert sim.layout(kimi) == ParallelLayout(tp=4, dp=1, ep=1)
        # A row no recipe covers runs as its columns say: the gap-analysis rows of vLLM's Qwen3-235B-A22B
        # give tp 1 beside experts split over 2 GPUs, vLLM's -dp 2.
        qwen = simulable_point(points, system="h200_sxm", backend="vllm", model_path="Qwen/Qwen3-235B-A22B-FP8", tp=1, moe_tp=2)
        assert qwen.attention_dp == 1 and sim.layout(qwen) == ParallelLayout(tp=1, dp=2, ep=1)
    finally:
        sim.close()
    assert "--tensor-parallel-size 1 --data-parallel-size 2" in server_recipe(fp4, "inferencemax").flags("vllm")


def test_glm5_runs_its_recipe_or_sglangs_fp8_kv_default_for_sparse_attention_on_blackwell(points):
    glm = dict(backend="sglang", model_path="zhipuai/GLM-5", precision="fp8")
    h200, b200 = simulable_point(points, system="h200_sxm", **glm), simulable_point(points, system="b200_sxm", **glm)
    b300 = simulable_point(points, system="b300_sxm", **glm)  # measured before glm5_fp8_b300.sh (2026-04-17)
    assert server_recipe(b200, "inferencemax").chunked_prefill_size == 32768
    assert server_recipe(h200, "inferencemax").memory_fraction == 0.85
    assert recipe_version(b300, "inferencemax") is None
    sim = PointSimulator()
    try:
        assert (sim.kv_cache_dtype(h200), sim.kv_cache_dtype(b200), sim.kv_cache_dtype(b300)) == ("auto", "fp8", "fp8")
        assert sim.options(b300, "profile.json").kv_cache_dtype == "fp8"
    finally:
        sim.close()


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


def test_every_inferencemax_point_of_a_recipe_finds_the_version_of_its_day(points):
    """Each point a recipe covers is dated (its source's measured=), and gets the latest version
    landed on or before that day; the MoE scripts' expert parallelism follows the H200 script's
    2026-03-13 change and the B200's 2026-04-03 upgrade."""
    covered = [(p, recipe_version(p, "inferencemax")) for p in points if p.skip_reason() is None and harness_of(p) == "inferencemax"]
    versions = [(p, v) for p, v in covered if v is not None]
    assert len(versions) > 500
    for p, v in versions:
        assert p.measured_on is not None and v.since <= p.measured_on, (p.line, v.since)
        later = [w for w in RECIPES if w is not v and w.backend == v.backend and w.models == v.models]
        later = [w for w in later if p.system in w.systems and p.precision in w.precisions and v.since < w.since <= p.measured_on]
        assert not later, (p.line, v.since, [w.since for w in later])
    h200 = {
        p.measured_on: server_recipe(p, "inferencemax").expert_parallel
        for p, v in versions
        if p.system == "h200_sxm" and "MiniMax" in p.model_path
    }
    assert h200 == {"2026-03-01": False, "2026-03-27": True, "2026-03-28": True}


def test_vllm_before_0_14_ran_without_async_scheduling_unless_its_recipe_turned_it_on(points):
    """vLLM 0.12's gap-analysis servers (no recipe) left async scheduling at that version's default,
    off; InferenceMAX's gpt-oss configs pass `async-scheduling: true` on vLLM 0.11.2; from 0.14 the
    engine's default is on. The replay follows: overlap off only where the server ran without it."""
    qwen = simulable_point(points, system="h100_sxm", backend="vllm", model_path="Qwen/Qwen3-32B")
    assert qwen.backend_version == "0.12.0"
    recipe = server_recipe(qwen, harness_of(qwen))
    assert recipe.async_scheduling is False and "--no-async-scheduling" in recipe.flags("vllm")
    gpt_oss = simulable_point(points, system="h100_sxm", backend="vllm", model_path="openai/gpt-oss-120b", backend_version="0.11.2")
    assert server_recipe(gpt_oss, harness_of(gpt_oss)).async_scheduling is True
    minimax = simulable_point(points, system="h200_sxm", backend="vllm", model_path="MiniMaxAI/MiniMax-M2.5", backend_version="0.18.0")
    assert server_recipe(minimax, harness_of(minimax)).async_scheduling is None  # the engine's default: on
    sim = PointSimulator()
    try:
        assert sim.options(qwen, "profile.json").overlap is False
        assert sim.options(minimax, "profile.json").overlap is None  # left to the replay: the engine's default, on
    finally:
        sim.close()
