"""Ctrl-C and SIGTERM: one meaning (stop, and leave the run folder readable), and no tearing a write.

The CLI handles SIGTERM as SIGINT (a KeyboardInterrupt), so `kill` and a scheduler's stop
leave the same incomplete, readable folder as Ctrl-C. A replay runs in interrupt_once():
the first signal stops it, and the ones after (a second Ctrl-C while it writes what it has)
do not cut that short. A file write that must not be cut in half (a journal batch, the
final tables, sweep.parquet) runs in deferred_interrupts(): a signal that arrives meanwhile
is held and raised as KeyboardInterrupt once it is done.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def sigterm_as_sigint() -> None:
    """SIGTERM raises KeyboardInterrupt, as Ctrl-C does (the main thread only can set handlers)."""
    if _in_main_thread():
        signal.signal(signal.SIGTERM, signal.default_int_handler)


def ignore_stop_signals() -> None:
    """For a process about to exit, its work written and said: a late Ctrl-C would only kill it
    by the signal (exit status -2) during the interpreter's shutdown."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _install(handler) -> dict:
    return {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}


def _restore(previous: dict) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: set outside Python


@contextmanager
def interrupt_once() -> Iterator[None]:
    """The first SIGINT or SIGTERM in the block raises KeyboardInterrupt; the ones after it are
    ignored until the block is left (the cleanup the first one started runs to its end)."""
    if not _in_main_thread():
        yield
        return
    stopping = []

    def handler(signum, frame) -> None:
        if not stopping:
            stopping.append(signum)
            raise KeyboardInterrupt

    previous = _install(handler)
    try:
        yield
    finally:
        _restore(previous)


@contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Hold SIGINT and SIGTERM during the block; raise KeyboardInterrupt after it if one came.
    Elsewhere than in the main thread (a Streamlit page, a worker thread) signals never arrive:
    the block just runs."""
    if not _in_main_thread():
        yield
        return
    received: list[int] = []
    previous = _install(lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        _restore(previous)
    if received:
        raise KeyboardInterrupt
