"""Token ids and KV slot indices are kept as int64 arrays, not lists.

Slicing, concatenating and comparing an array is a memcpy/memcmp; a list of
ints touches every int object's reference count, which on long prompts (the
Mooncake trace averages 12k tokens) costs a cache miss per token. Arrays are
also what a tensor is made from without a copy (torch.frombuffer).
"""

from __future__ import annotations

from array import array
from typing import Iterable

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
