"""Scheduling rules of vLLM 0.19.0's v1 scheduler, as our VllmScheduler must follow them.

Each case is a small scenario (conformance/vllm_scenario.py) and the per-step record that vLLM's
own Scheduler / AsyncScheduler produced for it, taken with the vLLM oracle
(`python -m conformance.vllm_main --scenario FILE`, conformance/vllm_oracle.py) and kept here,
so that these run without vLLM. A record: [(rid, tokens scheduled)...], preempted (in order),
finished since the previous step, free blocks (cached-but-unreferenced included), prefix-cache
tokens of the requests admitted that step, running, waiting.

The eviction cases are where the core once differed (a radix tree in place of vLLM's block
pool): the oracle found them, and they stay as its record.
"""

from __future__ import annotations

import json

from conformance.vllm_ours import run_ours
from conformance.vllm_scenario import VllmScenario

# name: (scenario JSON, vLLM's steps, vLLM's output tokens per request)
GOLDEN = {
    "preempt-chunk": (
        '{"name":"preempt-chunk","kv_tokens":32,"context_len":32,"block_size":4,"max_num_seqs":4,"max_num_batched_tokens":8,"enable_prefix_caching":true,"policy":"fcfs","async_scheduling":false,"requests":[{"rid":"a","arrival_step":0,"prompt":[100,101,102,103,104,105,106,107,108,109],"max_new_tokens":12,"ignore_eos":true,"eos_at":null,"priority":0},{"rid":"b","arrival_step":0,"prompt":[100,101,102,103,104,105,7,8],"max_new_tokens":10,"ignore_eos":true,"eos_at":null,"priority":0},{"rid":"c","arrival_step":1,"prompt":[300,301,302,303,304,305,306,307,308],"max_new_tokens":6,"ignore_eos":false,"eos_at":3,"priority":0}]}',
        '[[[["a",8]],[],[],6,0,1,1],[[["a",2],["b",4],["c",2]],[],[],3,4,3,0],[[["a",1],["b",1],["c",6]],[],[],1,0,3,0],[[["a",1],["b",1],["c",1]],[],[],0,0,3,0],[[["a",1],["b",1]],["c"],[],2,0,2,1],[[["a",1],["b",1]],[],[],2,0,2,1],[[["a",1],["b",1]],[],[],1,0,2,1],[[["a",1],["b",1]],[],[],1,0,2,1],[[["a",1],["b",1]],[],[],0,0,2,1],[[["a",1],["b",1]],[],[],0,0,2,1],[[["a",1]],["b"],[],3,0,1,2],[[["a",1]],[],[],3,0,1,2],[[["a",1]],[],[],2,0,1,2],[[["b",5],["c",3]],[],["a"],2,12,2,0],[[["c",7]],[],["b"],5,0,1,0],[[["c",1]],[],[],5,0,1,0],[[["c",1]],[],[],5,0,1,0]]',
        '{"a": 12, "b": 10, "c": 4}',
    ),
    "preempt-chunk-async": (
        '{"name":"preempt-chunk-async","kv_tokens":32,"context_len":32,"block_size":4,"max_num_seqs":4,"max_num_batched_tokens":8,"enable_prefix_caching":true,"policy":"priority","async_scheduling":true,"requests":[{"rid":"a","arrival_step":0,"prompt":[100,101,102,103,104,105,106,107,108,109],"max_new_tokens":12,"ignore_eos":true,"eos_at":null,"priority":1},{"rid":"b","arrival_step":0,"prompt":[100,101,102,103,104,105,7,8],"max_new_tokens":10,"ignore_eos":true,"eos_at":null,"priority":0},{"rid":"c","arrival_step":1,"prompt":[300,301,302,303,304,305,306,307,308],"max_new_tokens":6,"ignore_eos":false,"eos_at":3,"priority":2}]}',
        '[[[["b",8]],[],[],6,0,1,1],[[["b",1],["a",6],["c",1]],[],[],2,4,3,0],[[["b",1],["a",1],["c",6]],[],[],1,0,3,0],[[["b",1],["a",1],["c",2]],[],[],0,0,3,0],[[["b",1],["a",1]],["c"],[],2,0,2,1],[[["b",1],["a",1]],[],[],1,0,2,1],[[["b",1],["a",1]],[],[],1,0,2,1],[[["b",1],["a",1]],[],[],1,0,2,1],[[["b",1],["a",1]],[],[],0,0,2,1],[[["b",1]],["a"],[],3,0,1,2],[[["a",2],["c",6]],[],["b"],1,16,2,0],[[["a",1],["c",4]],[],[],0,0,2,0],[[["a",1],["c",1]],[],[],0,0,2,0],[[["a",1]],["c"],[],2,0,1,1],[[["c",4]],[],["a"],5,8,1,0],[[["c",1]],[],[],4,0,1,0]]',
        '{"a": 12, "b": 10, "c": 4}',
    ),
    "async-eos-double-free": (
        '{"name":"async-eos-double-free","kv_tokens":16,"context_len":64,"block_size":1,"max_num_seqs":8,"max_num_batched_tokens":64,"enable_prefix_caching":true,"policy":"fcfs","async_scheduling":true,"requests":[{"rid":"r0","arrival_step":0,"prompt":[11,12,13],"max_new_tokens":2,"ignore_eos":false,"eos_at":0,"priority":0}]}',
        '[[[["r0",3]],[],[],13,0,1,0],[[["r0",1]],[],[],12,0,1,0]]',
        '{"r0": 1}',
    ),
    "async-eos-stop-token-cached": (
        '{"name":"async-eos-stop-token-cached","kv_tokens":32,"context_len":64,"block_size":1,"max_num_seqs":8,"max_num_batched_tokens":64,"enable_prefix_caching":true,"policy":"fcfs","async_scheduling":true,"requests":[{"rid":"r0","arrival_step":0,"prompt":[11,12,13],"max_new_tokens":2,"ignore_eos":false,"eos_at":0,"priority":0},{"rid":"r1","arrival_step":5,"prompt":[11,12,13,2,14,15],"max_new_tokens":1,"ignore_eos":true,"eos_at":null,"priority":0}]}',
        '[[[["r0",3]],[],[],29,0,1,0],[[["r0",1]],[],[],28,0,1,0],[[["r1",3]],[],["r0"],26,3,1,0]]',
        '{"r0": 1, "r1": 1}',
    ),
    "duplicate-block-stops-caching": (
        '{"name":"duplicate-block-stops-caching","kv_tokens":64,"context_len":64,"block_size":4,"max_num_seqs":4,"max_num_batched_tokens":64,"enable_prefix_caching":true,"policy":"fcfs","async_scheduling":false,"requests":[{"rid":"r0","arrival_step":0,"prompt":[100,101,102,103,104,105,106],"max_new_tokens":12,"ignore_eos":true,"eos_at":null,"priority":0},{"rid":"r1","arrival_step":1,"prompt":[100,101,102,103,104,105,106,3510,3517,3524,3531,3538],"max_new_tokens":1,"ignore_eos":true,"eos_at":null,"priority":0},{"rid":"r2","arrival_step":11,"prompt":[100,101,102,103,104,105,106,3510,3517,3524,3531,3538,3545,3552,3559,3566,3573],"max_new_tokens":1,"ignore_eos":true,"eos_at":null,"priority":0}]}',
        '[[[["r0",7]],[],[],14,0,1,0],[[["r0",1],["r1",4]],[],[],13,8,2,0],[[["r0",1]],[],["r1"],13,0,1,0],[[["r0",1]],[],[],13,0,1,0],[[["r0",1]],[],[],13,0,1,0],[[["r0",1]],[],[],13,0,1,0],[[["r0",1]],[],[],12,0,1,0],[[["r0",1]],[],[],12,0,1,0],[[["r0",1]],[],[],12,0,1,0],[[["r0",1]],[],[],12,0,1,0],[[["r0",1]],[],[],11,0,1,0],[[["r0",1],["r2",1]],[],[],9,16,2,0]]',
        '{"r0": 12, "r1": 1, "r2": 1}',
    ),
    "eviction-order": (
        '{"name":"eviction-order","kv_tokens":32,"context_len":64,"block_size":4,"max_num_seqs":8,"max_num_batched_tokens":64,"enable_prefix_caching":true,"policy":"fcfs","async_scheduling":false,"requests":[{"rid":"r0","arrival_step":0,"prompt":[100,101,102,103,104,105,106,107],"max_new_tokens":1,"ignore_eos":true,"eos_at":null,"priority":0},{"rid":"r1","arrival_step":2,"prompt":[200,201,202,203,204,205,206,207,208,209,210,211,212,213,214,215,216,217,218,219,220],"max_new_tokens":1,"ignore_eos":true,"eos_at":null,"priority":0},{"rid":"r2","arrival_step":4,"prompt":[300,301,302,303],"max_new_tokens":1,"ignore_eos":true,"eos_at":null,"priority":0},{"rid":"r3","arrival_step":6,"prompt":[100,101,102,103,104,105,106,107,9],"max_new_tokens":1,"ignore_eos":true,"eos_at":null,"priority":0}]}',
        '[[[["r0",8]],[],[],6,0,1,0],[[["r1",21]],[],["r0"],2,0,1,0],[[["r2",4]],[],["r1"],7,0,1,0],[[["r3",5]],[],["r2"],5,4,1,0]]',
        '{"r0": 1, "r1": 1, "r2": 1, "r3": 1}',
    ),
    "eviction-whole-leaf-after-preemption": (
        '{"name":"eviction-whole-leaf-after-preemption","kv_tokens":64,"context_len":32768,"block_size":16,"max_num_seqs":4,"max_num_batched_tokens":64,"enable_prefix_caching":true,"policy":"fcfs","async_scheduling":false,"requests":[{"rid":"r0","arrival_step":1,"prompt":[7868],"max_new_tokens":17,"ignore_eos":true,"eos_at":null,"priority":1},{"rid":"r2","arrival_step":13,"prompt":[18741,9729,13869,6749,11422,26692,884,27038,29175,26422,6712,3429,8683,21266,25331,5648,20373,28673,12332,13318,27394,16486,5704,894,15782,6869,7041,2731,12313,19755,7308,14664,9233,9024,22233,20278,7937,16495,17882,4442,11970,29103,18695,20763,15452,28645,1280,24493],"max_new_tokens":2,"ignore_eos":true,"eos_at":null,"priority":1}]}',
        '[[[["r0",1]],[],[],3,0,1,0],[[["r0",1]],[],[],3,0,1,0],[[["r0",1]],[],[],3,0,1,0],[[["r0",1]],[],[],3,0,1,0],[[["r0",1]],[],[],3,0,1,0],[[["r0",1]],[],[],3,0,1,0],[[["r0",1]],[],[],3,0,1,0],[[["r0",1]],[],[],3,0,1,0],[[["r0",1]],[],[],3,0,1,0],[[["r0",1]],[],[],3,0,1,0],[[["r0",1]],[],[],3,0,1,0],[[["r0",1]],[],[],3,0,1,0],[[["r0",1],["r2",48]],[],[],0,0,2,0],[[["r0",1]],["r2"],[],3,0,1,1],[[["r0",1]],[],[],3,0,1,1],[[["r0",1]],[],[],3,0,1,1],[[["r0",1]],[],[],2,0,1,1],[[["r2",17]],[],["r0"],0,32,1,0]]',
        '{"r0": 17, "r2": 2}',
    ),
}


