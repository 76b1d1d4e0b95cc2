"""gc_paused: what a paused block leaves as cyclic garbage is collected when the next one begins,
so that many replays in one process (a study) do not pile up each run's radix tree."""

import gc
import weakref

import pytest

from scheduler.loop.gc_pause import gc_paused


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
