"""The prefix cache's map from a block hash to the cached blocks holding it (vLLM's
BlockHashToBlockMap), as an open-addressing hash table in numpy arrays.

vLLM keeps a dict: hash -> block, or -> {block: block, ...} in caching order when several blocks
hold the same hash; a lookup gets the first of them, and evicting a block pops it. The Mooncake
trace caches and evicts ~9M blocks: a dict operation and a Python int each cost seconds. Here
runs of hashes go in and get looked up a few vector operations at a time, and an eviction is
one store:

- Each time a block is cached it gets an entry: a stamp (a counter, so entries follow caching
  order) and the block id, in one int64. `entry_of[block]` is its entry while it is cached, -1
  once evicted. Its key goes in the table later (add), with that entry.
- A table of slots (key, entry), linear probing, one slot per key. A slot is live while its
  entry is its block's entry: an evicted block's slot goes stale where it is, until its key
  comes again (the slot is overwritten) or the table, a quarter full, is rebuilt from its
  live slots (not from the cached blocks: some wait for their keys, unhashed_blocks.py).
- When several cached blocks hold a key, its slot is marked SEVERAL and `several[key]` lists
  their entries in caching order (stale ones pruned as met): a lookup gets the first live one.
  That is rare (two requests computing the same block at once) and plain Python.
- One vector pass reads every key's next slot; a sparse table ends most probes at the first,
  and the few keys left after a pass or two, and the SEVERAL ones, go one at a time.
"""

from __future__ import annotations

import bisect
from array import array

import numpy as np

# Table slots per pool block: the table holds at most every block once (live slots) plus stale
# ones, and is rebuilt a quarter full, so a probe mostly ends at its key's first slot and a
# rebuild (~1 ms for the Mooncake replay's 28k blocks) comes after three pools' worth of new
# keys. Past LARGE_TABLE slots (64 MiB) a pool gets four slots a block, rebuilt half full.
SLOTS_PER_BLOCK = 16
MIN_SLOTS_PER_BLOCK = 4
LARGE_TABLE = 1 << 22
MIN_SLOTS = 64
# Keys still probing when this few are left go one at a time: a vector pass costs ~5 us
# whatever its length, a probe in Python ~0.5 us.
SCALAR_BELOW = 12
EMPTY = -1  # a slot no key was put in since the last rebuild
SEVERAL = -2  # a slot whose key several cached blocks hold: see `several`