def _ours(name: str):
    sc = VllmScenario.from_json(GOLDEN[name][0])
    return run_ours(sc)


def _steps(run) -> list:
    return [
        [[list(x) for x in s.reqs], s.preempted, s.finished, s.free_blocks, s.cache_hit_tokens, s.num_running, s.num_waiting]
        for s in run.steps
    ]


def _assert_steps(name: str, run) -> None:
    expected = json.loads(GOLDEN[name][1])
    got = _steps(run)
    for i, (a, b) in enumerate(zip(got, expected)):
        assert a == b, f"{name}: step {i}: ours {a}, vLLM {b}"
    assert len(got) == len(expected), f"{name}: {len(got)} steps, vLLM {len(expected)}"
    assert run.outputs == json.loads(GOLDEN[name][2])


def test_scenario_json_round_trip():
    sc = VllmScenario.from_json(GOLDEN["preempt-chunk"][0])
    assert VllmScenario.from_json(sc.to_json()) == sc


def test_preemption_chunking_and_prefix_hits_follow_vllm():
    """FCFS, 8-token budget, 8 blocks of 4: chunked prefills, a hit on a shared prompt block,
    two preemptions (the last admitted first), a resumed request hitting its own blocks."""
    run = _ours("preempt-chunk")
    assert run.error is None
    _assert_steps("preempt-chunk", run)


def test_async_priority_preemption_steps_follow_vllm():
    """The same under async scheduling and the priority policy (the lowest priority preempted)."""
    _assert_steps("preempt-chunk-async", _ours("preempt-chunk-async"))


def test_async_eos_stop_frees_each_block_once():
    for name in ("async-eos-double-free", "preempt-chunk-async"):
        assert _ours(name).error is None


def test_async_eos_stop_token_stays_out_of_the_cache():
    _assert_steps("async-eos-stop-token-cached", _ours("async-eos-stop-token-cached"))


def test_eviction_follows_vllms_free_block_queue():
    _assert_steps("eviction-order", _ours("eviction-order"))


def test_blocks_after_a_duplicate_are_cached():
    _assert_steps("duplicate-block-stops-caching", _ours("duplicate-block-stops-caching"))


def test_eviction_takes_one_block_at_a_time():
    _assert_steps("eviction-whole-leaf-after-preemption", _ours("eviction-whole-leaf-after-preemption"))
