"""The engine of `testbed serve` in a process of its own, as vLLM runs its engine core apart from its
API server: the HTTP side writes a chunk per token per request (tens of microseconds each), and in
one process that work held the GIL the scheduler loop needed (tiny-llama at 40 requests: TPOT
2.8-3.6 ms at the client against 0.5 ms in --mode real).

The child builds the engine and scheduler as `replay --mode real` does and runs the loop on its
main thread, with the server's requests as arrivals (live_arrivals.py); a thread of its own reads
the parent's messages. After every step it sends the parent one message: each open request's new
tokens (and its end), and the gauges /metrics shows. Messages, parent to child: ("add", rid,
prompt, SamplingParams), ("cut", rid), ("close",); child to parent: ("ready", info), ("step",
updates, gauges), ("error", message), ("exit",).
"""

from __future__ import annotations

import multiprocessing
import threading
from dataclasses import dataclass
from typing import Any, Callable

from scheduler.core.sampling import SamplingParams

READY_TIMEOUT_S = 600.0  # building the engine: loading weights, warming up
FORGET_EVERY_STEPS = 4096  # the loop's step log and finished requests are dropped this often


@dataclass(frozen=True)
class EngineInfo:
    served_name: str
    context_len: int
    kv_tokens: int
    vocab_size: int
    model_folder: str | None


@dataclass
class Gauges:
    running: int = 0
    waiting: int = 0
    kv_used: int = 0


def _child(conn, opts, served_name: str | None) -> None:
    """The engine process: build, say ready, run the loop until closed and drained."""
    try:
        from scheduler.core.req import Req
        from scheduler.loop.event_loop import EventLoop
        from scheduler.model_config import load_model_config
        from testbed.backends import build_real
        from testbed.live.live_arrivals import LiveArrivals
        from testbed.options import check_options, resolved_options
        from testbed.replay import new_scheduler, scheduler_config

        check_options(opts)
        opts = resolved_options(opts)
        model = load_model_config(opts.model)
        backend, config = build_real(opts, model, lambda kv_tokens: scheduler_config(opts, model, kv_tokens))
        sched = new_scheduler(opts, config)
    except BaseException as e:
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    driver = backend.driver
    open_reqs: dict[str, list] = {}  # rid -> [Req, tokens handed]
    lock = threading.Lock()

    def updates() -> list[tuple[str, list[int], str | None]]:
        out = []
        with lock:
            items = list(open_reqs.items())
        for rid, entry in items:
            req, handed = entry
            n = len(req.output_ids)
            done = req.finished()
            if n > handed or done:
                out.append((rid, list(req.output_ids[handed:n]), req.finished_reason.value if done else None))
                entry[1] = n
            if done:
                with lock:
                    open_reqs.pop(rid, None)
        return out

    def gauges() -> tuple[int, int, int]:
        return sched.num_running(), len(sched.waiting_queue), sched.kv_used_tokens()

    def after_step(_done: int) -> None:
        conn.send(("step", updates(), gauges()))
        if len(loop.steps) >= FORGET_EVERY_STEPS:  # a server runs for hours: no run folder to keep them for
            loop.forget_history()

    def on_done(_req) -> None:
        got = updates()
        if got:
            conn.send(("step", got, gauges()))

    arrivals = LiveArrivals(driver.clock, on_done)

    def idle_wait(delay: float) -> None:
        conn.send(("step", [], gauges()))  # the gauges at rest (the last step's were taken before it ended)
        arrivals.wait(delay)

    driver.sleep = idle_wait
    loop = EventLoop(sched, arrivals, driver.clock, opts.overlap, after_step)

    def read() -> None:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                arrivals.close()
                return
            if msg[0] == "add":
                _, rid, prompt, params = msg
                req = Req(rid=rid, input_len=len(prompt), input_ids_fn=(lambda p=prompt: p), sampling_params=params, arrival_time=0.0)
                with lock:
                    open_reqs[rid] = [req, 0]
                arrivals.put(req)
            elif msg[0] == "cut":
                with lock:
                    entry = open_reqs.get(msg[1])
                if entry is not None and not entry[0].finished():
                    req = entry[0]  # ends at its next token; its KV is freed then
                    req.max_new_tokens = min(req.max_new_tokens, len(req.output_ids) + 1)
            elif msg[0] == "close":
                arrivals.close()
                return

    conn.send(
        (
            "ready",
            EngineInfo(
                model.name if served_name is None else served_name, config.context_len, backend.kv_tokens, model.vocab_size, model.folder
            ),
        )
    )
    threading.Thread(target=read, name="engine-inbox", daemon=True).start()
    try:
        driver.run(loop)
    except BaseException as e:
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("exit",))


class EngineClient:
    """The parent's side: starts the engine process, sends it requests, and hands each step's
    tokens to on_step(updates) on a thread of its own."""

    def __init__(self, opts, served_name: str | None, on_step: Callable[[list], None], on_error: Callable[[str], None]) -> None:
        ctx = multiprocessing.get_context("spawn")  # (no fork of a process with threads and torch)
        self._conn, child_conn = ctx.Pipe()
        self.process = ctx.Process(target=_child, args=(child_conn, opts, served_name), name="testbed-engine", daemon=True)
        self.process.start()
        child_conn.close()
        if not self._conn.poll(READY_TIMEOUT_S):
            self.process.kill()
            raise RuntimeError(f"the engine did not start in {READY_TIMEOUT_S:.0f} s")
        first = self._conn.recv()
        if first[0] == "error":
            self.process.join(10)
            from testbed.errors import ConfigError

            raise ConfigError(first[1])
        self.info: EngineInfo = first[1]
        self.gauges = Gauges()
        self.error: str | None = None
        self._send_lock = threading.Lock()
        self._on_step, self._on_error = on_step, on_error
        self.exited = threading.Event()
        self._reader = threading.Thread(target=self._read, name="engine-outbox", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                msg = ("error", "the engine process ended") if not self.exited.is_set() else ("exit",)
            if msg[0] == "step":
                self.gauges = Gauges(*msg[2])
                if msg[1]:
                    self._on_step(msg[1])
            elif msg[0] == "error":
                self.error = msg[1]
                self._on_error(msg[1])
                self.exited.set()
                return
            elif msg[0] == "exit":
                self.exited.set()
                return

    def _send(self, msg: Any) -> None:
        with self._send_lock:
            self._conn.send(msg)

    def add(self, rid: str, prompt: list[int], params: SamplingParams) -> None:
        self._send(("add", rid, prompt, params))

    def cut(self, rid: str) -> None:
        self._send(("cut", rid))

    def close(self, timeout: float | None = None) -> None:
        """No more requests: the engine finishes the ones it has, then exits."""
        try:
            self._send(("close",))
        except (OSError, BrokenPipeError):
            pass
        self.exited.wait(timeout)
        self.process.join(timeout)
