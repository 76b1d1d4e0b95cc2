"""What the installed aiconfigurator-core holds: its GPU systems and their specs, and the backends and
versions of each with measured kernels (kernel_db.py queries one of them).

A system's spec is read from the package's YAML without importing the package (``--hardware
h100_sxm`` needs only that, and ``testbed replay`` must not start slower); listing the databases
imports its SDK, once a process.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import re
from pathlib import Path
from typing import Any

BACKENDS = ("sglang", "vllm", "trtllm")
EXTRA_HINT = "pip install -e '.[aiconfigurator]' (the aiconfigurator-core package)"


class KernelDatabaseError(ValueError):
    """A system, backend or version the database does not have, or the package not installed."""


def systems_dir() -> Path | None:
    """The installed package's systems/ folder (found without importing the package), or None."""
    try:
        spec = importlib.util.find_spec("aiconfigurator_core")
    except (ImportError, ValueError):  # a broken install, or imports of it blocked
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "systems"
    return path if path.is_dir() else None


@functools.cache
def system_names() -> tuple[str, ...]:
    """Every system with a spec (a YAML with a `gpu:` section), with or without kernel data."""
    root = systems_dir()
    if root is None:
        return ()
    names = []
    for path in sorted(root.glob("*.yaml")):
        text = path.read_text(encoding="utf-8")
        if "\ngpu:" in text or text.startswith("gpu:"):
            names.append(path.stem)
    return tuple(names)


@functools.cache
def system_spec(name: str) -> dict[str, Any]:
    """A system's YAML (gpu: memory, bandwidth, FLOPs; node: interconnect), as a dict."""
    root = systems_dir()
    if root is None:
        raise KernelDatabaseError(f"system {name!r}: AIConfigurator's database is not installed; {EXTRA_HINT}")
    if name not in system_names():
        raise KernelDatabaseError(f"unknown system {name!r}; the database has: {', '.join(system_names())}")
    import yaml  # a dependency of aiconfigurator-core

    return yaml.safe_load((root / f"{name}.yaml").read_text(encoding="utf-8"))


def require_package():
    try:
        import aiconfigurator_core
    except ImportError:
        raise KernelDatabaseError(f"--source aiconfigurator needs AIConfigurator's database: {EXTRA_HINT}") from None
    # Its loader logs a line for every fallback table it reads; our own errors say what matters.
    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    return aiconfigurator_core


def package_version() -> str:
    from importlib.metadata import version

    return version("aiconfigurator-core")


def available() -> dict[str, dict[str, list[str]]]:
    """system -> backend -> the versions it can be queried at (only systems with kernel data)."""
    return {s: {b: list(v) for b, v in backends.items()} for s, backends in supported_databases().items()}


@functools.lru_cache(maxsize=1)
def supported_databases() -> dict[str, dict[str, tuple[str, ...]]]:
    """The installed database's systems, backends and versions, read once a process: the SDK parses
    a few thousand YAML files to list them (0.75 s here), and the installed package does not change
    under a running process (testbed validate asked it once a point: 85% of its time)."""
    require_package()
    from aiconfigurator_core.sdk import perf_database

    return {s: {b: tuple(v) for b, v in backends.items() if v} for s, backends in sorted(perf_database.get_supported_databases().items())}


@functools.lru_cache(maxsize=None)
def latest_version(system: str, backend: str) -> str | None:
    """The version the database maintains as current for (system, backend), asked once a process
    (the SDK lists every database to answer: 0.75 s a call)."""
    from aiconfigurator_core.sdk import perf_database

    return perf_database.get_latest_database_version(system, backend)


def nearest_version(versions: list[str], wanted: str | None) -> str | None:
    """Of the database's versions, the one closest to `wanted` (a run's or point's engine release);
    None: the database's default."""
    if not wanted or not versions:
        return None

    def key(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", v)[:3])

    w = key(wanted)
    return min(versions, key=lambda v: (sum(abs(a - b) * 1000 ** (2 - i) for i, (a, b) in enumerate(zip(key(v), w))), v))
