"""Sending a trace to a live server on time, on one asyncio loop and one connection pool.

Open loop: each request is sent at its arrival time (a task of its own, so a slow response never
delays the next send); the lag between the two is recorded. Closed loop (`--concurrency N`): N
clients, each sending its next request (in trace order) when its last one ended. Meanwhile the
server's `/metrics` is read once a second, where it has one.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import aiohttp

from testbed.live.openai_stream import StreamRecord, stream_request
from testbed.live.prometheus import ServerGauges, gauges

SCRAPE_INTERVAL_S = 1.0


@dataclass
class LiveRequest:
    index: int
    arrival: float  # when the trace sends it, on the replay's clock (open loop)
    body: Callable[[], dict]  # the request body, made when it is sent
    record: StreamRecord = field(default_factory=StreamRecord)


@dataclass
class Scrape:
    t: float
    gauges: ServerGauges
    received: int  # output tokens the client had received by then, over every request


@dataclass
class LiveRun:
    """What a run collects as it goes (read after an interrupt too)."""

    requests: Sequence[LiveRequest]
    scrapes: list[Scrape] = field(default_factory=list)
    done: int = 0


async def _scrape_once(session: aiohttp.ClientSession, url: str, clock, run: LiveRun) -> bool:
    """Read /metrics once into run.scrapes; False when it did not answer."""
    try:
        async with asyncio.timeout(SCRAPE_INTERVAL_S * 2):
            async with session.get(url) as resp:
                text = await resp.text() if resp.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
        text = None
    if text is None:
        return False
    received = sum(len(req.record.token_times) for req in run.requests)
    run.scrapes.append(Scrape(clock(), gauges(text), received))
    return True


async def _scrape_forever(session: aiohttp.ClientSession, url: str, clock, run: LiveRun) -> None:
    while await _scrape_once(session, url, clock, run):  # (no /metrics: the steps table stays empty)
        await asyncio.sleep(SCRAPE_INTERVAL_S)


async def send_all(
    run: LiveRun,
    endpoint_url: str,
    metrics_url: str | None,
    concurrency: int | None,
    timeout_s: float | None,
    on_done: Callable[[LiveRequest], None] | None = None,
) -> None:
    """Send run.requests (sorted by arrival) and wait for every one to end."""
    t0 = time.perf_counter()

    def clock() -> float:
        return time.perf_counter() - t0

    # One pool, no cap on connections: the benchmark's clients are not to queue in the client.
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:

        async def one(req: LiveRequest) -> None:
            await stream_request(session, endpoint_url, req.body(), clock, timeout_s, req.record)
            run.done += 1
            if on_done is not None:
                on_done(req)

        scraper = asyncio.create_task(_scrape_forever(session, metrics_url, clock, run)) if metrics_url else None
        try:
            if concurrency is None:
                tasks = []
                for req in run.requests:
                    delay = req.arrival - clock()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    tasks.append(asyncio.create_task(one(req)))
                await asyncio.gather(*tasks)
            else:
                queue = iter(run.requests)

                async def client() -> None:
                    for req in queue:  # (one iterator shared by the clients: each takes the next)
                        await one(req)

                await asyncio.gather(*(client() for _ in range(concurrency)))
        finally:
            if scraper is not None:
                scraper.cancel()
        if scraper is not None and run.scrapes:  # the last interval's tokens, and the server at rest
            await _scrape_once(session, metrics_url, clock, run)
