"""What the whole suite shares: hypothesis profiles, the CPU threads of an xdist worker, and how
the work is split between the workers.

`make test` runs every test on two workers (pytest-xdist, `-n 2 --dist loadfile`): a file's
tests run on one worker, so a module fixture is built once, and the files that take the most
memory run one after another on one worker (BIG_MEMORY_FILES). `make test-fast` leaves out the
tests marked `slow` (about a second or more each, or waiting on a module fixture that is).
See hypothesis_profiles.py for the `ci` and `deep` profiles.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis_profiles import register

register()

# Under xdist, each worker (and each command it starts, which inherits the variable) takes its
# share of the cores for torch's OpenMP threads. Two workers of two threads each on two cores
# spin against each other: the engine tests ran twice as long. Set before torch is imported
# (the test modules import it; this file is read first). A value already set is kept.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
if _workers > 1 and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // _workers))

# Files whose tests take 1.5 to 2.5 GB at once: two of them side by side on two workers took 5 GB.
# Under --dist loadfile they are one unit of work, run one after another on one worker.
BIG_MEMORY = "big memory"
BIG_MEMORY_FILES = {
    "test_readme.py",  # real runs of the default CPU engine (a 1 GiB KV pool each) in subprocesses
    "test_cli_first_use.py",  # the same, once
    "test_run_estimate.py",  # the same, once
    "test_calibrate.py",  # calibrate's real engines (1 GiB KV pools) in the worker itself
    "test_dashboard_browser.py",  # Chromium and a dashboard server
    "test_sweep_ray.py",  # a Ray cluster and its workers
    "test_validate.py",  # validations whose worker processes replay at once
    "test_run_durability.py",  # replays and sweeps interrupted in subprocesses
}


def _unit(nodeid: str) -> str:
    """The unit of work a test belongs to under --dist loadfile: its file, or BIG_MEMORY."""
    path = nodeid.split("::", 1)[0]
    return BIG_MEMORY if Path(path).name in BIG_MEMORY_FILES else path


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # (optional: the suite runs without xdist too)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile, with the BIG_MEMORY_FILES as one unit, handed out in the order collected
    (pytest_collection_modifyitems below), not largest-first by number of tests. Not
    --dist=loadgroup with xdist_group marks: with pytest 9.2 it silently stops grouping
    (pytest-dev/pytest-xdist#1386)."""
    if config.getoption("dist", "no") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FilesInOrder(LoadScopeScheduling):
        def __init__(self, config, log=None):
            super().__init__(config, log)
            config.option.loadscopereorder = False

        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return FilesInOrder(config, log)


def _cost(item: pytest.Item) -> int:
    """What a test weighs in the order below, about in seconds: a slow test 1, a slow hypothesis
    property 30 (each of its examples is a run or two), any other test 0."""
    if item.get_closest_marker("slow") is None:
        return 0
    return 30 if getattr(getattr(item, "obj", None), "is_hypothesis_test", False) else 1


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The order the units of work are handed out in (the next one to the first worker with two
    tests or fewer left): BIG_MEMORY first (the longest unit), then the files with the most slow
    work (_cost), so that no long file starts last while the other worker idles. A file's tests
    stay together and in their order. The same order in one process: it does no harm there."""
    weight: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        unit, path = _unit(item.nodeid), item.nodeid.split("::", 1)[0]
        weight[unit] = weight.get(unit, 0) + _cost(item)
        first.setdefault(unit, i)
        first.setdefault(path, i)
    rank = {unit: r for r, unit in enumerate(sorted(weight, key=lambda u: (u != BIG_MEMORY, -weight[u], first[u])))}
    items.sort(key=lambda item: (rank[_unit(item.nodeid)], first[item.nodeid.split("::", 1)[0]]))
