"""The KV link (simulator/cluster/kv_link.py): its presets and spec, and transfers sharing it: a lone
transfer takes its latency and its bytes at the full bandwidth; transfers under way at once share
the ports they go through, max-min fairly, and speed up when one ends."""

from __future__ import annotations

import pytest
import simpy

from simulator.cluster.kv_link import KV_LINKS, KvFabric, KvLink, parse_kv_link

GB = 1e9


def test_presets_and_the_spec_parse():
    assert parse_kv_link("rdma") == KV_LINKS["rdma"] and KV_LINKS["rdma"].bytes_per_s == 50 * GB
    assert parse_kv_link("NVLink").gb_per_s == 450.0 and parse_kv_link("tcp").gb_per_s == 3.125
    custom = parse_kv_link("100,2.5")
    assert (custom.gb_per_s, custom.latency_us) == (100.0, 2.5) and custom.latency_s == pytest.approx(2.5e-6)


@pytest.mark.parametrize(
    "spec, needle",
    [("infiniband", "GBPS,LATENCY_US"), ("50", "GBPS,LATENCY_US"), ("fast,1", "numbers"), ("0,5", "bandwidth"), ("50,-1", "latency")],
)
def test_a_spec_that_does_not_parse_says_why(spec, needle):
    with pytest.raises(ValueError, match=needle):
        parse_kv_link(spec)


def _run(link: KvLink, sends: list[tuple[float, int, int, float]]) -> list[float]:
    """Each (when, src, dst, bytes) sent at its time; the seconds each took, in order."""
    env = simpy.Environment()
    fabric = KvFabric(env, link)
    out: list = [None] * len(sends)

    def sender(k, when, src, dst, nbytes):
        yield env.timeout(when)
        fabric.send(src, dst, nbytes, lambda t, k=k: out.__setitem__(k, t.seconds))

    for k, s in enumerate(sends):
        env.process(sender(k, *s))
    env.run()
    return out


def test_a_lone_transfer_takes_latency_plus_bytes_over_bandwidth():
    link = parse_kv_link("50,10")
    (t,) = _run(link, [(0.0, 0, 1, 2 * GB)])
    assert t == pytest.approx(10e-6 + 2 * GB / (50 * GB), rel=1e-12)


def test_two_transfers_at_once_through_one_port_take_twice_as_long():
    link = parse_kv_link("50,10")
    alone = 10e-6 + 1 * GB / (50 * GB)
    same_pair = _run(link, [(0.0, 0, 2, GB), (0.0, 0, 2, GB)])
    assert same_pair == pytest.approx([10e-6 + 2 * GB / (50 * GB)] * 2, rel=1e-12)
    into_one = _run(link, [(0.0, 0, 2, GB), (0.0, 1, 2, GB)])  # two prefill instances into one decode instance
    assert into_one == pytest.approx(same_pair, rel=1e-12)
    apart = _run(link, [(0.0, 0, 2, GB), (0.0, 1, 3, GB)])  # no port in common: each at full speed
    assert apart == pytest.approx([alone, alone], rel=1e-12)


def test_a_transfer_that_starts_later_slows_the_one_under_way_and_speeds_up_when_it_ends():
    link = KvLink("test", 1.0, 0.0)  # 1 GB/s, no latency: 1 GB alone takes 1 s
    a, b = _run(link, [(0.0, 0, 1, GB), (0.5, 0, 1, GB)])
    # a: 0.5 GB alone, then 0.5 GB at half speed (1 s): ends at 1.5. b: 0.5 GB at half speed by 1.5, then 0.5 GB alone.
    assert (a, b) == pytest.approx((1.5, 1.5), rel=1e-12)


def test_max_min_fairness_gives_what_a_busy_port_leaves_to_the_others():
    link = KvLink("test", 1.0, 0.0)
    # Three transfers out of port 0 (a third each); the one into port 5 shares that port with one
    # from port 1, which then gets the two thirds port 5 has left.
    times = _run(link, [(0.0, 0, 3, GB), (0.0, 0, 4, GB), (0.0, 0, 5, GB), (0.0, 1, 5, GB)])
    assert times[3] == pytest.approx(1.5, rel=1e-12)  # at 2/3 GB/s
    assert times[:3] == pytest.approx([3.0, 3.0, 3.0], rel=1e-12)
