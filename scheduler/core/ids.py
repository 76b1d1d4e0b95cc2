"""Token ids and KV slot indices are kept as int64 arrays, not lists.

Slicing, concatenating and comparing an array is a memcpy/memcmp; a list of
ints touches every int object's reference count, which on long prompts (the
Mooncake trace averages 12k tokens) costs a cache miss per token. Arrays are
also what a tensor is made from without a copy (torch.frombuffer).
"""

from __future__ import annotations

from array import array
from typing import Iterable

import numpy as np

IDS_TYPECODE = "q"  # int64, like torch.int64


def ids(values: Iterable[int] = ()) -> array:
    """A new int64 array of values."""
    return array(IDS_TYPECODE, values)


def as_ids(values: Iterable[int]) -> array:
    """values as an int64 array, without a copy when it already is one."""
    if type(values) is array and values.typecode == IDS_TYPECODE:
        return values
    return array(IDS_TYPECODE, values)


def zeros(n: int) -> array:
    return array(IDS_TYPECODE, bytes(8 * n))


def extend_range(out: array, start: int, stop: int) -> None:
    """out.extend(range(start, stop)), by numpy past a few values (an array extends from a range
    an int object at a time: 37 ns each, 12 us for a decode stretch's 320 fresh slots)."""
    if stop - start <= 8:
        out.extend(range(start, stop))
    elif stop > start:
        out.frombytes(np.arange(start, stop, dtype=np.int64).tobytes())
