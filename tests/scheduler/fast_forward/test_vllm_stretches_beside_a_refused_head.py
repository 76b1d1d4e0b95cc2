"""A vLLM decode stretch beside a waiting queue whose head does not fit the free KV blocks
(scheduler/vllm/decode_stretches.py, _head_surely_refused): every step of it would look at the
head and refuse it, so the stretch takes them at once until a request leaves. The head's cached
prefix could grow only where a running request caches its next block; the test's heads extend
running requests' prompts with the outputs those requests are still decoding (the simulator
samples token 0), so that this happens, and with a pool small enough that heads wait for blocks
and the cache evicts. Fast-forward must give stepping's run, and the stretches must have been
taken beside a refused head (and refused where a running request could extend the prefix)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples

from scheduler.vllm.decode_stretches import VllmDecodeStretches
from simulator.driver.sim_driver import SIM_TOKEN_ID
from testbed.options import ReplayOptions
from testbed.replay import replay
from testbed.runs.folder import load_run
from testbed.traces.schema import Trace, TraceRequest

OUTPUT_TOKEN = SIM_TOKEN_ID  # what every simulated forward samples


def _replay(trace_path: Path, out: Path, **opts):
    result = replay(str(trace_path), ReplayOptions(**opts), out=out)
    return result, load_run(out)


def _assert_runs_equal(step, ff) -> None:
    """Every column the same (fast-forward's times are stepping's bit for bit here)."""
    step_res, step_run = step
    ff_res, ff_run = ff
    assert ff_res.summary == step_res.summary
    for name in ("steps", "requests"):
        a, b = getattr(step_run, name), getattr(ff_run, name)
        assert list(a.columns) == list(b.columns) and len(a) == len(b), name
        for c in a.columns:
            assert a[c].map(repr).tolist() == b[c].map(repr).tolist(), f"{name}.{c}"


def _trace(seed: int, n: int) -> Trace:
    """n requests: each either a fresh prompt, or an earlier request's prompt, then some of the
    outputs it is decoding (token 0), then tokens of its own; arrivals close together."""
    rnd = random.Random(seed)
    prompts: list[list[int]] = []
    requests = []
    t = 0.0
    for i in range(n):
        if prompts and rnd.random() < 0.6:
            base = rnd.choice(prompts)
            prompt = base + [OUTPUT_TOKEN] * rnd.randint(0, 40) + list(range(100_000 * (i + 1), 100_000 * (i + 1) + rnd.randint(1, 300)))
        else:
            prompt = list(range(100_000 * (i + 1), 100_000 * (i + 1) + rnd.randint(20, 400)))
        prompts.append(prompt)
        requests.append(TraceRequest(arrival_s=t, input_len=len(prompt), output_len=rnd.randint(20, 250), input_ids=prompt))
        t += rnd.choice([0.0, 0.01, 0.2, 1.0])
    return Trace(requests=requests)


def _counting(monkeypatch) -> dict[str, int]:
    seen = {"refused": 0, "not_refused": 0}
    check = VllmDecodeStretches._head_surely_refused

    def counting(self):
        refused = check(self)
        seen["refused" if refused else "not_refused"] += 1
        return refused

    monkeypatch.setattr(VllmDecodeStretches, "_head_surely_refused", counting)
    return seen


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("page_size", [4, 16])
def test_stretches_beside_a_refused_head_give_the_run_that_stepping_gives(overlap, page_size, tmp_path, monkeypatch):
    seen = _counting(monkeypatch)
    total = {"refused": 0, "not_refused": 0}
    for seed in range(4):
        tmp = tmp_path / str(seed)
        tmp.mkdir()
        path = tmp / "trace.json"
        _trace(seed, 40).write(path)
        opts = dict(scheduler="vllm", overlap=overlap, page_size=page_size, kv_tokens=1200)
        step = _replay(path, tmp / "step", fast_forward=False, **opts)
        seen.update(refused=0, not_refused=0)
        ff = _replay(path, tmp / "ff", fast_forward=True, **opts)
        for k in total:
            total[k] += seen[k]
        _assert_runs_equal(step, ff)
    assert total["refused"] >= 10 and total["not_refused"] >= 10, total


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 10_000),
    overlap=st.booleans(),
    page_size=st.sampled_from([1, 4, 16]),
    kv_tokens=st.sampled_from([600, 1200, 2400]),
    max_num_batched_tokens=st.sampled_from([64, 8192]),
)
def test_stretches_beside_a_refused_head_property(seed, overlap, page_size, kv_tokens, max_num_batched_tokens, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("refused")
    path = tmp / "trace.json"
    _trace(seed, 25).write(path)
    opts = dict(scheduler="vllm", overlap=overlap, page_size=page_size, kv_tokens=kv_tokens, max_num_batched_tokens=max_num_batched_tokens)
    _assert_runs_equal(_replay(path, tmp / "step", fast_forward=False, **opts), _replay(path, tmp / "ff", fast_forward=True, **opts))


@pytest.mark.parametrize("overlap", [False, True])
def test_a_head_admitted_when_a_running_request_extends_its_prefix(overlap, tmp_path):
    """B waits for blocks; A, running, decodes the tokens B's prompt goes on with (blocks of
    4, a pool of 48 blocks). Without overlap, B's cached prefix grows by the block A fills and
    B is admitted then, while A runs: a stretch must not go past that step."""
    a = list(range(1000, 1040))
    b = a + [OUTPUT_TOKEN] * 120 + list(range(5000, 5030))
    trace = Trace(
        requests=[
            TraceRequest(arrival_s=0.0, input_len=len(a), output_len=150, input_ids=a),
            TraceRequest(arrival_s=0.05, input_len=len(b), output_len=1, input_ids=b),
        ]
    )
    path = tmp_path / "trace.json"
    trace.write(path)
    opts = dict(scheduler="vllm", overlap=overlap, page_size=4, kv_tokens=192)
    step = _replay(path, tmp_path / "step", fast_forward=False, **opts)
    _assert_runs_equal(step, _replay(path, tmp_path / "ff", fast_forward=True, **opts))
    if not overlap:
        reqs = step[1].requests
        assert reqs["scheduled"][1] < reqs["finish"][0], "B was admitted only after A left"
        assert reqs["cached_tokens"][1] > 48, "B's prefix did not grow while it waited"
