"""RadixCache: the prefix cache of KV slots, as SGLang's radix_cache.py.

A radix tree over token ids. Each node holds a run of tokens (key) and their KV
slots (value). Matching is at page granularity. A node with lock_ref > 0 is in
use by a running request and is never evicted; unlocked leaves are evicted in
LRU order. The tree owns one reference to every KV slot it holds: the sum of
evictable_size and protected_size is exactly the number of slots in the tree.
"""

from __future__ import annotations

import heapq
from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from scheduler.core.ids import as_ids, common_prefix_len, ids
from scheduler.memory.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator

if TYPE_CHECKING:
    from scheduler.core.req import Req


@dataclass(eq=False, slots=True)
class TreeNode:
    key: array = field(default_factory=ids)  # token ids
    value: array = field(default_factory=ids)  # their KV slots
    parent: TreeNode | None = None
    children: dict = field(default_factory=dict)
    lock_ref: int = 0
    last_access: float = 0.0  # a logical clock (SGLang's stamps), so eviction order is deterministic


def finished_kv_len(req: Req) -> int:
    """Tokens of a finished request whose KV is (or, in flight, will be) written: the prompt and
    its outputs but the last, or with overlap after an EOS stop, the last too (the step
    scheduled before the stop was seen computes it; SGLang's owned_kv_len)."""
    return min(req.seq_len, req.input_len + len(req.output_ids))


