"""Prefill/decode disaggregation on one clock (simulator/cluster/pd.py): a lone request's TTFT is its
prefill plus its transfer; transfers under way at once share the link; a decode instance short of
KV holds requests back (and their prefill with them), counted; stepping and fast-forward agree;
both schedulers, overlap on and off."""

from __future__ import annotations

import pytest

from scheduler.core.req import Req
from scheduler.core.sampling import SamplingParams
from scheduler.disagg.sglang_roles import RESERVED_DECODE_TOKENS, SglangDecode, SglangPrefill
from scheduler.disagg.vllm_roles import VllmDecode, VllmPrefill
from scheduler.loop.event_loop import EventLoop
from scheduler.model_config import load_model_config
from scheduler.sglang.config import SchedulerConfig
from scheduler.sglang.scheduler import Scheduler
from scheduler.vllm.config import VllmSchedulerConfig
from scheduler.vllm.scheduler import VllmScheduler
from simulator.cluster.kv_link import parse_kv_link
from simulator.cluster.pd import PdCluster
from simulator.cluster.routing import Policy, RoutingConfig
from simulator.costs.roofline import RooflineCostModel
from simulator.driver.sim_driver import SimDriver
from simulator.hardware.specs import load_hardware

MODEL = load_model_config("llama-3.1-8b")
PER_TOKEN = MODEL.kv_bytes_per_token(2, 1)  # 128 KiB: K and V of 32 layers, 8 KV heads of 128, bf16
LINK = parse_kv_link("50,10")  # RDMA's: 50 GB/s, 10 us
ROLES = {"sglang": (SglangPrefill, SglangDecode), "vllm": (VllmPrefill, VllmDecode)}


def _config(kind: str, overlap: bool, kv_tokens: int):
    if kind == "vllm":
        return VllmSchedulerConfig(kv_tokens=kv_tokens, context_len=8192, overlap=overlap)
    return SchedulerConfig(kv_tokens=kv_tokens, context_len=8192, overlap=overlap)


def _req(i: int, prompt_len: int, out: int, at: float) -> Req:
    prompt = list(range(i * 10_000, i * 10_000 + prompt_len))
    return Req(str(i), prompt_len, (lambda p=prompt: p), SamplingParams(max_new_tokens=out), at, index=i)


def _cost():
    return RooflineCostModel(MODEL, load_hardware("h100"))


def _pd(kind, overlap, reqs, num_prefill=1, num_decode=1, kv_tokens=20000, fast_forward=True) -> PdCluster:
    prefill_cls, decode_cls = ROLES[kind]

    def make(i, env, role):
        cls = prefill_cls if role == "prefill" else decode_cls
        return cls(_config(kind, overlap, kv_tokens)), SimDriver(_cost(), fast_forward, env, wakeable=True), kv_tokens

    cluster = PdCluster(
        iter(reqs), num_prefill, num_decode, make, Policy(RoutingConfig("round-robin"), num_prefill), overlap, LINK, PER_TOKEN
    )
    cluster.run()
    for inst in cluster.instances:
        inst.scheduler.check_invariants()
    return cluster


