"""A hand-driven EventLoop that counts what it yields: tests of fast-forward check with it that
decode stretches are really taken (a test of equality proves little if none ever is)."""

from __future__ import annotations

from scheduler.loop.event_loop import EventLoop, FastForward


class CountingLoop(EventLoop):
    """Counts the waits the loop yields to its driver (one per stage of a step; one per stretch)."""

    waits = 0
    stretch_waits = 0

    def run(self):
        gen, value = super().run(), None
        while True:
            try:
                wait = gen.send(value)
            except StopIteration:
                return
            self.waits += 1
            self.stretch_waits += isinstance(wait, FastForward)
            value = yield wait


def run_spaced_requests(sched, count: int, gap: float, seed: int, fast_forward: bool, overlap: bool) -> CountingLoop:
    """sched serves `count` requests `gap` s apart, each with 50-300 prompt tokens of its own (no
    shared prefix) and 100-400 outputs (long decodes between arrivals), on Llama-3.1-8B's H100
    roofline; the loop after the run, the scheduler's invariants checked."""
    import random

    from scheduler.core.req import Req
    from scheduler.core.sampling import SamplingParams
    from scheduler.model_config import load_model_config
    from simulator.costs.roofline import RooflineCostModel
    from simulator.driver.sim_driver import SimDriver
    from simulator.hardware.specs import load_hardware

    rnd = random.Random(seed)
    cost = RooflineCostModel(load_model_config("llama-3.1-8b"), load_hardware("h100"))
    reqs = []
    for i in range(count):
        n = rnd.randint(50, 300)
        prompt = list(range(i * 1000, i * 1000 + n))
        reqs.append(Req(str(i), n, (lambda p=prompt: p), SamplingParams(max_new_tokens=rnd.randint(100, 400)), gap * i, index=i))
    driver = SimDriver(cost, fast_forward=fast_forward)
    loop = CountingLoop(sched, iter(reqs), driver.clock, overlap)
    driver.run(loop)
    sched.check_invariants()
    return loop


def run_closed_loop(sched, fast_forward: bool, overlap: bool) -> CountingLoop:
    """sched serves 24 requests of 100 to 400 output tokens from 4 clients (long decodes between
    finishes) on Llama-3.1-8B's H100 roofline; the loop after the run, the invariants checked."""
    import numpy as np

    from scheduler.core.req import Req
    from scheduler.core.sampling import SamplingParams
    from scheduler.loop.arrivals import ClosedLoopArrivals
    from scheduler.model_config import load_model_config
    from simulator.costs.roofline import RooflineCostModel
    from simulator.driver.sim_driver import SimDriver
    from simulator.hardware.specs import load_hardware

    rnd = np.random.default_rng(5)
    cost = RooflineCostModel(load_model_config("llama-3.1-8b"), load_hardware("h100"))
    reqs = []
    for i in range(24):
        n = int(rnd.integers(50, 300))
        prompt = list(range(i * 1000, i * 1000 + n))
        reqs.append(Req(str(i), n, (lambda p=prompt: p), SamplingParams(max_new_tokens=int(rnd.integers(100, 400))), 0.0, index=i))
    driver = SimDriver(cost, fast_forward=fast_forward)
    loop = CountingLoop(sched, ClosedLoopArrivals(iter(reqs), 4), driver.clock, overlap)
    driver.run(loop)
    sched.check_invariants()
    return loop


def assert_same_run(ff_loop, ff_sched, step_loop, step_sched) -> None:
    """Every step row, every request's token and finish times, and the KV pool's free list and
    cache as stepping left them."""
    for name, col in step_loop.steps.cols.items():
        assert list(ff_loop.steps.cols[name]) == list(col), name
    assert [list(r.token_times) for r in ff_sched.done] == [list(r.token_times) for r in step_sched.done]
    assert [r.finish_time for r in ff_sched.done] == [r.finish_time for r in step_sched.done]
    from scheduler.vllm.scheduler import VllmScheduler

    if isinstance(step_sched, VllmScheduler):
        # The same free queue, in eviction order, and the same blocks cached under the same hashes.
        ff_sched.kv.flush_cache(), step_sched.kv.flush_cache()
        ff_pool, step_pool = ff_sched.kv.pool, step_sched.kv.pool
        assert list(ff_pool.free_queue.order()) == list(step_pool.free_queue.order())
        assert ff_pool.is_cached == step_pool.is_cached and ff_pool.cached == step_pool.cached
        return
    assert ff_sched.allocator.free_pages == step_sched.allocator.free_pages
    # The same cache walks (each match and insert stamps the LRU clock), so the same eviction order
    # from here on: a prefill branch that looked at the queue when stepping's did not shows here.
    assert ff_sched.tree_cache._clock == step_sched.tree_cache._clock
