"""The event loop, written once, as a generator of waits ("one loop, two clocks").

The loop yields what it waits for; a driver answers:

- CpuWork(stage, num_reqs, num_tokens): the loop has just done this CPU work.
  The simulator charges its cost (a timeout); the real engine did it, so it
  only lets the clock run. The driver sends back nothing.
- Launch(plan): start this forward on the device: the CPU work of launching it
  happens (or is charged) in the driver. The driver sends back a handle.
- AwaitResult(handle): wait for that forward. The driver sends back a ForwardResult.
- WaitForArrival(until): nothing to do before `until` (the next arrival).
- FastForward(stretch, next_arrival, inflight, max_steps): only where the driver knows every
  sampled token in advance (the simulator: EventLoop.fast_forward_token) does the loop ask the
  scheduler for a decode stretch (scheduler/fast_forward/decode_stretch.py), steps that repeat the
  running batch's decode. The driver prices them as it would one by one, cuts them before
  the first step whose schedule start reaches next_arrival (and after max_steps steps), and
  sends back their times (StretchTimes), or None to step as usual. The real engine never
  sees this wait.

Requests come from an arrival source (scheduler/loop/arrivals.py): at their own arrival times
(open loop), or from N clients that each send the next request when their last one is done
(closed loop). There a finish sends a request at a time not known before it: a stretch then
ends with the step whose processing finishes a request (max_steps), so that the next step's
schedule receives the new arrival as stepping's does.

`clock()` reads the driver's clock (SimPy's env.now, or wall seconds since the
start), so the loop stamps every event in the time of whichever clock runs it.

Normal mode: schedule -> launch -> wait -> process. Overlap mode (SGLang's
zero-overhead scheduler): schedule and launch batch N+1, then process batch N
while N+1 runs. A request whose in-flight step reaches its length gets no further
step (the scheduler sees it in flight); a stop at EOS is seen one step late, and
the token its extra step produced is dropped.
"""

from __future__ import annotations

import itertools
from array import array
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Generator, Iterator

from scheduler.core.forward_plan import ForwardMode, ForwardPlan
from scheduler.core.protocol import Launched, SchedulerCore
from scheduler.core.req import Req
from scheduler.fast_forward.decode_stretch import DecodeStretch, steps_through_first_finish
from scheduler.loop.arrivals import ArrivalSource, OpenLoopArrivals
from scheduler.loop.recv_skipper import RecvSkipper
from scheduler.loop.step_log import StepLog, StepRow, StepTimes, StretchRows, StretchState


@dataclass(slots=True)
class CpuWork:
    stage: str  # "schedule" | "launch" | "process"
    num_reqs: int
    num_tokens: int


@dataclass(slots=True)
class Launch:
    plan: ForwardPlan


@dataclass(slots=True)
class AwaitResult:
    handle: Any


@dataclass(slots=True)
class WaitForArrival:
    until: float


@dataclass(slots=True)
class ForwardResult:
    next_token_ids: list[int]
    device_start: float  # in the driver's clock
    device_end: float


@dataclass(slots=True)
class FastForward:
    stretch: DecodeStretch
    next_arrival: float | None  # the stretch ends before a step that would receive it
    inflight: Any  # overlap: the handle of the launched batch the stretch's first step processes
    max_steps: int | None = None  # the stretch ends after this many steps at most (None: no bound)


@dataclass(slots=True)
class StretchTimes:
    """Times of a stretch's steps, as the driver would have stamped them one by one: step j's
    schedule, launch and forward, and the processing of the batch in flight at step j (step j
    itself; with overlap the one launched before it)."""

    num_steps: int
    schedule_start: array
    schedule_end: array  # = launch start
    launch_end: array
    device_start: array
    device_end: array
    process_start: array
    process_end: array
    last_handle: Any  # the handle of the last step's forward (in flight with overlap)
    inflight_device: tuple[float, float] | None  # overlap: device start and end of the batch in flight before


Wait = CpuWork | Launch | AwaitResult | WaitForArrival | FastForward


