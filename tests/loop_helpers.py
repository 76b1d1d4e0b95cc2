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
