"""A cluster on one clock (simulator/cluster/): one instance behind a router is the single-instance
run, time for time; the routing policies decide as their rules say."""

from __future__ import annotations

import pytest

from scheduler.core.req import Req
from scheduler.core.sampling import SamplingParams
from scheduler.loop.event_loop import EventLoop
from scheduler.model_config import load_model_config
from scheduler.sglang.config import SchedulerConfig
from scheduler.sglang.scheduler import Scheduler
from scheduler.vllm.config import VllmSchedulerConfig
from scheduler.vllm.scheduler import VllmScheduler
from simulator.cluster.cluster import Cluster
from simulator.cluster.prefix_index import BLOCK, PrefixIndex, prompt_keys
from simulator.cluster.routing import InstanceView, Policy, RoutingConfig, parse_weights
from simulator.costs.roofline import RooflineCostModel
from simulator.driver.sim_driver import SimDriver
from simulator.hardware.specs import load_hardware

MODEL = load_model_config("llama-3.1-8b")


def _reqs(n: int = 40) -> list[Req]:
    out = []
    for i in range(n):
        prompt = [1000 + (i % 3)] * 64 + list(range(i * 500, i * 500 + 40 + 7 * (i % 5)))
        out.append(Req(str(i), len(prompt), (lambda p=prompt: p), SamplingParams(max_new_tokens=30 + i % 11), 0.013 * i, index=i))
    return out


def _scheduler(kind: str, overlap: bool):
    if kind == "vllm":
        return VllmScheduler(VllmSchedulerConfig(kv_tokens=6000, context_len=8192, overlap=overlap))
    return Scheduler(SchedulerConfig(kv_tokens=6000, context_len=8192, overlap=overlap))


def _cost():
    return RooflineCostModel(MODEL, load_hardware("h100"))


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("fast_forward", [False, True])
def test_one_instance_behind_a_router_is_the_single_instance_run(kind, overlap, fast_forward):
    single_reqs = _reqs()
    sched = _scheduler(kind, overlap)
    driver = SimDriver(_cost(), fast_forward)
    loop = EventLoop(sched, iter(single_reqs), driver.clock, overlap)
    driver.run(loop)

    cluster_reqs = _reqs()
    cluster = Cluster(
        iter(cluster_reqs),
        1,
        lambda i, env: (_scheduler(kind, overlap), SimDriver(_cost(), fast_forward, env), 6000),
        Policy(RoutingConfig("round-robin"), 1),
        overlap,
    )
    cluster.run()
    for a, b in zip(single_reqs, cluster_reqs):
        assert b.finished() and len(a.output_ids) == len(b.output_ids)
        assert abs(a.first_token_time - b.first_token_time) <= 1e-9 and abs(a.finish_time - b.finish_time) <= 1e-9, a.rid
        assert max(abs(x - y) for x, y in zip(a.token_times, b.token_times)) <= 1e-9
    steps = cluster.instances[0].loop.steps
    assert len(steps) == len(loop.steps)
    for name in ("batch_size", "num_tokens", "num_running", "kv_used_tokens"):
        assert list(steps.cols[name]) == list(loop.steps.cols[name]), name


def test_round_robin_random_and_power_of_two():
    views = [InstanceView(requests=r) for r in (5, 1, 3)]
    rr = Policy(RoutingConfig("round-robin"), 3)
    assert [rr.choose(views, None, [0, 0, 0]) for _ in range(5)] == [0, 1, 2, 0, 1]
    rnd = Policy(RoutingConfig("random", seed=1), 3)
    picks = [rnd.choose(views, None, [0, 0, 0]) for _ in range(300)]
    assert min(picks.count(i) for i in range(3)) > 70  # each about a third of 300
    p2 = Policy(RoutingConfig("power-of-two", seed=1), 3)
    for _ in range(50):  # the busiest instance (5) loses against either other one
        assert p2.choose(views, None, [0, 0, 0]) != 0


def test_least_requests_and_least_tokens_take_the_least_loaded():
    views = [InstanceView(requests=4, outstanding_tokens=10), InstanceView(requests=2, outstanding_tokens=900), InstanceView(4, 50)]
    assert Policy(RoutingConfig("least-requests"), 3).choose(views, None, [0] * 3) == 1
    assert Policy(RoutingConfig("least-tokens"), 3).choose(views, None, [0] * 3) == 0


def test_cache_aware_follows_sglangs_router_rule():
    policy = Policy(RoutingConfig("cache-aware"), 3)
    balanced = [InstanceView(requests=r) for r in (3, 4, 5)]
    # Balanced: the best match when above the threshold, else the smallest index.
    assert policy.choose(balanced, [0.2, 0.8, 0.6], [10, 20, 30]) == 1
    assert policy.choose(balanced, [0.2, 0.4, 0.5], [10, 5, 30]) == 1  # 0.5 is not above 0.5
    # Imbalanced (max - min > 32 and max > 1.0001 x min): the least loaded, whatever the match.
    skewed = [InstanceView(requests=r) for r in (40, 2, 9)]
    assert policy.choose(skewed, [0.9, 0.0, 0.0], [10, 20, 30]) == 1


def test_weighted_sums_its_scorers():
    views = [InstanceView(requests=10, kv_usage=0.9), InstanceView(requests=0, kv_usage=0.1)]
    prefix_heavy = Policy(RoutingConfig("weighted", weights=parse_weights("prefix=10,queue=1,kv=1")), 2)
    assert prefix_heavy.choose(views, [1.0, 0.0], [0, 0]) == 0
    queue_heavy = Policy(RoutingConfig("weighted", weights=parse_weights("prefix=1,queue=10,kv=1")), 2)
    assert queue_heavy.choose(views, [1.0, 0.0], [0, 0]) == 1
    with pytest.raises(ValueError, match="NAME=WEIGHT"):
        parse_weights("prefix=1,speed=2")


def test_the_routers_prefix_index_matches_whole_blocks_and_forgets_the_oldest():
    a = list(range(100))
    b = list(range(40)) + [7] * 60
    index = PrefixIndex(max_blocks=8)
    index.insert(prompt_keys(a))  # 6 blocks
    assert index.match(prompt_keys(a)) == 100 // BLOCK
    assert index.match(prompt_keys(b)) == 40 // BLOCK  # the shared 32 tokens: 2 whole blocks
    index.insert(prompt_keys([9] * 64))  # 4 more blocks: the 2 least recently used go
    assert len(index) == 8 and index.match(prompt_keys(a)) == 0
