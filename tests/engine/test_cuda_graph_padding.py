"""Decode batches padded as a CUDA graph runs them (engine/cuda_graph.py) still equal transformers.

A graph has fixed shapes: a batch of 3 runs as 4 (a padding request writes the scratch slot
and reads one key), and requests 40-80 tokens long read 256 keys each (the rest masked). On
the CPU, which has no graphs, DecodeGraphs(capture=False) runs that very padded forward
eagerly; benchmarks/gpu_check.sh runs the equivalence tests on CUDA, where graphs are on by
default and replayed.
"""

from __future__ import annotations

import pytest
from engine_helpers import ManualRun, check_record_against_hf, make_req, make_runner, prompt, save_hf_model, scheduler_config

from engine import cuda_graph
from engine.cuda_graph import DecodeGraphs
from scheduler.core.forward_plan import ForwardMode, synthetic_plan


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def model(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    return save_hf_model(request.param, folder, seed=3), make_runner(folder)


def padded_runner(runner, **config):
    config = scheduler_config(runner, **config)
    runner.graphs = DecodeGraphs(runner.model, runner.attn, runner.cache, max_batch=config.max_running_requests, capture=False)
    return config


def test_padded_decode_batches_equal_transformers(model):
    hf, runner = model
    config = padded_runner(runner)
    run = ManualRun(runner, config)
    lens, outs = [40, 77, 52], [6, 9, 4]
    reqs = [run.add(make_req(f"r{i}", prompt(50 + i, n), o, index=i)) for i, (n, o) in enumerate(zip(lens, outs))]
    run.run()
    decodes = [plan for plan in run.plans if plan.mode is ForwardMode.DECODE]
    shapes = {runner.graphs.shape_for(plan) for plan in decodes}
    # Three requests padded to four, then two and one: each read 256 keys.
    assert shapes == {(4, 256), (2, 256), (1, 256)}
    assert runner.graphs.replays == len(decodes)
    for r in reqs:
        check_record_against_hf(hf, run.records[r.rid], r.output_ids, f"request {r.rid}, padded decode")
    runner.graphs = None


def test_decode_past_a_context_bucket_moves_to_the_next(model):
    hf, runner = model
    config = padded_runner(runner)
    run = ManualRun(runner, config)
    # 250 prompt tokens + 12 outputs: the decode crosses 256 keys into the 512 bucket.
    req = run.add(make_req("long", prompt(70, 250), 12))
    run.run()
    shapes = [runner.graphs.shape_for(plan) for plan in run.plans if plan.mode is ForwardMode.DECODE]
    assert shapes[0] == (1, 256) and shapes[-1] == (1, 512)
    check_record_against_hf(hf, run.records[req.rid], req.output_ids, "a request crossing 256 keys")
    runner.graphs = None


def test_what_runs_eagerly(model, monkeypatch):
    _, runner = model
    config = padded_runner(runner, max_running_requests=16)
    graphs = runner.graphs
    assert graphs.batch_sizes == [1, 2, 4, 8, 16] and graphs.contexts == [256, 512]
    assert graphs.shape_for(synthetic_plan(ForwardMode.EXTEND, [0], [8], with_rows=False)) is None
    assert graphs.shape_for(synthetic_plan(ForwardMode.DECODE, [100] * 17, [1] * 17, with_rows=False)) is None
    assert graphs.shape_for(synthetic_plan(ForwardMode.DECODE, [100] * 9, [1] * 9, with_rows=False)) == (16, 256)
    # A batch whose padded keys pass the bound runs eagerly: 16 requests of 512 keys fit it, at a
    # smaller bound they would not.
    assert graphs.shape_for(synthetic_plan(ForwardMode.DECODE, [400] * 16, [1] * 16, with_rows=False)) == (16, 512)
    monkeypatch.setattr(cuda_graph, "MAX_PADDED_KEYS", 16 * 256)
    assert graphs.shape_for(synthetic_plan(ForwardMode.DECODE, [400] * 16, [1] * 16, with_rows=False)) is None
    assert config.max_running_requests == 16
    runner.graphs = None


def test_the_graphs_captured_before_a_run_cover_every_decode_it_can_meet(model, monkeypatch):
    _, runner = model
    padded_runner(runner, max_running_requests=16)
    graphs = runner.graphs
    row_len = runner.cache.req_to_token.shape[1]

    def met(bound: int) -> set:
        monkeypatch.setattr(cuda_graph, "MAX_PADDED_KEYS", bound)
        plans = (
            synthetic_plan(ForwardMode.DECODE, [longest - 1] + [0] * (batch - 1), [1] * batch, with_rows=False)
            for batch in range(1, 17)
            for longest in (1, 255, 256, 257, 511, row_len)
        )
        return {graphs.shape_for(plan) for plan in plans} - {None}

    # Every shape a decode can meet is captured at the start (capture_all), none on the way.
    assert met(1 << 19) == set(graphs.shapes()) == {(b, c) for b in (1, 2, 4, 8, 16) for c in (256, 512)}
    assert graphs.shapes()[0] == (16, 512)
    # Under a smaller bound of padded keys, the shapes past it run eagerly and are not captured.
    assert met(16 * 256) == set(graphs.shapes()) and (16, 512) not in graphs.shapes()
    runner.graphs = None
