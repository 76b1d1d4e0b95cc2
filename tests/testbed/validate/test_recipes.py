"""Server settings of the recipes behind measured points (testbed/validate/recipes.py): InferenceMAX's
SGLang DeepSeek-R1 servers on the B200 and B300 take in new requests once every 10 or 30 decode
steps (--scheduler-recv-interval), and validate replays them so; a points file can say it too."""

from __future__ import annotations

import csv
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import assert_clean_error
from validate_helpers import simulable_point

from testbed.validate.harness import harness_of
from testbed.validate.points import default_points_path
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
    told = dataclasses.replace(many, scheduler_recv_interval=5, row={**many.row, "scheduler_recv_interval": "5"})
    assert scheduler_recv_interval(told, "inferencemax") == 5  # the file's column wins


def test_inferencemax_keeps_the_kv_cache_in_fp8_where_its_recipes_did(points):
    llama = simulable_point(points, system="h200_sxm", backend="vllm", model_path="meta-llama/Llama-3.1-70B", isl=1024, osl=1024)
    assert kv_cache_dtype(llama, "inferencemax") == "fp8"
    assert kv_cache_dtype(llama, "fixed") == "auto"  # another client's points: not that recipe
    minimax = simulable_point(points, system="h200_sxm", backend="vllm", model_path="MiniMaxAI/MiniMax-M2.5", isl=1024, osl=1024)
    assert kv_cache_dtype(minimax, "inferencemax") == "auto"
    told = dataclasses.replace(llama, row={**llama.row, "kv_cache_dtype": "bf16"})
    assert kv_cache_dtype(told, "inferencemax") == "bf16"  # the file's column wins


@pytest.mark.slow
def test_an_fp8_kv_cache_holds_the_clients_a_bf16_one_cannot(points):
    """70B on one H200, 64 clients of 1,024 + 8,192 tokens: a bf16 KV cache cannot hold them, so
    requests queue for seconds; the recipe's fp8 cache holds twice the tokens, and the queue shrinks."""
    p = simulable_point(
        points, system="h200_sxm", backend="vllm", model_path="meta-llama/Llama-3.1-70B", tp=1, isl=1024, osl=8192, concurrency=64
    )
    bf16 = dataclasses.replace(p, row={**p.row, "kv_cache_dtype": "auto"})
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
    every_step = dataclasses.replace(p, scheduler_recv_interval=1, row={**p.row, "scheduler_recv_interval": "1"})
    sim = PointSimulator()
    try:
        recipe, default = sim.simulate(p), sim.simulate(every_step)
    finally:
        sim.close()
    assert recipe.ttft_ms > default.ttft_ms + 5 * default.tpot_ms
    assert recipe.ttft_ms < default.ttft_ms + 31 * recipe.tpot_ms


@pytest.mark.slow
def test_the_column_is_read_and_checked(tmp_path):
    with open(default_points_path(), newline="") as f:
        reader = csv.DictReader(f)
        vllm = next(r for r in reader if r["backend"] == "vllm" and r["mode"] == "agg" and "Llama-3.1-70B" in r["model_path"])
        header = [*(reader.fieldnames or []), "scheduler_recv_interval"]

    def run(value: str) -> subprocess.CompletedProcess:
        path = tmp_path / f"points-{value}.csv"
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=header)
            w.writeheader()
            w.writerow({**vllm, "scheduler_recv_interval": value})
        cmd = [sys.executable, "-m", "testbed.cli", "validate", "--points", path, "--no-aiconfigurator", "-q"]
        return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)

    assert_clean_error(run("0"), "points-0.csv:2", "scheduler_recv_interval", "0")
    skipped = run("10")
    assert skipped.returncode == 0, skipped.stderr
    assert "skipped 1: scheduler_recv_interval 10" in skipped.stdout, skipped.stdout


@pytest.mark.slow
def test_a_bad_kv_cache_dtype_column_is_one_line(tmp_path):
    with open(default_points_path(), newline="") as f:
        reader = csv.DictReader(f)
        row = next(reader)
        header = [*(reader.fieldnames or []), "kv_cache_dtype"]
    path = tmp_path / "points.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header)
        w.writeheader()
        w.writerow({**row, "kv_cache_dtype": "int4"})
    cmd = [sys.executable, "-m", "testbed.cli", "validate", "--points", path]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert_clean_error(proc, f"{path}:2", "kv_cache_dtype", "int4", "fp8")
