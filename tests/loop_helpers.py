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
