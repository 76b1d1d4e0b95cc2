"""The benchmark client behind a measured point (testbed/validate/harness.py), as validate uses it:
which client the points of silicon_sample.csv came from, the requests it sent, and what that
does to the simulated TTFT."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import assert_clean_error
from validate_helpers import simulable_point, validate_one_row

from testbed.validate.harness import harness_of, workload
from testbed.validate.simulate import PointSimulator

REPO = Path(__file__).resolve().parents[3]


def _llama_70b(points, **more):
    return simulable_point(points, system="h200_sxm", backend="vllm", model_path="meta-llama/Llama-3.1-70B", isl=1024, osl=1024, **more)


def test_each_point_is_given_the_client_that_measured_it(points):
    inferencemax = _llama_70b(points, tp=2, concurrency=8)  # an InferenceMAX sweep's 1k/1k point
    gap_analysis = simulable_point(points, backend="vllm", model_path="Qwen/Qwen3-32B", isl=1024, osl=1024)  # same shape, AIC's job
    other_shape = simulable_point(points, backend="vllm", model_path="Qwen/Qwen3-32B", isl=4096, osl=128)
    assert "gap-analysis" in gap_analysis.row["silicon_data_source"]
    assert harness_of(inferencemax) == "inferencemax"
    assert harness_of(gap_analysis) == "fixed"
    assert harness_of(other_shape) == "fixed"
    assert harness_of(inferencemax, "fixed") == "fixed"  # --harness overrides
    named = dataclasses.replace(other_shape, row={**other_shape.row, "harness": "inferencemax"})
    assert harness_of(named) == "inferencemax"  # a harness column overrides the guess


def test_inferencemax_sends_ten_requests_a_client_of_spread_lengths(points):
    p = _llama_70b(points, tp=2, concurrency=8)
    load = workload(p, "inferencemax")
    assert len(load.requests) == 10 * p.concurrency
    assert load.measured_rids == {r.rid for r in load.requests}  # its means are over every request, the first wave's too
    inputs = np.array([r.input_len for r in load.requests])
    outputs = np.array([r.output_len for r in load.requests])
    for lengths, full in ((inputs, p.isl), (outputs, p.osl)):
        assert lengths.min() >= int(0.8 * full) and lengths.max() <= full
        assert len(set(lengths)) > len(lengths) // 2  # spread, not a few values
        assert 0.85 * full < lengths.mean() < 0.95 * full
    assert workload(p, "inferencemax") == load  # drawn from a fixed seed: the same every run


def test_fixed_lengths_measure_the_middle_of_three_waves(points):
    p = _llama_70b(points, tp=2, concurrency=8)
    load = workload(p, "fixed")
    assert len(load.requests) == 3 * p.concurrency
    assert {(r.input_len, r.output_len) for r in load.requests} == {(p.isl, p.osl)}
    assert load.measured_rids == {r.rid for r in load.requests[p.concurrency : 2 * p.concurrency]}


@pytest.mark.slow
def test_a_bad_harness_column_is_one_line(tmp_path):
    path = tmp_path / "points.csv"
    assert_clean_error(validate_one_row(path, {"harness": "locust"}), f"{path}:2", "harness", "locust", "inferencemax")


@pytest.mark.slow
def test_spread_lengths_put_the_clients_out_of_phase(points):
    """The 70B fp8 point at 8 clients on two H200s, measured by InferenceMAX: with its requests'
    spread lengths the clients finish and send apart, so a new prompt prefills beside decodes
    rather than queued behind the whole wave's prompts. Its TTFT comes out several times below
    what synchronized waves of fixed lengths give, and near the measured one; TPOT is decode-bound
    either way."""
    p = _llama_70b(points, tp=2, concurrency=8)
    spread, waves = PointSimulator(harness="inferencemax"), PointSimulator(harness="fixed")
    try:
        got, synchronized = spread.simulate(p), waves.simulate(p)
    finally:
        spread.close()
        waves.close()
    assert got.harness == "inferencemax" and synchronized.harness == "fixed"
    assert got.ttft_ms < synchronized.ttft_ms / 2
    assert 0.7 < got.ttft_ms / p.ttft_ms < 1.2
    for sim in (got, synchronized):
        assert 0.85 < sim.tpot_ms / p.tpot_ms < 1.15
