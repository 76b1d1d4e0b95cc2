"""gc_paused: what a paused block leaves as cyclic garbage is collected when the next one begins,
so that many replays in one process (a study) do not pile up each run's radix tree."""

import gc
import weakref

import pytest

from scheduler.loop import gc_pause
from scheduler.loop.gc_pause import freeze_held, gc_paused


class Node:
    pass


def cyclic_garbage() -> weakref.ref:
    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle: reference counting alone never frees it
    return weakref.ref(a)


@pytest.mark.slow
def test_a_blocks_cyclic_garbage_is_collected_when_the_next_block_begins():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        ref = cyclic_garbage()
    assert gc.isenabled()
    assert ref() is not None, "the block's objects went to the oldest generation, uncollected"
    with gc_paused(collect_earlier=False):  # (a run's tables: its objects are in use)
        assert ref() is not None
    with gc_paused():
        assert ref() is None, "the next block did not collect the garbage of the one before"


def test_nested_blocks_leave_the_collector_off_until_the_outer_one_ends():
    with gc_paused():
        with gc_paused():
            pass
        assert not gc.isenabled()
    assert gc.isenabled()


@pytest.fixture
def held_frozen():
    yield
    gc_pause._held_frozen = False
    gc.unfreeze()


def test_what_the_process_holds_stays_frozen_and_a_blocks_garbage_is_still_collected(held_frozen):
    """validate's workers: what they hold (profiles, points) leaves every later collection, while
    each replay's cyclic garbage is collected as before."""
    held = [Node() for _ in range(100)]
    freeze_held()
    frozen = gc.get_freeze_count()
    assert frozen >= len(held)
    with gc_paused():
        ref = cyclic_garbage()
    assert gc.get_freeze_count() == frozen, "the block's end moved the held objects back to a walked generation"
    assert ref() is not None
    freeze_held()  # (validate's next point: the last replay's garbage collected first, not frozen)
    assert ref() is None