class RadixCache:
    disabled = False

    def __init__(self, req_to_token_pool: ReqToTokenPool, allocator: TokenToKVPoolAllocator, page_size: int = 1) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.allocator = allocator
        self.page_size = page_size
        self.reset()

    def reset(self) -> None:
        self.root = TreeNode()
        self.root.lock_ref = 1  # the root is never evicted
        # Unlocked leaves, kept up to date so that eviction need not walk the tree.
        self.evictable_leaves: dict[TreeNode, None] = {}
        # Their LRU order, kept across evictions: (last_access when pushed, push count, node).
        # An entry may be stale (the node was locked, got a child, was evicted, or was touched
        # since); evict() skips or re-pushes those as it meets them.
        self._lru_heap: list[tuple[float, int, TreeNode]] = []
        self._pushes = 0
        self.evictable_size_ = 0
        self.protected_size_ = 0
        self._clock = 0

    # -- keys -------------------------------------------------------------
    def _child_key(self, key: array, pos: int = 0):
        return key[pos] if self.page_size == 1 else tuple(key[pos : pos + self.page_size])

    def _match_len(self, node_key: array, key: array, pos: int, end: int | None = None) -> int:
        """Tokens of node_key that match key from pos (up to end), page aligned."""
        stop = pos + len(node_key)
        if end is not None and end < stop:
            stop = end
        seg = key[pos:stop]
        if seg == node_key:  # the common case: the whole node matches
            return len(seg)
        n = common_prefix_len(node_key, seg)
        return n - n % self.page_size

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    # -- match / insert ---------------------------------------------------
    def match_prefix(self, key: Sequence[int], max_len: int | None = None) -> tuple[array, TreeNode]:
        """KV slots of the longest cached prefix of key[:max_len] (page aligned), and its last node."""
        value = ids()
        return value, self._walk_and_stamp(as_ids(key), max_len, value)[0]

    def touch_prefix(self, key: Sequence[int]) -> None:
        """Refresh the LRU stamps of key's cached prefix: a match (its splits included) whose
        slots are not gathered."""
        self._walk_and_stamp(as_ids(key), None, None)

    def match_len_below(self, key: array, known: TreeNode, known_len: int) -> int:
        """len(match_prefix(key)[0]), with match_prefix's splits and stamps, where known is a
        node whose path from the root spells key[:known_len] (a request's locked last_node):
        the walk starts there instead of comparing that path's tokens again."""
        return self._walk_and_stamp(key, None, None, known, known_len)[1]

    def match_len_after(self, known: TreeNode | None, tail: array) -> int:
        """match_len_below for the key that is known's path followed by tail: how many tokens of
        tail the cache holds below known (with match_prefix's splits and stamps). Only the tail
        is handed over: a request's whole prompt need not be copied to cache its next block."""
        return self._walk_and_stamp(tail, None, None, known, 0)[1]

    def insert_after(self, known: TreeNode | None, known_len: int, tail: array, tail_value: array) -> TreeNode:
        """_insert(key, value, known) for the key that is known's path (known_len tokens)
        followed by tail, whose slots are tail_value: known's path is stamped and the tail
        inserted below it. Returns the node that ends at the key's end."""
        node, pos = self._start_insert(known, known_len + len(tail))
        assert pos == known_len, "known's path is not the key's start"
        return self._insert_from(node, tail, tail_value, 0)[1]

    def locked_prefix_len(self, key: array) -> int:
        """Tokens of key's cached prefix that running requests hold locked (no split, no
        stamp: a look, not a match). Locks reach from a node up to the root, so they are the
        prefix's first tokens."""
        return self._look(key, locked_only=True)

    def cached_prefix_len(self, key: array) -> int:
        """Tokens of key's cached prefix (page aligned), by a look: no split, no stamp."""
        return self._look(key, locked_only=False)

    def _look(self, key: array, locked_only: bool) -> int:
        node, pos = self.root, 0
        end = len(key) - len(key) % self.page_size
        while pos < end:
            child = node.children.get(self._child_key(key, pos))
            if child is None or (locked_only and child.lock_ref == 0):
                break
            n = self._match_len(child.key, key, pos, end)
            pos += n
            if n < len(child.key):
                break
            node = child
        return pos

    def _walk_and_stamp(
        self, key: array, max_len: int | None, value: array | None, node: TreeNode | None = None, pos: int = 0
    ) -> tuple[TreeNode, int]:
        """The match: walk key[:max_len]'s cached prefix (splitting the node it ends inside),
        append its slots to value unless None, stamp the path; return the last node and the
        match's length. The walk starts at the root, or at node whose path spells key[:pos]."""
        ps = self.page_size
        end = len(key) if max_len is None else min(max_len, len(key))
        end -= end % ps
        if node is None:
            node = self.root
        while pos < end:
            child = node.children.get(self._child_key(key, pos))
            if child is None:
                break
            n = self._match_len(child.key, key, pos, end)
            if n < len(child.key):
                if n > 0:
                    child = self._split_node(child, n)
                    if value is not None:
                        value.extend(child.value)
                    node, pos = child, pos + n
                break
            if value is not None:
                value.extend(child.value)
            node, pos = child, pos + n
        # SGLang's stamps: the last matched node now, each ancestor a hair earlier (so a
        # deeper node is the more recent), nodes beside the path untouched.
        t = float(self._tick())
        stamped = node
        while stamped is not None:
            stamped.last_access = t
            t -= 1e-5
            stamped = stamped.parent
        return node, pos

    def insert(self, key: Sequence[int], value: Sequence[int]) -> int:
        """Insert key -> value; return how many leading tokens were already cached.

        The caller frees its own slots for that already-cached part (the tree keeps its own).
        """
        return self._insert(as_ids(key), as_ids(value))[0]

    def _insert(self, key: array, value: array, known: TreeNode | None = None) -> tuple[int, TreeNode]:
        """insert(), also returning the node that ends at the end of key.

        known: a node whose path from the root spells a prefix of key (a request's locked
        last_node): that path is walked, and stamped, without comparing tokens."""
        assert len(key) % self.page_size == 0 and len(key) == len(value)
        node, pos = self._start_insert(known, len(key))
        return self._insert_from(node, key, value, pos)

    def _start_insert(self, known: TreeNode | None, key_len: int) -> tuple[TreeNode, int]:
        """The start of an insert of key_len tokens: stamp the root, and known's path if it is
        not longer than the key; return where the walk goes on (a node and its end)."""
        # SGLang's stamps: every node walked gets a fresh tick, deeper ones later; a split
        # stamps its upper part, then its lower part; a new leaf is the latest.
        self.root.last_access = self._tick()
        if known is not None and known is not self.root:
            path = self._path_to(known)
            known_len = sum(len(n.key) for n in path)
            if known_len <= key_len:
                for n in path:  # each matches whole, as the walk would find
                    n.last_access = self._tick()
                return known, known_len
        return self.root, 0

    def _insert_from(self, node: TreeNode, key: array, value: array, pos: int) -> tuple[int, TreeNode]:
        """The insert walk from node, where key[pos:] starts below it. value[:len(key)] are
        the key's slots (value may go on: a request's row)."""
        while pos < len(key):
            child = node.children.get(self._child_key(key, pos))
            if child is None:
                break
            child.last_access = self._tick()
            n = self._match_len(child.key, key, pos)
            if n < len(child.key):
                child = self._split_node(child, n)
            node, pos = child, pos + n
            if n == 0:  # cannot happen: children are keyed by their first page
                break
        if pos < len(key):
            leaf = TreeNode(key=key[pos:], value=value[pos : len(key)], parent=node, last_access=self._tick())
            node.children[self._child_key(leaf.key)] = leaf
            self.evictable_leaves.pop(node, None)  # no longer a leaf
            self._add_evictable(leaf)
            self.evictable_size_ += len(leaf.value)
            node = leaf
        return pos, node

    def _split_node(self, child: TreeNode, split_len: int) -> TreeNode:
        """Split child after split_len tokens; return the new upper node."""
        parent = child.parent
        assert parent is not None
        upper = TreeNode(
            key=child.key[:split_len],
            value=child.value[:split_len],
            parent=parent,
            lock_ref=child.lock_ref,
            last_access=self._tick(),
        )
        child.last_access = self._tick()
        child.key = child.key[split_len:]
        child.value = child.value[split_len:]
        child.parent = upper
        upper.children[self._child_key(child.key)] = child
        parent.children[self._child_key(upper.key)] = upper
        return upper

    # -- locks ------------------------------------------------------------
    def inc_lock_ref(self, node: TreeNode | None) -> None:
        if node is not None and node.lock_ref == 0:
            self.evictable_leaves.pop(node, None)
        while node is not None and node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size_ -= len(node.value)
                self.protected_size_ += len(node.value)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode | None) -> None:
        if node is not None and node.lock_ref == 1 and not node.children and node is not self.root:
            self._add_evictable(node)
        while node is not None and node is not self.root:
            if node.lock_ref == 1:
                self.evictable_size_ += len(node.value)
                self.protected_size_ -= len(node.value)
            assert node.lock_ref > 0, "unlocking an unlocked node"
            node.lock_ref -= 1
            node = node.parent

    def evictable_size(self) -> int:
        return self.evictable_size_

    def protected_size(self) -> int:
        return self.protected_size_

    # -- eviction ---------------------------------------------------------
    def _add_evictable(self, node: TreeNode) -> None:
        self.evictable_leaves[node] = None
        heap = self._lru_heap
        if len(heap) > 2 * len(self.evictable_leaves) + 1024:
            # Mostly stale entries: start over from the leaves themselves.
            heap[:] = [(n.last_access, i, n) for i, n in enumerate(self.evictable_leaves)]
            heapq.heapify(heap)
            self._pushes = len(heap)
        else:
            self._pushes += 1
            heapq.heappush(heap, (node.last_access, self._pushes, node))

    def evict(self, num_tokens: int) -> int:
        """Free at least num_tokens slots from unlocked leaves, least recently used first.

        As SGLang's evict, which heapifies every unlocked leaf by last_access on each call; here
        the heap lives on. Stamps are unique and only grow, so every leaf has an entry no later
        than its stamp, and the first entry popped whose stamp is still its node's is the
        least recently used leaf."""
        if num_tokens <= 0 or self.evictable_size_ == 0:
            return 0
        heap, leaves = self._lru_heap, self.evictable_leaves
        evicted = 0
        while evicted < num_tokens and leaves:
            stamp, _, node = heapq.heappop(heap)
            if node not in leaves:
                continue  # locked, grown a child, or evicted since it was pushed
            if node.last_access != stamp:
                self._pushes += 1
                heapq.heappush(heap, (node.last_access, self._pushes, node))  # touched since
                continue
            self.allocator.free(node.value)
            evicted += len(node.value)
            self.evictable_size_ -= len(node.value)
            del leaves[node]
            parent = node.parent
            assert parent is not None
            del parent.children[self._child_key(node.key)]
            if not parent.children and parent.lock_ref == 0 and parent is not self.root:
                self._add_evictable(parent)
        return evicted

    def _iter_nodes(self):
        stack = [self.root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def total_size(self) -> int:
        return sum(len(n.value) for n in self._iter_nodes())

    def all_values(self) -> array:
        """Every slot the tree holds (an int64 array: a long run's cache holds a million)."""
        out = ids()
        for n in self._iter_nodes():
            out.extend(n.value)
        return out

    # -- requests ---------------------------------------------------------
    def cache_finished_req(self, req: Req) -> None:
        """Put a finished (or retracted) request's tokens in the tree and release its slot."""
        kv_len = finished_kv_len(req)
        # Read here and dropped below (the tree copies what it keeps): the row itself.
        row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
        aligned = kv_len - kv_len % self.page_size
        if aligned < kv_len:
            self.allocator.free(row[aligned:kv_len])
        # The insert of the tokens [0, aligned): past the request's locked node, only the
        # tokens after its path are made and walked.
        node, start = self._start_insert(req.last_node, aligned)
        tail, end_node = self._insert_from(node, self._token_range(req, start, aligned), row[start:aligned], 0)
        already = start + tail
        # Slots of the part another request cached first are duplicates: free ours.
        self.allocator.free(row[len(req.prefix_indices) : already])
        self._split_at_prompt(req, aligned, end_node)
        self.req_to_token_pool.free(req.req_pool_idx)
        self.dec_lock_ref(req.last_node)

    @staticmethod
    def _token_range(req: Req, start: int, end: int) -> array:
        """Tokens [start, end) of the request's prompt followed by its outputs."""
        prompt = req.origin_input_ids
        if end <= len(prompt):
            return prompt[start:end]
        # (ids() of the list slice, then one concatenation: extending an array from a list
        # grows it item by item)
        outputs = ids(req.output_ids[max(start - len(prompt), 0) : end - len(prompt)])
        return prompt[start:] + outputs if start < len(prompt) else outputs

    def _split_at_prompt(self, req: Req, inserted_len: int, end_node: TreeNode) -> None:
        """Insert the prompt again so that its node ends where the outputs begin: eviction
        can then drop a request's output KV and keep its prompt (SGLang's checkpoint).

        The tokens were just inserted, ending at end_node, and the prompt is their prefix: so
        that insert walks end_node's path without comparing tokens. It stamps as _insert does
        (the root, then each node walked) and splits the node the prompt ends inside."""
        n = req.input_len - req.input_len % self.page_size
        if not 0 < n < inserted_len - inserted_len % self.page_size:
            return
        self.root.last_access = self._tick()
        pos = 0
        for child in self._path_to(end_node):
            child.last_access = self._tick()
            if pos + len(child.key) > n:
                self._split_node(child, n - pos)
                return
            pos += len(child.key)
            if pos == n:
                return

    def _path_to(self, node: TreeNode) -> list[TreeNode]:
        """The nodes from the root (excluded) down to node."""
        path = []
        while node is not None and node is not self.root:
            path.append(node)
            node = node.parent
        path.reverse()
        return path

    def _path_values(self, node: TreeNode) -> array:
        """The slots from the root down to node (no LRU touch, unlike a match)."""
        out = ids()
        for n in self._path_to(node):
            out.extend(n.value)
        return out

    def cache_unfinished_req(self, req: Req) -> None:
        """Cache the tokens a request has prefilled so far; it keeps running on the tree's slots."""
        token_ids = req.fill_ids
        kv_len = len(token_ids)
        # The slots of token_ids are row[:kv_len]. Read here, never kept (the tree copies what
        # it keeps): the row itself, not a copy.
        row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
        aligned = kv_len - kv_len % self.page_size
        whole = aligned == kv_len
        node, walk_from = self._start_insert(req.last_node, aligned)
        already, new_last_node = self._insert_from(node, token_ids if whole else token_ids[:aligned], row, walk_from)
        num_prefix = len(req.prefix_indices)
        if already <= num_prefix:
            # The tree took our slots as they are: the prefix becomes row[:kv_len] (with an
            # unaligned tail, which stays the request's own). The row starts with the prefix,
            # so only the new part is appended to the request's own prefix array (as bytes:
            # one memcpy, no temporary array).
            req.prefix_indices.frombytes(memoryview(row)[num_prefix:kv_len].cast("B"))
        else:
            # Another request cached part of these tokens first: use its slots, free ours.
            # An unaligned tail of our earlier chunk shares its page with row[num_prefix],
            # so that page goes too: rewrite the row from the page start.
            start = num_prefix - num_prefix % self.page_size
            self.allocator.free(row[num_prefix:already])
            new_indices = self._path_values(new_last_node)
            assert len(new_indices) == aligned
            self.req_to_token_pool.write(req.req_pool_idx, start, new_indices[start:])  # (row[aligned:] unchanged)
            req.prefix_indices = new_indices if whole else new_indices + row[aligned:kv_len]
        self._split_at_prompt(req, aligned, new_last_node)
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(new_last_node)
        req.last_node = new_last_node
