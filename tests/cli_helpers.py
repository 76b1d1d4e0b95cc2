"""What every CLI test checks of a refused command: exit code 2 and one line, no traceback."""

from __future__ import annotations

import subprocess


def assert_clean_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """The one stderr line of a command that exited 2; each needle is in it."""
    assert proc.returncode == 2, f"exit {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{proc.stderr}"
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    return lines[0]
