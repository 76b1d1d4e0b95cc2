"""RecvSkipper: SGLang's --scheduler-recv-interval, the scheduler taking in new requests only
every so many decode steps.

SGLang's event loop receives requests at the top of every iteration, unless a SchedulerRecvSkipper
says to skip (sglang/srt/managers/scheduler_recv_skipper.py): each iteration adds the weight of
the last batch's forward mode to a counter, 1 for a decode (and for an idle iteration), 1000 for
any other mode, and receives when the counter reaches the interval, then starts it again from 0.
So during decoding a request that arrives waits until the interval's decode steps have run, and
after a prefill the next iteration receives at once. Servers set it to spare the decode loop the
cost of polling (InferenceMAX's DeepSeek-R1 recipe on B200: 30 at 16 clients or more).

An idle scheduler receives at once: SGLang's idle loop spins through its interval's iterations
in microseconds, which the simulated clock does not see.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.core.forward_plan import ForwardMode

DECODE_WEIGHT = 1  # SGLANG_SCHEDULER_RECV_SKIPPER_WEIGHT_DECODE (and _NONE: an idle iteration)
OTHER_WEIGHT = 1000  # SGLANG_SCHEDULER_RECV_SKIPPER_WEIGHT_DEFAULT: after a prefill, receive at once


@dataclass
class RecvSkipper:
    interval: int
    counter: int = 0

    def should_receive(self, last_mode: ForwardMode | None) -> bool:
        """One iteration of the loop, after a batch of last_mode (None: nothing ran)."""
        if last_mode is None:
            self.counter = 0
            return True
        self.counter += DECODE_WEIGHT if last_mode is ForwardMode.DECODE else OTHER_WEIGHT
        if self.counter >= self.interval:
            self.counter = 0
            return True
        return False

    def skip_decode_iterations(self, n: int) -> None:
        """n iterations after decodes that received nothing (a stretch's steps after its first:
        no arrival is due before any of them): the counter where they leave it."""
        self.counter = (self.counter + n * DECODE_WEIGHT) % self.interval
