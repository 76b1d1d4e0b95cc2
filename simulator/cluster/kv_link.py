"""The link a request's KV crosses from its prefill instance to its decode instance: the presets,
the --kv-link spec, and the transfers under way sharing it (KvFabric).

A transfer carries the prompt's KV: the model's KV bytes per token per TP shard
(ModelConfig.kv_bytes_per_token: each GPU of a TP group holds its shard and sends it over its own
link, all at once) times the prompt's tokens. It takes the link's latency, then its bytes at the
bandwidth it gets. Bandwidths are per GPU and one way.

Sharing: every instance has one port of the link's bandwidth (its GPUs' NICs, or their NVLink); a
transfer leaves through its prefill instance's port and enters through its decode instance's. The
transfers whose bytes are under way share the ports max-min fairly (progressive filling, as TCP's
or RDMA's congestion control roughly does): two transfers out of one port get half of it each,
and a transfer held back by a busy port leaves the rest of the other port to the others. The
rates change only when a transfer starts or ends, so each transfer's end is known until then.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import simpy


@dataclass(frozen=True)
class KvLink:
    name: str  # a preset's name, or the spec as given
    gb_per_s: float  # gigabytes (1e9 bytes) a second, one way, per GPU
    latency_us: float  # each transfer's, before its bytes flow

    @property
    def bytes_per_s(self) -> float:
        return self.gb_per_s * 1e9

    @property
    def latency_s(self) -> float:
        return self.latency_us * 1e-6

    def record(self) -> dict:
        """What run.json says of it."""
        return {"name": self.name, "gb_per_s": self.gb_per_s, "latency_us": self.latency_us}


# The presets, one way, per GPU. Bandwidths are the hardware's line rates; latencies are each
# transfer's fixed cost (the software that starts it and sees it end), of which the wire's own is
# the smaller part.
KV_LINKS: dict[str, KvLink] = {
    # NVLink 4 (H100 SXM, within one node): 900 GB/s per GPU, both ways together (NVIDIA's H100
    # datasheet), 450 GB/s each way. Latency: a peer copy started on a CUDA stream, a few us.
    "nvlink": KvLink("nvlink", 450.0, 5.0),
    # RDMA over one 400 Gb/s NIC per GPU (ConnectX-7, NDR InfiniBand or 400 GbE RoCE, as PD
    # deployments pair a NIC with each GPU; SGLang's Mooncake and NIXL backends write over it):
    # 400 / 8 = 50 GB/s. Latency: posting the RDMA writes and polling their completion, ~10 us.
    "rdma": KvLink("rdma", 50.0, 10.0),
    # TCP over 25 Gb/s Ethernet (a cloud VM's NIC): 25 / 8 = 3.125 GB/s. Latency: a round through
    # the kernel's TCP stack within one data centre, ~50 us.
    "tcp": KvLink("tcp", 3.125, 50.0),
}
DEFAULT_KV_LINK = "rdma"
KV_LINK_FORMAT = "nvlink, rdma, tcp, or GBPS,LATENCY_US (gigabytes a second and microseconds, e.g. 50,10)"


def parse_kv_link(spec: str) -> KvLink:
    """A preset's name or `GBPS,LATENCY_US`; ValueError saying what is wrong."""
    text = str(spec).strip()
    if text.lower() in KV_LINKS:
        return KV_LINKS[text.lower()]
    parts = text.split(",")
    if len(parts) != 2:
        raise ValueError(f"give {KV_LINK_FORMAT}")
    try:
        gb_per_s, latency_us = float(parts[0]), float(parts[1])
    except ValueError:
        raise ValueError(f"GBPS and LATENCY_US must be numbers ({KV_LINK_FORMAT})") from None
    if not (math.isfinite(gb_per_s) and gb_per_s > 0):
        raise ValueError(f"the bandwidth must be a positive number of GB/s, got {parts[0].strip()}")
    if not (math.isfinite(latency_us) and latency_us >= 0):
        raise ValueError(f"the latency must be a number of microseconds >= 0, got {parts[1].strip()}")
    return KvLink(f"{gb_per_s:g},{latency_us:g}", gb_per_s, latency_us)


@dataclass(eq=False, slots=True)
class Transfer:
    src: int  # the ports it goes through: its prefill instance's, out
    dst: int  # and its decode instance's, in
    nbytes: float
    done: Callable[[Transfer], None]  # called when its last byte is through
    sent: float  # when it was sent (its latency starts)
    remaining: float = 0.0  # bytes not yet through (as of KvFabric._at)
    rate: float = 0.0  # bytes a second while the transfers under way stay the same
    end: float | None = None

    @property
    def seconds(self) -> float:
        assert self.end is not None
        return self.end - self.sent


class KvFabric:
    """The transfers of one link on a SimPy clock: send() one, and its done() is called when its
    bytes are through. Ports are the instances' numbers."""

    def __init__(self, env: simpy.Environment, link: KvLink) -> None:
        self.env, self.link = env, link
        self.flowing: list[Transfer] = []  # past their latency, bytes under way, in start order
        self._at = 0.0  # when every flowing transfer's `remaining` was brought up to date
        self._version = 0  # the ends scheduled under older rates are stale
        self.sent = 0
        self.most_flowing = 0  # the most transfers under way at once

    def send(self, src: int, dst: int, nbytes: float, done: Callable[[Transfer], None]) -> Transfer:
        t = Transfer(src, dst, float(nbytes), done, self.env.now, float(nbytes))
        self.sent += 1
        latency = self.env.timeout(self.link.latency_s)
        latency.callbacks.append(lambda _event: self._start(t))
        return t

    def _start(self, t: Transfer) -> None:
        self._advance()
        self.flowing.append(t)
        self.most_flowing = max(self.most_flowing, len(self.flowing))
        self._reschedule()

    def _advance(self) -> None:
        now = self.env.now
        dt = now - self._at
        if dt > 0:
            for f in self.flowing:
                f.remaining -= f.rate * dt
        self._at = now

    def _share(self) -> None:
        """Max-min fair rates (progressive filling): the port that can give its transfers still
        unfixed the least each fixes them at that share; the rest share what is left."""
        cap = self.link.bytes_per_s
        users: dict[tuple[str, int], list[Transfer]] = {}
        for f in self.flowing:
            users.setdefault(("out", f.src), []).append(f)
            users.setdefault(("in", f.dst), []).append(f)
        left = dict.fromkeys(users, cap)
        unfixed = {id(f) for f in self.flowing}
        while unfixed:
            shares = {}
            for port, fs in users.items():
                n = sum(1 for f in fs if id(f) in unfixed)
                if n:
                    shares[port] = left[port] / n
            share = min(shares.values())
            for port, s in shares.items():
                if s > share:
                    continue
                for f in users[port]:
                    if id(f) in unfixed:
                        unfixed.discard(id(f))
                        f.rate = share
                        left[("out", f.src)] -= share
                        left[("in", f.dst)] -= share

    def _reschedule(self) -> None:
        self._version += 1
        if not self.flowing:
            return
        self._share()
        ends = [f.remaining / f.rate for f in self.flowing]
        first = min(ends)
        due = [f for f, e in zip(self.flowing, ends) if e <= first]
        version = self._version
        event = self.env.timeout(max(first, 0.0))
        event.callbacks.append(lambda _event: self._finish(version, due))

    def _finish(self, version: int, due: list[Transfer]) -> None:
        if version != self._version:
            return  # the rates changed since this end was scheduled
        self._advance()
        now = self.env.now
        for f in due:
            f.remaining, f.end = 0.0, now
            self.flowing.remove(f)
        self._reschedule()
        for f in due:
            f.done(f)
