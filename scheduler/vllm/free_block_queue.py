"""vLLM's FreeKVCacheBlockQueue (vllm/v1/core/kv_cache_utils.py): the free KV blocks in
eviction order. Blocks are taken from the front, freed ones join the back, and a block a
request takes from the cache leaves from wherever it is.

vLLM keeps a doubly linked list of block objects. Here the queue is a log of entries with
removal marked, not done: `entries[head:tail]` lists blocks in order, and a block is in the
queue at entry i when `where[block] == i` (-1: not free). Taking from the front skips the
entries of blocks removed since; the log is compacted when it fills. Single blocks go through
plain array indexing, runs of blocks through numpy views of the same memory, so a prefill's
hundreds of blocks cost a few vector operations instead of a Python loop.
"""

from __future__ import annotations

from array import array

import numpy as np

from scheduler.core.ids import zeros


class FreeBlockQueue:
    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.where = array("q", range(num_blocks))  # entry of each free block, -1 if not free
        self._where_np = np.frombuffer(self.where, dtype=np.int64)
        self._set_log(np.arange(num_blocks, dtype=np.int64), capacity=2 * num_blocks + 16)
        self.count = num_blocks

    def _set_log(self, blocks: np.ndarray, capacity: int) -> None:
        """Start the log anew with these blocks (in order), each free at its new entry."""
        self.entries = zeros(capacity)
        self._entries_np = np.frombuffer(self.entries, dtype=np.int64)
        n = len(blocks)
        self._entries_np[:n] = blocks
        self._where_np[blocks] = np.arange(n, dtype=np.int64)
        self.head, self.tail = 0, n

    def __len__(self) -> int:
        return self.count

    def __contains__(self, block: int) -> bool:
        return self.where[block] >= 0

    def order(self) -> np.ndarray:
        """The free blocks, front (evicted first) to back."""
        e = self._entries_np[self.head : self.tail]
        return e[self._where_np[e] == np.arange(self.head, self.tail)]

    # -- taking from the front ----------------------------------------------------------
    def popleft(self) -> int:
        """The front block, taken."""
        entries, where, h = self.entries, self.where, self.head
        while where[entries[h]] != h:
            h += 1
        b = entries[h]
        where[b] = -1
        self.head = h + 1
        self.count -= 1
        return b

    def popleft_n(self, n: int) -> np.ndarray:
        """The first n blocks, taken, in order."""
        assert n <= self.count, f"{n} blocks wanted, {self.count} free"
        if n == 0:
            return np.empty(0, dtype=np.int64)
        entries, where, h = self._entries_np, self._where_np, self.head
        if h + n <= self.tail:
            out = entries[h : h + n]
            if (where.take(out) == np.arange(h, h + n)).all():  # (no removed entry among the first n: most takes)
                out = out.copy()
                where[out] = -1
                self.head = h + n
                self.count -= n
                return out
        parts, need = [], n
        while need:
            end = min(self.tail, h + max(2 * need, 64))
            chunk = entries[h:end]
            live = (where[chunk] == np.arange(h, end)).nonzero()[0]
            if len(live) >= need:
                live = live[:need]
                h += int(live[-1]) + 1
            else:
                h = end
            parts.append(chunk[live])
            need -= len(live)
        out = parts[0] if len(parts) == 1 else np.concatenate(parts)
        where[out] = -1
        self.head = h
        self.count -= n
        return out

    # -- joining the back; leaving from anywhere ---------------------------------------------
    def append(self, block: int) -> None:
        if self.tail == len(self.entries):
            self._compact(1)
        t = self.tail
        self.entries[t] = block
        self.where[block] = t
        self.tail = t + 1
        self.count += 1

    def append_n(self, blocks: np.ndarray) -> None:
        """These blocks (none free), in order, at the back."""
        k = len(blocks)
        if self.tail + k > len(self.entries):
            self._compact(k)
        t = self.tail
        self._entries_np[t : t + k] = blocks
        self._where_np[blocks] = np.arange(t, t + k, dtype=np.int64)
        self.tail = t + k
        self.count += k

    def remove(self, block: int) -> None:
        self.where[block] = -1
        self.count -= 1

    def remove_n(self, blocks: np.ndarray) -> None:
        """These blocks (all free) leave the queue."""
        self._where_np[blocks] = -1
        self.count -= len(blocks)

    def _compact(self, room: int) -> None:
        """Drop the removed entries, keeping room for `room` more."""
        live = self.order()
        self._set_log(live, capacity=max(2 * self.num_blocks, len(live) + room) + 16)
