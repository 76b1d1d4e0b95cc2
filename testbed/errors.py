"""Errors the CLI reports to the user as one line, without a traceback."""

from __future__ import annotations

from scheduler.loop.event_loop import DeadlockError
from scheduler.model_config import ModelConfigError
from simulator.hardware.specs import HardwareConfigError

EXIT_USAGE = 2  # bad input or options: the one-line message says which
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT


class TraceError(Exception):
    """A trace file that cannot be used, located as precisely as we can.

    str() reads like a compiler message so that editors can jump to it:
    ``traces/x.jsonl:12: field 'output_len': must be a non-negative integer, got -3``
    """

    def __init__(self, path: str, line: int | None, field: str | None, message: str) -> None:
        self.path = str(path)
        self.line = line  # 1-based line number in the file, None if not about one line
        self.field = field  # the offending key or column, None if not about one field
        self.message = message
        super().__init__(self.path, line, field, message)

    def __str__(self) -> str:
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        what = self.message if self.field is None else f"field {self.field!r}: {self.message}"
        return f"{where}: {what}"


class ConfigError(ValueError):
    """Options that cannot work together (or with this machine); the CLI prints it and exits 2."""


# Every error that is the user's input, not a bug: the CLI prints it as one line (exit 2) and
# the dashboard shows it as a message. The core's own (an unknown model, a bad hardware spec)
# are among them: the layers above the core name them through this tuple.
USER_ERRORS: tuple[type[Exception], ...] = (
    TraceError,
    ConfigError,
    ModelConfigError,
    HardwareConfigError,
    FileNotFoundError,
    IsADirectoryError,
    # Requests that SGLang's rules never admit (as SGLang, which would wait forever): e.g.
    # without a radix cache, an output truncated to the pool's limit fails the ignore-EOS check.
    DeadlockError,
)