def _alone(kind, overlap, req: Req) -> Req:
    """The request alone on one (aggregated) instance."""
    sched = VllmScheduler(_config(kind, overlap, 20000)) if kind == "vllm" else Scheduler(_config(kind, overlap, 20000))
    driver = SimDriver(_cost())
    driver.run(EventLoop(sched, iter([req]), driver.clock, overlap))
    return req


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
@pytest.mark.parametrize("overlap", [False, True])
def test_a_lone_requests_ttft_is_its_prefill_plus_its_transfer(kind, overlap):
    alone = _alone(kind, overlap, _req(0, 3000, 40, 0.5))
    req = _req(0, 3000, 40, 0.5)
    cluster = _pd(kind, overlap, [req])
    transfer = LINK.latency_s + 3000 * PER_TOKEN / LINK.bytes_per_s  # 10 us + 393 MB at 50 GB/s: 7.9 ms
    prefill_ttft = alone.first_token_time - alone.arrival_time
    assert req.first_token_time - req.arrival_time == pytest.approx(prefill_ttft + transfer, abs=1e-9)
    assert cluster.records[0].transfer.seconds == pytest.approx(transfer, abs=1e-12)
    assert req.finished() and len(req.output_ids) == 40 and len(req.token_times) == 40
    assert req.token_times[0] == req.first_token_time  # the first token reaches the client with the KV
    assert req.instance == 0 and cluster.records[0].decode == 1


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_two_transfers_at_once_share_the_link_and_take_twice_as_long(kind):
    # Two requests arrive together: one prefill batch, two transfers out of its instance at once.
    reqs = [_req(0, 2000, 20, 0.0), _req(1, 2000, 20, 0.0)]
    cluster = _pd(kind, False, reqs)
    bytes_time = 2000 * PER_TOKEN / LINK.bytes_per_s
    both = [cluster.records[i].transfer for i in (0, 1)]
    assert both[0].sent == both[1].sent  # (one prefill batch)
    for t in both:
        assert t.seconds == pytest.approx(LINK.latency_s + 2 * bytes_time, abs=1e-12)
    for r, t in zip(reqs, both):
        assert r.first_token_time == pytest.approx(t.end, abs=1e-12)  # the decode instance was idle: it takes them at once


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_a_decode_instance_short_of_kv_holds_requests_back_and_counts_them(kind):
    # Each prompt fills most of the decode pool (SGLang: with its 512 reserved decode tokens; vLLM:
    # its blocks): one request at a time is pre-allocated there, the others wait, and so do their prefills.
    pool = 2048 if kind == "sglang" else 1200
    prompt = 1000 if kind == "sglang" else 700
    reqs = [_req(i, prompt, 30, 0.001 * i) for i in range(4)]
    cluster = _pd(kind, False, reqs, kv_tokens=pool)
    if kind == "sglang":
        assert prompt + RESERVED_DECODE_TOKENS <= pool < 2 * prompt + RESERVED_DECODE_TOKENS
    else:
        assert -(-prompt // 16) <= pool // 16 < 2 * -(-prompt // 16)  # blocks of 16
    recs = [cluster.records[i] for i in range(4)]
    held = [r for r in recs if r.held_s > 0]
    assert len(held) == 3 and recs[0].held_s == 0
    for r in recs:
        assert r.req.finished() and len(r.req.output_ids) == 30
        assert r.twin.scheduled_time >= r.preallocated_at  # its prefill waited for the decode side's KV
    for a, b in zip(recs, recs[1:]):
        assert b.preallocated_at >= a.req.finish_time  # the next one gets KV once the one before has finished
    assert recs[3].req.first_token_time - recs[3].req.arrival_time > 3 * (recs[0].req.finish_time - recs[0].req.first_token_time)


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
@pytest.mark.parametrize("overlap", [False, True])
def test_fast_forward_equals_stepping(kind, overlap):
    def reqs():
        return [_req(i, 200 + 37 * (i % 7), 20 + i % 13, 0.004 * i) for i in range(60)]

    stepped, taken = reqs(), reqs()
    _pd(kind, overlap, stepped, num_prefill=2, num_decode=2, kv_tokens=3000, fast_forward=False)
    cluster = _pd(kind, overlap, taken, num_prefill=2, num_decode=2, kv_tokens=3000)
    assert any(r.held_s > 0 for r in cluster.records.values())  # (the tight pools hold some back)
    for a, b in zip(stepped, taken):
        assert b.finished() and a.first_token_time == pytest.approx(b.first_token_time, abs=1e-9), a.rid
        assert max(abs(x - y) for x, y in zip(a.token_times, b.token_times)) <= 1e-9