class BlockHashIndex:
    def __init__(self, num_blocks: int, hash_of: np.ndarray) -> None:
        """hash_of: the pool's block hashes (written here as blocks are cached)."""
        self.hash_of = hash_of
        self.block_bits = max(num_blocks - 1, 1).bit_length()
        self.block_mask = (1 << self.block_bits) - 1
        # Each block's entry while cached, else -1 (sized to the mask, so that any entry's block
        # part indexes it): a plain array (one block at a time) with a numpy view.
        self.entry_of = array("q", bytes(8 << self.block_bits))
        self._entry_of = np.frombuffer(self.entry_of, dtype=np.int64)
        self._entry_of.fill(-1)
        self.next_stamp = 0
        size = MIN_SLOTS
        while size < max(MIN_SLOTS_PER_BLOCK * num_blocks, min(SLOTS_PER_BLOCK * num_blocks, LARGE_TABLE)):
            size *= 2
        self.mask = size - 1
        # (a rebuild leaves at most every block: a quarter of the table at most)
        self.max_fill = max(size // 4, min(size // 2, 2 * num_blocks))
        # Each slot's key and entry: plain arrays (one slot at a time from Python) with numpy
        # views (many at once).
        self.keys = array("q", bytes(8 * size))
        self._keys = np.frombuffer(self.keys, dtype=np.int64)
        self.entries = array("q", bytes(8 * size))
        self._entries = np.frombuffer(self.entries, dtype=np.int64)
        self._entries.fill(EMPTY)
        self.fill = 0  # slots holding a key, live or stale
        self.several: dict[int, list[int]] = {}  # key (as int64) -> entries in caching order

    def _is_live(self, entry: int) -> bool:
        return entry >= 0 and self.entry_of[entry & self.block_mask] == entry

    # -- changes ----------------------------------------------------------------------
    def cache(self, blocks: np.ndarray) -> None:
        """These blocks (none cached) are cached now, in this order: each gets its entry. Their
        keys go in the table later (add), once hashed: until then no lookup may come."""
        m = len(blocks)
        self._entry_of[blocks] = (np.arange(self.next_stamp, self.next_stamp + m, dtype=np.int64) << self.block_bits) | blocks
        self.next_stamp += m

    def cache_one(self, block: int) -> None:
        self.entry_of[block] = (self.next_stamp << self.block_bits) | block
        self.next_stamp += 1

    def uncache(self, blocks: np.ndarray) -> None:
        """These blocks leave the cache (their slots go stale)."""
        self._entry_of[blocks] = -1

    def uncache_one(self, block: int) -> None:
        self.entry_of[block] = -1

    def add(self, blocks: np.ndarray, hashes: np.ndarray, entries: np.ndarray) -> None:
        """These blocks' keys go in the table, each with the entry it got when cached (cache);
        those evicted since (their entry gone) are left out. Every other cached block's key is
        in the table already. The entries, not this order, say which of several blocks under one
        key was cached first."""
        live = (self._entry_of.take(blocks) == entries).nonzero()[0]
        if len(live) < len(blocks):
            blocks, hashes, entries = blocks.take(live), hashes.take(live), entries.take(live)
        if not len(blocks):
            return
        self.hash_of[blocks] = hashes
        keys = hashes.view(np.int64)
        if self.fill + len(blocks) > self.max_fill:
            keys, entries = self._rebuild(keys, entries)  # (these keys with the table's live ones)
        for i in self._place(keys, entries):
            self._place_one(int(keys[i]), int(entries[i]))

    def _probe(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each key's slot and whether it holds the key: the first slot of its probe that holds
        it or is empty. One vector pass reads every key's next slot; the few keys still probing
        after a pass or two go on one at a time."""
        tkeys, tents, mask = self._keys, self._entries, self.mask
        slots = keys & mask
        te = tents.take(slots)
        empty = te == EMPTY
        holds = tkeys.take(slots) == keys
        on = (~(empty | holds)).nonzero()[0]
        holds &= ~empty  # (an emptied slot keeps its key: a key there is not held)
        while len(on):
            if len(on) < SCALAR_BELOW:
                for i in on.tolist():
                    slots[i], holds[i] = self._probe_one(int(keys[i]), int(slots[i]) + 1)
                break
            p = (slots.take(on) + 1) & mask
            te = tents.take(p)
            empty = te == EMPTY
            hit = tkeys.take(p) == keys.take(on)
            slots[on] = p
            holds[on] = hit & ~empty
            on = on.compress(~(empty | hit))
        return slots, holds

    def _probe_one(self, key: int, p: int) -> tuple[int, bool]:
        """_probe of one key, from slot p of its probe on."""
        keys, ents, mask = self.keys, self.entries, self.mask
        while True:
            p &= mask
            if ents[p] == EMPTY:
                return p, False
            if keys[p] == key:
                return p, True
            p += 1

    def _place(self, keys: np.ndarray, entries: np.ndarray) -> list[int]:
        """Put what a vector pass can: a new key in the first empty slot of its probe, a key
        whose slot is stale (not SEVERAL) over it. Returns the indices left for _place_one: a key
        whose slot is live (a duplicate) or SEVERAL, and one that lost its empty slot to another
        key of the same pass. (Boolean masks are turned into indices with nonzero and taken
        with take: numpy's cheapest calls on a few hundred values.)"""
        tkeys, tents = self._keys, self._entries
        slots, holds = self._probe(keys)
        te = tents.take(slots)
        if np.count_nonzero(holds):
            # (an empty slot's entry, -1, reads as a live block's: holds excludes those)
            aside = holds & ((te == SEVERAL) | (self._entry_of.take(te & self.block_mask) == te))
            rest = aside.nonzero()[0].tolist()
            if rest:
                write = (~aside).nonzero()[0]
                slots, keys, entries, holds = slots.take(write), keys.take(write), entries.take(write), holds.take(write)
            else:
                write = None
        else:
            rest, write = [], None
        # Keys ending at one empty slot: one wins (the last written), the others go one at a time.
        tents[slots] = entries
        won = tents.take(slots) == entries
        if np.count_nonzero(won) == len(won):
            tkeys[slots] = keys
            self.fill += len(holds) - int(np.count_nonzero(holds))
            return rest
        tkeys[slots.compress(won)] = keys.compress(won)
        self.fill += int(np.count_nonzero(won & ~holds))
        lost = (~won).nonzero()[0]
        rest.extend((lost if write is None else write.take(lost)).tolist())
        return rest

    def _place_one(self, key: int, entry: int) -> None:
        """One key's slot, or one more cached block under a key that has one (a duplicate), its
        entry kept in caching order."""
        keys, ents, mask = self.keys, self.entries, self.mask
        p = key & mask
        while True:
            te = ents[p]
            if te == EMPTY:
                keys[p], ents[p] = key, entry
                self.fill += 1
                return
            if keys[p] == key:
                break
            p = (p + 1) & mask
        assert te != entry, "a cached block's hash went in twice"
        if te == SEVERAL:
            bisect.insort(self._live(self.several[key]), entry)
        elif self._is_live(te):
            self.several[key] = sorted((te, entry))
            ents[p] = SEVERAL
        else:
            ents[p] = entry

    def _live(self, entries: list[int]) -> list[int]:
        """A SEVERAL key's entries without the stale ones (pruned in place)."""
        entry_of, bm = self.entry_of, self.block_mask
        entries[:] = [e for e in entries if entry_of[e & bm] == e]
        return entries

    def _rebuild(self, keys: np.ndarray, entries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Empty the table, stale slots dropped; returns its live keys and entries (those of
        SEVERAL slots included) with these, to place again. (From the table's slots, not from
        the cached blocks: a cached block whose hash is not added yet has none in hash_of.)"""
        tents = self._entries
        live = (tents >= 0).nonzero()[0]
        te = tents.take(live)
        live = live.compress(self._entry_of.take(te & self.block_mask) == te)
        more_keys, more_entries = [self._keys.take(live), keys], [tents.take(live), entries]
        for key, listed in self.several.items():
            kept = self._live(listed)
            more_keys.append(np.full(len(kept), key, dtype=np.int64))
            more_entries.append(np.array(kept, dtype=np.int64))
        tents.fill(EMPTY)
        self.fill = 0
        self.several = {}
        return np.concatenate(more_keys), np.concatenate(more_entries)

    # -- reading ---------------------------------------------------------------------------
    def entries_of(self, blocks: np.ndarray) -> np.ndarray:
        return self._entry_of.take(blocks)

    def cached(self) -> np.ndarray:
        """Whether each block is cached (for checks)."""
        return self._entry_of[: len(self.hash_of)] >= 0

    def first_blocks(self, hashes: np.ndarray) -> np.ndarray:
        """For each hash, the block cached first among those cached under it now, or -1."""
        keys = hashes.view(np.int64)
        slots, holds = self._probe(keys)
        e = np.where(holds, self._entries.take(slots), -1)
        found = np.where(self._entry_of.take(e & self.block_mask) == e, e & self.block_mask, -1)
        found[e < 0] = -1
        several = (e == SEVERAL).nonzero()[0]
        for i in several.tolist():
            found[i] = self._first_block(int(keys[i]))
        return found

    def _first_block(self, key: int) -> int:
        keys, ents, mask = self.keys, self.entries, self.mask
        p = key & mask
        while True:
            te = ents[p]
            if te == EMPTY:
                return -1
            if keys[p] == key:
                break
            p = (p + 1) & mask
        if te == SEVERAL:
            entries = self._live(self.several[key])
            return entries[0] & self.block_mask if entries else -1
        return te & self.block_mask if self._is_live(te) else -1

    def holders(self) -> dict[int, tuple[int, ...]]:
        """Every hash cached now -> its blocks in caching order (from the blocks' own entries)."""
        live = (self._entry_of >= 0).nonzero()[0]
        live = live[np.lexsort((self._entry_of[live], self.hash_of[live]))]
        out: dict[int, tuple[int, ...]] = {}
        for b, h in zip(live.tolist(), self.hash_of[live].tolist()):
            out[h] = out.get(h, ()) + (b,)
        return out

    def errors(self) -> list[str]:
        """Where a lookup would not get the first cached block of its hash."""
        holders = self.holders()
        if not holders:
            return []
        hashes = np.fromiter(holders, dtype=np.uint64, count=len(holders))
        got = self.first_blocks(hashes).tolist()
        wrong = sum(1 for g, bs in zip(got, holders.values()) if g != bs[0])
        return [f"the prefix cache's index gives {wrong} hashes another block than their first cached"] if wrong else []