@dataclass(slots=True)
class _InFlight:
    launched: Launched
    handle: Any
    step: int
    schedule_start: float
    schedule_end: float
    launch_end: float


class DeadlockError(RuntimeError):
    pass


class EventLoop:
    def __init__(
        self,
        scheduler: SchedulerCore,
        requests: Iterator[Req] | ArrivalSource,  # an iterator: in arrival order, each at its arrival_time
        clock: Callable[[], float],
        overlap: bool,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.arrivals = requests if isinstance(requests, ArrivalSource) else OpenLoopArrivals(requests)
        self.clock = clock
        self.overlap = overlap
        self.progress = progress
        self.steps = StepLog()
        self.received: list[Req] = []  # every request handed to the scheduler, in arrival order
        self._done_reported = 0  # requests of scheduler.done reported to the arrival source
        self._num_steps = 0
        # The token every forward samples, where the driver knows it in advance (the simulator);
        # None: step one by one (the real engine, or --no-fast-forward).
        self.fast_forward_token: int | None = None
        self.num_stretches = 0  # decode stretches taken (each counts its steps in the step log)
        # SGLang's --scheduler-recv-interval (recv_skipper.py): new requests taken in only when
        # _may_receive, decided once a step from the batch the step before scheduled.
        interval = getattr(getattr(scheduler, "config", None), "scheduler_recv_interval", 1)
        self._recv_skipper = RecvSkipper(interval) if interval > 1 else None
        self._may_receive = True

    def forget_history(self) -> None:
        """Drop what a replay keeps for its run folder: the step log, the requests received, and
        the scheduler's finished requests already reported to the arrival source. A loop that runs
        for as long as a server does calls this now and then, or its memory grows with every
        step and request."""
        self._report_done()
        self.steps = StepLog()
        self.received.clear()
        done = self.scheduler.done
        # Those the arrival source has been told of (all, where it asks for none).
        del done[: self._done_reported if self.arrivals.sends_on_finish else len(done)]
        self._done_reported = 0

    # -- arrivals -------------------------------------------------------------------
    def recv_requests(self, now: float) -> None:
        arrivals, sched = self.arrivals, self.scheduler
        self._report_done()
        if not self._may_receive:
            return
        req = arrivals.pop_arrived(now)
        while req is not None:
            self.received.append(req)
            req.queued_time = now
            sched.add_request(req)
            self._report_done()  # (a request rejected at arrival is done at once)
            req = arrivals.pop_arrived(now)

    def next_arrival(self) -> float | None:
        self._report_done()
        return self.arrivals.next_arrival()

    def _report_done(self) -> None:
        """Tell the arrival source which requests are done since the last call, where it asks
        (closed loop: each sends the next request, at the request's finish time)."""
        arrivals = self.arrivals
        if arrivals.sends_on_finish:
            done = self.scheduler.done
            while self._done_reported < len(done) and arrivals.sends_on_finish:
                arrivals.done(done[self._done_reported])
                self._done_reported += 1

    # -- one step's pieces ----------------------------------------------------------
    def _schedule_and_launch(self) -> Generator[Wait, Any, _InFlight | None]:
        sched = self.scheduler
        t0 = self.clock()
        self.recv_requests(t0)
        batch = sched.get_next_batch_to_run()
        if self._recv_skipper is not None:
            self._may_receive = self._recv_skipper.should_receive(None if batch is None else batch.plan.mode)
        if batch is None:
            return None
        plan = batch.plan
        yield CpuWork("schedule", plan.batch_size, plan.num_tokens)
        t1 = self.clock()
        launched = sched.launch(batch, t1, self.overlap)
        handle = yield Launch(plan)  # the driver does (or charges) the CPU side of the launch
        t2 = self.clock()
        self._num_steps += 1
        return _InFlight(launched, handle, self._num_steps, t0, t1, t2)

    def _process(self, f: _InFlight) -> Generator[Wait, Any, None]:
        sched = self.scheduler
        result: ForwardResult = yield AwaitResult(f.handle)
        t3 = self.clock()
        sched.process_batch_result(f.launched, result.next_token_ids, t3)
        plan = f.launched.plan
        yield CpuWork("process", plan.batch_size, plan.num_tokens)
        t4 = self.clock()
        self.steps.append(
            StepRow(
                step=f.step,
                mode=plan.mode.value,
                batch_size=plan.batch_size,
                num_tokens=plan.num_tokens,
                prefix_tokens=plan.sum_prefix_len,
                cache_hit_tokens=f.launched.cache_hit_tokens,
                schedule_start=f.schedule_start,
                schedule_end=f.schedule_end,
                launch_start=f.schedule_end,
                launch_end=f.launch_end,
                device_start=result.device_start,
                device_end=result.device_end,
                process_start=t3,
                process_end=t4,
                kv_used_tokens=sched.kv_used_tokens(),
                kv_cached_tokens=sched.kv_cached_tokens(),
                num_running=sched.running_batch.batch_size(),
                num_waiting=len(sched.waiting_queue),
                num_retracted=f.launched.num_retracted,
                max_seq_len=plan.max_seq_len,
                attention_pairs=plan.attention_pairs,
            )
        )
        if self.progress is not None:
            self.progress(len(sched.done))

    def _fast_forward(self, prev: _InFlight | None) -> Generator[Wait, Any, _InFlight | None]:
        """Take the decode stretch that starts at the next step, if there is one. Returns the
        stretch's last step (in flight with overlap), or None when the loop steps as usual."""
        sched, token = self.scheduler, self.fast_forward_token
        self.recv_requests(self.clock())
        stretches = sched.decode_stretches
        stretch = None if stretches is None else stretches.decode_stretch(None if prev is None else prev.launched, token)
        if stretch is None:
            return None
        max_steps = None
        if self.arrivals.sends_on_finish:
            # A finish sends a request (closed loop), at a time known only when it happens: the
            # stretch ends with the step whose processing finishes the first request, and the next
            # step's schedule receives the request it sends.
            max_steps = steps_through_first_finish(stretch, prev is not None)
            if max_steps is not None and max_steps < 2:
                return None
        times: StretchTimes | None = yield FastForward(stretch, self.next_arrival(), None if prev is None else prev.handle, max_steps)
        if times is None:
            return None
        m = times.num_steps
        kv_before, cached_before = sched.kv_used_tokens(), sched.kv_cached_tokens()
        launched = stretches.advance_decode_stretch(stretch, m, times.schedule_end, times.process_start, token)
        if self._recv_skipper is not None:
            # Steps 2..m received nothing (none was due before them); the next may, after m decodes.
            self._recv_skipper.skip_decode_iterations(m - 1)
            self._may_receive = self._recv_skipper.should_receive(ForwardMode.DECODE)
        first_step = self._num_steps + 1
        self._num_steps += m
        self.num_stretches += 1
        mode = launched.plan.mode.value
        segments = stretch.taken(m)
        # Step j's row is written when its batch is processed: at step j, or with overlap at step
        # j + 1 (the first row is then the batch in flight before the stretch, its own record).
        shift = 0 if prev is None else 1
        # The KV, cache and running columns, kept as the stretch's changes (laid out in bulk when
        # the log is read).
        state = StretchState(
            m,
            shift,
            stretch.page_size,
            [(min(seg.stop, m) - seg.first_step, seg.batch_size, seg.pages_per_step) for seg in segments],
            kv_before,
            stretch.kv_changes,
            cached_before,
            stretch.cached_changes,
            sched.kv_cached_tokens(),
            stretch.running_changes,
        )
        assert state.kv_after_last_step() == sched.kv_used_tokens(), "a decode stretch lost count of the KV in use"
        waiting = len(sched.waiting_queue)
        t = StepTimes(
            times.schedule_start,
            times.schedule_end,
            times.schedule_end,
            times.launch_end,
            times.device_start,
            times.device_end,
            times.process_start,
            times.process_end,
        )
        if prev is not None:
            plan, (device_start, device_end) = prev.launched.plan, times.inflight_device
            kv_used, cached, running = state.after_first_step()
            self.steps.append(
                StepRow(
                    step=prev.step,
                    mode=plan.mode.value,
                    batch_size=plan.batch_size,
                    num_tokens=plan.num_tokens,
                    prefix_tokens=plan.sum_prefix_len,
                    cache_hit_tokens=prev.launched.cache_hit_tokens,
                    schedule_start=prev.schedule_start,
                    schedule_end=prev.schedule_end,
                    launch_start=prev.schedule_end,
                    launch_end=prev.launch_end,
                    device_start=device_start,
                    device_end=device_end,
                    process_start=times.process_start[0],
                    process_end=times.process_end[0],
                    kv_used_tokens=kv_used,
                    kv_cached_tokens=cached,
                    num_running=running,
                    num_waiting=waiting,
                    num_retracted=prev.launched.num_retracted,
                    max_seq_len=plan.max_seq_len,
                    attention_pairs=plan.attention_pairs,
                )
            )
        n = m - shift  # the rows written now: steps 0 .. n - 1 (their processing at step + shift)
        parts = [
            (min(seg.stop, n) - seg.first_step, seg.batch_size, seg.sum_prefix_len, seg.max_seq_len)
            for seg in segments
            if seg.first_step < n
        ]
        if shift:
            # Row j holds step j's schedule, launch and forward, and the processing of step j,
            # which comes at step j + 1 (process times are per step of the stretch).
            t = StepTimes(
                t.schedule_start[:n],
                t.schedule_end[:n],
                t.launch_start[:n],
                t.launch_end[:n],
                t.device_start[:n],
                t.device_end[:n],
                t.process_start[1:],
                t.process_end[1:],
            )
        self.steps.extend_stretch(StretchRows(first_step, n, mode, parts, t, state, waiting))
        if self.progress is not None:
            self.progress(len(sched.done))
        return _InFlight(
            launched, times.last_handle, self._num_steps, times.schedule_start[m - 1], times.schedule_end[m - 1], times.launch_end[m - 1]
        )

    def _idle(self) -> Generator[Wait, Any, bool]:
        """Nothing runs. Wait for the next arrival; False when the run is over."""
        sched = self.scheduler
        sched.on_idle()
        nxt = self.next_arrival()
        if nxt is None:
            if sched.is_idle():
                return False
            waiting = ", ".join(r.rid for r in itertools.islice(sched.waiting_queue, 5))
            raise DeadlockError(
                f"{len(sched.waiting_queue)} requests wait but none can ever be scheduled ({waiting}); "
                "the scheduler's admission rules refuse them on this KV pool (a larger --kv-tokens, or the radix cache on, admits them)"
            )
        yield WaitForArrival(nxt)
        return True

    # -- the loops --------------------------------------------------------------------
    def run(self) -> Generator[Wait, Any, None]:
        if self.overlap:
            yield from self._run_overlap()
        else:
            yield from self._run_normal()

    def _run_normal(self) -> Generator[Wait, Any, None]:
        while True:
            if self.fast_forward_token is not None and (yield from self._fast_forward(None)) is not None:
                continue
            inflight = yield from self._schedule_and_launch()
            if inflight is not None:
                yield from self._process(inflight)
            elif not (yield from self._idle()):
                return

    def _run_overlap(self) -> Generator[Wait, Any, None]:
        pending: deque[_InFlight] = deque()
        while True:
            if self.fast_forward_token is not None and len(pending) == 1:
                last = yield from self._fast_forward(pending[0])
                if last is not None:
                    pending[0] = last
                    continue
            inflight = yield from self._schedule_and_launch()
            if inflight is not None:
                pending.append(inflight)
            # Process the previous batch while the one just launched runs.
            if pending and (inflight is None or len(pending) > 1):
                yield from self._process(pending.popleft())
            elif inflight is None and not (yield from self._idle()):
                return
