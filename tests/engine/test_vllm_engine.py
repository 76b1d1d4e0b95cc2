"""The vLLM-style scheduler on the real engine equals transformers.

Its steps mix decodes with prefill chunks in one forward (ForwardMode.MIXED), and in
overlap mode (async scheduling) a decode's input inside such a batch is a placeholder
resolved on the device. Tiny random checkpoints written by transformers are run through
VllmScheduler + the engine: every logits row of a mixed forward equals transformers'
logits at its position, and the greedy tokens equal `generate`, with overlap on and off,
with a token budget small enough to chunk every prompt, and with preemption forced by a
KV pool barely larger than one request.
"""

from __future__ import annotations

import pytest
from engine_helpers import (
    ManualRun,
    check_record_against_hf,
    hf_generate,
    make_req,
    make_runner,
    prompt,
    save_hf_model,
    vllm_scheduler_config,
)

from engine.real_driver import RealDriver
from scheduler.core.forward_plan import ForwardMode
from scheduler.loop.event_loop import EventLoop
from scheduler.vllm.scheduler import VllmScheduler

LENS = [10, 60, 25, 41, 17, 52]
OUTS = [5, 20, 12, 7, 16, 9]


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def model(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    return save_hf_model(request.param, folder, seed=3), make_runner(folder)


def _staggered(n0: int = 0):
    """Requests arriving one after another, so later prompts are prefilled beside earlier decodes."""
    specs = [(prompt(60 + i, n), o) for i, (n, o) in enumerate(zip(LENS, OUTS))]
    reqs = [make_req(f"r{i}", p, o, index=i, arrival=0.004 * i) for i, (p, o) in enumerate(specs)]
    return specs, reqs


def test_every_row_of_a_mixed_forward_equals_transformers_logits(model):
    hf, runner = model
    config = vllm_scheduler_config(runner, kv_tokens=2048, max_num_batched_tokens=24, page_size=4)
    run = ManualRun(runner, config, VllmScheduler(config))
    specs = [(prompt(60 + i, n), o) for i, (n, o) in enumerate(zip(LENS, OUTS))]
    reqs = [run.add(make_req(f"r{i}", p, o, index=i)) for i, (p, o) in enumerate(specs)]
    run.run()
    mixed = [plan for plan in run.plans if plan.mode is ForwardMode.MIXED]
    assert mixed, "a 24-token budget with six prompts was meant to put decodes beside prefill chunks"
    assert all(plan.num_tokens <= 24 for plan in run.plans)
    for r, (p, o) in zip(reqs, specs):
        check_record_against_hf(hf, run.records[r.rid], r.output_ids, f"request {r.rid}")
        assert r.output_ids == hf_generate(hf, p, o)


@pytest.mark.parametrize("overlap", [False, True], ids=["normal", "async"])
@pytest.mark.parametrize("page_size, budget, kv_tokens", [(16, 32, 4096), (4, 16, 96)], ids=["block16", "block4-preempt"])
def test_greedy_tokens_equal_transformers_generate(model, overlap, page_size, budget, kv_tokens):
    hf, runner = model
    config = vllm_scheduler_config(runner, kv_tokens=kv_tokens, overlap=overlap, page_size=page_size, max_num_batched_tokens=budget)
    sched = VllmScheduler(config)
    specs, reqs = _staggered()
    driver = RealDriver(runner, overlap)
    loop = EventLoop(sched, iter(reqs), driver.clock, overlap)
    driver.run(loop)
    sched.check_invariants()
    modes = set(loop.steps.cols["mode"])
    assert "mixed" in modes
    assert max(loop.steps.cols["num_tokens"]) <= budget
    if kv_tokens < 100:  # room for one request and a bit: some must be preempted and recomputed
        assert sched.num_preemptions > 0 and any(r.num_retractions for r in reqs)
    for r, (p, o) in zip(reqs, specs):
        assert r.output_ids == hf_generate(hf, p, o), f"request {r.rid} (preempted {r.num_retractions}x), overlap {overlap}"


@pytest.mark.parametrize("overlap", [False, True], ids=["normal", "async"])
def test_priority_preemption_keeps_transformers_tokens(model, overlap):
    """Priority preemption can take a request already scheduled in the step: its blocks of
    that step never reach the cache, so no later request reads KV that was never computed."""
    hf, runner = model
    config = vllm_scheduler_config(runner, kv_tokens=96, overlap=overlap, page_size=4, max_num_batched_tokens=16, policy="priority")
    sched = VllmScheduler(config)
    specs, reqs = _staggered()
    for i, r in enumerate(reqs):
        r.priority = (5 - i) % 3  # later arrivals often more urgent: running ones get preempted
    driver = RealDriver(runner, overlap)
    loop = EventLoop(sched, iter(reqs), driver.clock, overlap)
    driver.run(loop)
    sched.check_invariants()
    assert sched.num_preemptions > 0
    for r, (p, o) in zip(reqs, specs):
        assert r.output_ids == hf_generate(hf, p, o), f"request {r.rid} (priority {r.priority}, preempted {r.num_retractions}x)"
