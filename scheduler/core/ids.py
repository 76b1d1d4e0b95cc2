"""Token ids and KV slot indices are kept as int64 arrays, not lists.

Slicing, concatenating and comparing an array is a memcpy/memcmp; a list of
ints touches every int object's reference count, which on long prompts (the
Mooncake trace averages 12k tokens) costs a cache miss per token. Arrays are
also what a tensor is made from without a copy (torch.frombuffer).
"""

from __future__ import annotations

from array import array
from typing import Iterable, Sequence

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


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of a and b; C-speed slice compares, not a Python loop.
    Each compare copies its slices, so the matched run is widened fourfold a compare from a
    short start (two prompts that share a 512-token system prompt cost about that, not their
    length), then the first window that differs is bisected."""
    n = min(len(a), len(b))
    lo, step = 0, 64
    while True:
        hi = min(lo + step, n)
        if a[lo:hi] != b[lo:hi]:
            break
        if hi == n:
            return n
        lo, step = hi, 4 * step
    hi -= 1  # a[:lo] == b[:lo] and a[:hi+1] != b[:hi+1]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
