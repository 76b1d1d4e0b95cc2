"""Progress on stderr: a bar in a terminal, a few lines in a file or a pipe.

A log or CI output keeps every redraw of a bar, thousands of them; there progress is a
line at a quarter, half, three quarters and the end (or, without a known total, one line
at the end), and a line every LINE_EVERY_S between them, so that slow work is seen moving.
"""

from __future__ import annotations

import sys
import time
from typing import Any

QUARTERS = (0.25, 0.5, 0.75, 1.0)
LINE_EVERY_S = 30.0


class LineProgress:
    """tqdm's update/set_postfix/close, printing a line at each quarter of the total."""

    def __init__(self, total: int | None, desc: str, unit: str) -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.n = 0
        self._postfix = ""
        self._printed = 0  # quarters printed
        self._next_line = time.monotonic() + LINE_EVERY_S

    def update(self, k: int = 1) -> None:
        self.n += k
        printed = self._printed
        if self.total:
            while self._printed < len(QUARTERS) and self.n >= QUARTERS[self._printed] * self.total:
                self._printed += 1
            if self._printed > printed or time.monotonic() >= self._next_line:
                self._print(f"{self.n:,}/{self.total:,} {self.unit} ({self.n / self.total:.0%})")

    def set_postfix(self, values: dict, refresh: bool = True) -> None:
        self._postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        self._postfix = text

    def close(self) -> None:
        if not self.total and self.n:
            self._print(f"{self.n:,} {self.unit}")
            self.n = 0

    def _print(self, text: str) -> None:
        self._next_line = time.monotonic() + LINE_EVERY_S
        print(f"{self.desc}: {text}" + (f"  {self._postfix}" if self._postfix else ""), file=sys.stderr, flush=True)


class _Off:
    n = 0
    total = None

    def update(self, k: int = 1) -> None:
        pass

    def set_postfix(self, values: dict, refresh: bool = True) -> None:
        pass

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(desc: str, unit: str, total: int | None = None, disable: bool = False) -> Any:
    """A tqdm bar on a terminal, LineProgress elsewhere, nothing with disable (-q)."""
    if disable:
        return _Off()
    if not sys.stderr.isatty():
        return LineProgress(total, desc, unit)
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True)
