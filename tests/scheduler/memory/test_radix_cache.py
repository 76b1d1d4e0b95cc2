"""RadixCache and ChunkCache: the prefix cache of KV slots.

What a user of the cache relies on:
- match_prefix returns the longest cached page-aligned prefix, and exactly the
  slots that were inserted for it (node splits change nothing of that);
- insert returns how many leading tokens were already cached; the caller frees
  its own duplicates, and then every KV slot is either free or held by the tree,
  exactly once;
- locked nodes are never evicted; unlocked leaves go in LRU order;
- evictable_size + protected_size == total_size == len(all_values());
- cache_finished_req / cache_unfinished_req, used as the scheduler uses them,
  leak nothing, free the request slot, keep one copy of shared tokens, and leave
  a running request's req_to_token row pointing at live slots only.

The tree is checked against a plain model: a dict from every cached
page-aligned token prefix (a tuple) to the KV slots of its last page.
"""

from __future__ import annotations

import copy
import random
from array import array
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from scheduler.core.ids import common_prefix_len
from scheduler.core.req import Req
from scheduler.core.sampling import SamplingParams
from scheduler.memory.chunk_cache import ChunkCache
from scheduler.memory.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator
from scheduler.memory.radix_cache import RadixCache

# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def make_cache(num_pages: int, ps: int, num_reqs: int = 8):
    pool = ReqToTokenPool(num_reqs)
    alloc = TokenToKVPoolAllocator(num_pages * ps, ps)
    return pool, alloc, RadixCache(pool, alloc, ps)


def match(cache, key):
    """match_prefix with its slots as a plain list (whatever sequence type the cache uses)."""
    slots, node = cache.match_prefix(key)
    return list(slots), node


def cat(a, b):
    """a + b in a's sequence type (token ids may be lists or int arrays)."""
    if isinstance(a, array):
        return a + array(a.typecode, b)
    return list(a) + list(b)


def free_page_list(alloc: TokenToKVPoolAllocator) -> list[int]:
    """Every free page (repeats kept): the freed list, plus never-used pages if the allocator keeps them apart."""
    fresh_from = getattr(alloc, "next_fresh_page", alloc.num_pages)
    return list(alloc.free_pages) + list(range(fresh_from, alloc.num_pages))


def free_slot_list(alloc: TokenToKVPoolAllocator) -> list[int]:
    ps = alloc.page_size
    out: list[int] = []
    for p in free_page_list(alloc):
        out.extend(range(p * ps, p * ps + ps))
    return out


def tree_model(cache: RadixCache) -> dict[tuple, tuple]:
    """Every cached page-aligned prefix -> the slots of its last page, read from the tree itself."""
    ps = cache.page_size
    out: dict[tuple, tuple] = {}
    stack = [(cache.root, ())]
    while stack:
        node, path = stack.pop()
        for j in range(0, len(node.key), ps):
            out[path + tuple(node.key[: j + ps])] = tuple(node.value[j : j + ps])
        path = path + tuple(node.key)
        stack.extend((c, path) for c in node.children.values())
    return out


def node_path(cache: RadixCache, node) -> tuple:
    parts = []
    while node is not None and node is not cache.root:
        parts.append(tuple(node.key))
        node = node.parent
    assert node is cache.root, "node is detached from the root"
    out: tuple = ()
    for p in reversed(parts):
        out += p
    return out


def tree_snapshot(cache: RadixCache) -> tuple:
    """Everything a walk may change: every node in children order, with its tokens, slots,
    stamp and lock count, and the cache's clock."""
    out = []
    stack = [(cache.root, 0)]
    while stack:
        node, depth = stack.pop()
        out.append((depth, tuple(node.key), tuple(node.value), node.last_access, node.lock_ref))
        stack.extend((c, depth + 1) for c in reversed(list(node.children.values())))
    return tuple(out), cache._clock


def iter_nodes(cache: RadixCache):
    stack = [cache.root]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(n.children.values())


def check_structure(cache: RadixCache) -> None:
    ps = cache.page_size
    assert cache.root.lock_ref >= 1
    for node in iter_nodes(cache):
        for ck, child in node.children.items():
            assert child.parent is node, "child's parent pointer is wrong"
            assert len(child.key) == len(child.value) > 0, "empty or ragged node"
            assert len(child.key) % ps == 0, f"node of {len(child.key)} tokens is not whole pages"
            first = child.key[0] if ps == 1 else tuple(child.key[:ps])
            assert ck == first, f"child keyed {ck!r} starts with {first!r}"
            assert child.lock_ref >= 0


def check_accounting(cache: RadixCache, alloc: TokenToKVPoolAllocator, held_outside: list[int] = ()) -> None:
    """evictable + protected == total == len(values); values, held and free slots partition the pool."""
    values = list(cache.all_values())
    assert cache.evictable_size() + cache.protected_size() == cache.total_size() == len(values)
    assert cache.evictable_size() >= 0 and cache.protected_size() >= 0
    assert len(set(values)) == len(values), "a KV slot is held twice by the tree"
    free = free_page_list(alloc)
    assert len(set(free)) == len(free), "a page is free twice"
    everything = sorted(values + list(held_outside) + free_slot_list(alloc))
    assert everything == list(range(alloc.size)), "KV slots leaked or double-owned"


def paged(tokens: str | list[int]) -> list[int]:
    return [ord(c) for c in tokens] if isinstance(tokens, str) else list(tokens)


def insert_fresh(cache: RadixCache, alloc: TokenToKVPoolAllocator, key: list[int]) -> tuple[int, list[int]]:
    """Insert key with freshly allocated slots, free the duplicates as the contract says."""
    value = alloc.alloc(len(key))
    assert value is not None
    already = cache.insert(key, value)
    alloc.free(value[:already])
    return already, list(value)


# ---------------------------------------------------------------------------
# common_prefix_len
# ---------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2), max_size=20), st.lists(st.integers(0, 2), max_size=20))
def test_common_prefix_len_matches_naive(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    assert common_prefix_len(a, b) == n


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 5000), st.integers(0, 300), st.integers(0, 300), st.booleans())
def test_common_prefix_len_of_long_arrays(shared, extra_a, extra_b, lists):
    """Prompts of thousands of tokens that share any prefix (the windows that widen the match
    fourfold, and the bisection of the one that differs)."""
    a = array("q", range(shared)) + array("q", range(-1, -1 - extra_a, -1))
    b = array("q", range(shared)) + array("q", range(-1000, -1000 - extra_b, -1))
    if lists:
        a, b = list(a), list(b)
    assert common_prefix_len(a, b) == shared == common_prefix_len(b, a)  # (their tails differ from the first)


# ---------------------------------------------------------------------------
# units
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("ps", [1, 2])
def test_node_split_keeps_slots(ps):
    pool, alloc, cache = make_cache(16, ps)
    abcd, abxy = paged("abcd"), paged("abxy")
    already, v1 = insert_fresh(cache, alloc, abcd)
    assert already == 0
    assert match(cache, abcd)[0] == v1
    already, v2 = insert_fresh(cache, alloc, abxy)
    assert already == 2
    assert match(cache, abcd)[0] == v1, "the split changed the slots of abcd"
    assert match(cache, abxy)[0] == v1[:2] + v2[2:]
    assert match(cache, paged("ab"))[0] == v1[:2]
    assert cache.total_size() == 6
    check_structure(cache)
    check_accounting(cache, alloc)


def test_split_inside_a_page_is_not_shared():
    """Page size 2: "abcd" and "abcx" share "ab" only; "c" alone is not a page."""
    pool, alloc, cache = make_cache(16, 2)
    _, v1 = insert_fresh(cache, alloc, paged("abcd"))
    slots, node = match(cache, paged("abcx"))
    assert slots == v1[:2]
    assert node_path(cache, node) == tuple(paged("ab"))
    already, v2 = insert_fresh(cache, alloc, paged("abcx"))
    assert already == 2
    assert match(cache, paged("abcx"))[0] == v1[:2] + v2[2:]
    assert match(cache, paged("abcd"))[0] == v1
    check_structure(cache)
    check_accounting(cache, alloc)


@pytest.mark.parametrize("ps", [1, 4])
def test_match_prefix_is_page_aligned(ps):
    pool, alloc, cache = make_cache(16, ps)
    key = list(range(3 * ps))
    _, v = insert_fresh(cache, alloc, key)
    for n in range(len(key) + 3):
        probe = key[:n] + [99] * max(0, n - len(key))
        slots, node = match(cache, probe)
        expect = min(n, len(key)) // ps * ps
        assert slots == v[:expect], f"probe of {n} tokens"
        assert node_path(cache, node) == tuple(key[:expect])
    check_structure(cache)
    check_accounting(cache, alloc)


def test_match_prefix_split_then_lock_protects_upper_part():
    pool, alloc, cache = make_cache(16, 1)
    _, v = insert_fresh(cache, alloc, paged("abcd"))
    slots, node = match(cache, paged("abzz"))
    assert slots == v[:2]
    cache.inc_lock_ref(node)
    assert cache.protected_size() == 2 and cache.evictable_size() == 2
    assert cache.evict(100) == 2
    assert match(cache, paged("abcd"))[0] == v[:2]
    check_accounting(cache, alloc)
    cache.dec_lock_ref(node)
    assert cache.evict(100) == 2
    assert cache.total_size() == 0 and alloc.available_size() == alloc.size


@pytest.mark.parametrize("ps", [1, 4])
def test_insert_of_cached_key_returns_its_length(ps):
    pool, alloc, cache = make_cache(16, ps)
    key = list(range(2 * ps))
    insert_fresh(cache, alloc, key)
    total = cache.total_size()
    already, _ = insert_fresh(cache, alloc, key)
    assert already == len(key)
    already, _ = insert_fresh(cache, alloc, key[:ps])
    assert already == ps
    assert cache.total_size() == total
    check_accounting(cache, alloc)


@pytest.mark.parametrize("ps", [1, 4])
def test_lru_evicts_least_recently_matched_leaf_first(ps):
    pool, alloc, cache = make_cache(16, ps)
    a = [1] * (2 * ps)
    b = [2] * (2 * ps)
    _, va = insert_fresh(cache, alloc, a)
    _, vb = insert_fresh(cache, alloc, b)
    match(cache, a)  # a is now the more recently used: b goes first
    assert cache.evict(1) == len(b)
    assert match(cache, b)[0] == []
    assert match(cache, a)[0] == va
    check_accounting(cache, alloc)

    # And the other way round.
    pool, alloc, cache = make_cache(16, ps)
    _, va = insert_fresh(cache, alloc, a)
    _, vb = insert_fresh(cache, alloc, b)
    match(cache, b)
    match(cache, a)
    match(cache, b)
    assert cache.evict(1) == len(a)
    assert match(cache, a)[0] == []
    assert match(cache, b)[0] == vb
    check_accounting(cache, alloc)


def test_lru_with_shared_parent():
    pool, alloc, cache = make_cache(16, 1)
    _, v1 = insert_fresh(cache, alloc, paged("abcd"))
    _, v2 = insert_fresh(cache, alloc, paged("abxy"))
    match(cache, paged("abxy"))  # "cd" is the least recently used leaf
    match(cache, paged("q"))  # a miss touches nothing that matters
    assert cache.evict(1) == 2
    assert match(cache, paged("abcd"))[0] == v1[:2]
    assert match(cache, paged("abxy"))[0] == v1[:2] + v2[2:]
    # Now "xy" then, once it is a leaf, "ab".
    assert cache.evict(2) == 2
    assert match(cache, paged("abxy"))[0] == v1[:2]
    assert cache.evict(1) == 2
    assert cache.total_size() == 0
    assert alloc.available_size() == alloc.size


def test_lru_evicts_many_leaves_in_order():
    pool, alloc, cache = make_cache(64, 1)
    keys = [[i, i] for i in range(8)]
    for k in keys:
        insert_fresh(cache, alloc, k)
    order = list(range(8))
    random.Random(0).shuffle(order)
    for i in order:
        match(cache, keys[i])
    for n, i in enumerate(order):
        assert cache.evict(1) == 2
        # The least recently matched one is gone, the later ones are all there
        # (read from the tree, so the check itself touches nothing).
        cached = tree_model(cache)
        assert tuple(keys[i]) not in cached
        for j in order[n + 1 :]:
            assert tuple(keys[j]) in cached


@pytest.mark.parametrize("ps", [1, 4])
def test_locked_leaf_survives_eviction(ps):
    pool, alloc, cache = make_cache(16, ps)
    a, b = [1] * (2 * ps), [2] * (3 * ps)
    _, va = insert_fresh(cache, alloc, a)
    _, vb = insert_fresh(cache, alloc, b)
    match(cache, b)  # a is older, but locked below
    slots, node = match(cache, a)
    cache.inc_lock_ref(node)
    assert cache.protected_size() == len(a) and cache.evictable_size() == len(b)
    assert cache.evict(10**6) == len(b)
    assert match(cache, a)[0] == va
    assert cache.evictable_size() == 0 and cache.protected_size() == len(a)
    check_accounting(cache, alloc)
    cache.dec_lock_ref(node)
    assert cache.evictable_size() == len(a) and cache.protected_size() == 0
    assert cache.evict(1) == len(a)
    assert alloc.available_size() == alloc.size


def test_locked_prefix_len_counts_the_locked_part_of_a_match_and_changes_nothing():
    """What a running request holds locked of a key's cached prefix, by a look that neither
    splits a node nor stamps one (a decode stretch bounds an admission check with it)."""
    from scheduler.core.ids import ids

    _, alloc, cache = make_cache(32, 1)
    insert_fresh(cache, alloc, paged("abcdef"))
    insert_fresh(cache, alloc, paged("abcxyz"))  # nodes "abc", "def", "xyz"
    _, node = match(cache, paged("abcdef"))
    cache.inc_lock_ref(node)  # "abc" and "def" locked, "xyz" not
    clock, sizes = cache._clock, (cache.evictable_size(), cache.protected_size())
    key = ids(paged("abcdeq"))
    assert cache.locked_prefix_len(key) == 5  # "abc" whole, "de" of "def"
    assert cache.locked_prefix_len(ids(paged("abcxyz"))) == 3  # "xyz" is not locked
    assert cache.locked_prefix_len(ids(paged("zzz"))) == 0
    assert cache.cached_prefix_len(ids(paged("abcxyq"))) == 5  # locked or not
    assert (cache._clock, cache.evictable_size(), cache.protected_size()) == (clock, *sizes)
    assert sorted(len(n.key) for n in cache._iter_nodes() if n is not cache.root) == [3, 3, 3]  # no split
    cache.dec_lock_ref(node)
    assert cache.locked_prefix_len(key) == 0


def test_split_of_locked_node_keeps_accounting():
    pool, alloc, cache = make_cache(16, 1)
    _, v = insert_fresh(cache, alloc, paged("abcd"))
    slots, node = match(cache, paged("abcd"))
    cache.inc_lock_ref(node)
    insert_fresh(cache, alloc, paged("abxy"))  # splits the locked node
    assert cache.protected_size() == 4 and cache.evictable_size() == 2
    check_structure(cache)
    check_accounting(cache, alloc)
    assert cache.evict(100) == 2
    assert match(cache, paged("abcd"))[0] == v
    cache.dec_lock_ref(node)  # the lock walks the split path
    assert cache.protected_size() == 0 and cache.evictable_size() == 4
    assert cache.evict(100) == 4
    assert cache.total_size() == 0 and alloc.available_size() == alloc.size


def test_locked_internal_node_after_its_children_are_evicted():
    pool, alloc, cache = make_cache(16, 1)
    _, v = insert_fresh(cache, alloc, paged("abcd"))
    slots, node = match(cache, paged("ab"))  # splits: locks the "ab" part
    cache.inc_lock_ref(node)
    assert cache.evict(100) == 2  # "cd" goes, "ab" is locked
    cache.dec_lock_ref(node)  # "ab" is now an unlocked leaf
    assert cache.evictable_size() == 2
    assert cache.evict(1) == 2
    assert cache.total_size() == 0 and alloc.available_size() == alloc.size


def test_evict_nothing():
    pool, alloc, cache = make_cache(16, 1)
    assert cache.evict(5) == 0
    insert_fresh(cache, alloc, paged("ab"))
    assert cache.evict(0) == 0
    assert cache.total_size() == 2


# ---------------------------------------------------------------------------
# random sequences: a RuleBasedStateMachine against the dict model
# ---------------------------------------------------------------------------

ALPHABET = st.integers(0, 2)


class RadixMachine(RuleBasedStateMachine):
    PS = 1
    NUM_PAGES = 40

    def __init__(self) -> None:
        super().__init__()
        ps = self.PS
        self.pool = ReqToTokenPool(4)
        self.alloc = TokenToKVPoolAllocator(self.NUM_PAGES * ps, ps)
        self.cache = RadixCache(self.pool, self.alloc, ps)
        self.model: dict[tuple, tuple] = {}
        self.keys: list[list[int]] = []  # inserted keys, to draw shared prefixes from
        self.locks: list[tuple[tuple, list[int], object]] = []  # (path, slots, node)

    # -- helpers ---------------------------------------------------------------
    def _key(self, base: int, cut: int, suffix: list[int], whole_pages: bool) -> list[int]:
        ps = self.PS
        key: list[int] = []
        if self.keys:
            src = self.keys[base % len(self.keys)]
            key = src[: (cut % (len(src) + 1))]
        key = key + suffix
        if whole_pages:
            key = key[: len(key) // ps * ps]
        return key

    def _expected_match(self, key: list[int]) -> int:
        ps = self.PS
        n = 0
        while n + ps <= len(key) and tuple(key[: n + ps]) in self.model:
            n += ps
        return n

    def _model_slots(self, key: list[int], n: int) -> list[int]:
        out: list[int] = []
        for j in range(0, n, self.PS):
            out.extend(self.model[tuple(key[: j + self.PS])])
        return out

    def _locked_tokens(self) -> int:
        pages: set[tuple] = set()
        for path, _, _ in self.locks:
            pages.update(path[: j + self.PS] for j in range(0, len(path), self.PS))
        return len(pages) * self.PS

    def _sync_after_evict(self) -> dict[tuple, int]:
        new = tree_model(self.cache)
        for k, v in new.items():
            assert self.model.get(k) == v, "eviction changed a cached slot"
        removed = {k: v for k, v in self.model.items() if k not in new}
        self.model = new
        return removed

    # -- rules -----------------------------------------------------------------
    @rule(base=st.integers(0, 10**6), cut=st.integers(0, 10**6), suffix=st.lists(ALPHABET, max_size=12))
    def insert(self, base, cut, suffix):
        ps = self.PS
        key = self._key(base, cut, suffix, whole_pages=True)
        if not key:
            return
        value = self.alloc.alloc(len(key))
        if value is None:
            short = len(key) - self.alloc.available_size()
            self.cache.evict(short)
            self._sync_after_evict()
            value = self.alloc.alloc(len(key))
            if value is None:
                assert self.cache.evictable_size() == 0, "evict(short) left evictable tokens but freed too few"
                return
        expect_already = self._expected_match(key)
        already = self.cache.insert(key, value)
        assert already == expect_already, f"insert({key}) said {already} cached, model says {expect_already}"
        assert already % ps == 0
        self.alloc.free(value[:already])
        for j in range(already, len(key), ps):
            self.model[tuple(key[: j + ps])] = tuple(value[j : j + ps])
        self.keys.append(key)
        slots, node = match(self.cache, key)
        assert slots == self._model_slots(key, len(key))
        assert slots[already:] == list(value[already:])

    @rule(base=st.integers(0, 10**6), cut=st.integers(0, 10**6), suffix=st.lists(ALPHABET, max_size=8))
    def match(self, base, cut, suffix):
        key = self._key(base, cut, suffix, whole_pages=False)
        n = self._expected_match(key)
        slots, node = match(self.cache, key)
        assert len(slots) == n, f"match_prefix({key}) gave {len(slots)} tokens, expected {n}"
        assert slots == self._model_slots(key, n)
        assert node_path(self.cache, node) == tuple(key[:n])

    @rule(base=st.integers(0, 10**6), cut=st.integers(0, 10**6))
    def lock(self, base, cut):
        if not self.keys:
            return
        key = self._key(base, cut, [], whole_pages=False)
        slots, node = match(self.cache, key)
        if not slots:
            return
        self.cache.inc_lock_ref(node)
        self.locks.append((tuple(key[: len(slots)]), slots, node))

    @precondition(lambda self: self.locks)
    @rule(pick=st.integers(0, 10**6))
    def unlock(self, pick):
        path, slots, node = self.locks.pop(pick % len(self.locks))
        self.cache.dec_lock_ref(node)

    # -- the shortcuts equal the walks they replace (on a deep copy of the cache) ------
    @rule(base=st.integers(0, 10**6), cut=st.integers(0, 10**6), suffix=st.lists(ALPHABET, max_size=8))
    def touch(self, base, cut, suffix):
        """touch_prefix stamps, and splits, as match_prefix does."""
        key = self._key(base, cut, suffix, whole_pages=False)
        twin = copy.deepcopy(self.cache)
        twin.match_prefix(key)
        self.cache.touch_prefix(key)
        assert tree_snapshot(self.cache) == tree_snapshot(twin)

    @precondition(lambda self: self.locks)
    @rule(pick=st.integers(0, 10**6), suffix=st.lists(ALPHABET, max_size=12))
    def match_below_lock(self, pick, suffix):
        """A match from a request's locked node (vLLM's cache_full_blocks) finds the length,
        and makes the splits and stamps, of match_prefix from the root."""
        path, _, node = self.locks[pick % len(self.locks)]
        key = array("q", list(path) + suffix)
        twin = copy.deepcopy(self.cache)
        slots, _ = twin.match_prefix(key)
        assert self.cache.match_len_below(key, node, len(path)) == len(slots)
        assert tree_snapshot(self.cache) == tree_snapshot(twin)

    @precondition(lambda self: self.locks)
    @rule(pick=st.integers(0, 10**6), suffix=st.lists(ALPHABET, max_size=12), prompt_cut=st.integers(0, 10**6))
    def insert_after_lock(self, pick, suffix, prompt_cut):
        """A request's insert past its locked node (walked without compares), then the prompt
        checkpoint split (walked along the inserted path), equal inserting the tokens and
        then the prompt again, both walked from the root."""
        ps = self.PS
        path, _, node = self.locks[pick % len(self.locks)]
        key = list(path) + suffix
        key = key[: len(key) // ps * ps]
        value = self.alloc.alloc(len(key))
        if value is None:
            return
        twin = copy.deepcopy(self.cache)
        expect_already = self._expected_match(key)
        already, end_node = self.cache._insert(array("q", key), value, known=node)
        twin_already, _ = twin._insert(array("q", key), value)
        assert already == twin_already == expect_already
        assert tree_snapshot(self.cache) == tree_snapshot(twin)
        input_len = prompt_cut % (len(key) + 1)
        n = input_len - input_len % ps
        self.cache._split_at_prompt(SimpleNamespace(input_len=input_len), len(key), end_node)
        if 0 < n < len(key):
            twin._insert(array("q", key[:n]), value[:n])
        assert tree_snapshot(self.cache) == tree_snapshot(twin)
        self.alloc.free(value[:already])
        for j in range(already, len(key), ps):
            self.model[tuple(key[: j + ps])] = tuple(value[j : j + ps])
        self.keys.append(key)

    @rule(n=st.integers(0, 60))
    def evict(self, n):
        evictable, protected = self.cache.evictable_size(), self.cache.protected_size()
        avail = self.alloc.available_size()
        evicted = self.cache.evict(n)
        removed = self._sync_after_evict()
        assert evicted == len(removed) * self.PS == evictable - self.cache.evictable_size()
        assert evicted >= min(n, evictable), f"evict({n}) freed {evicted} of {evictable} evictable"
        assert self.cache.protected_size() == protected
        assert self.alloc.available_size() == avail + evicted
        free = set(free_slot_list(self.alloc))
        assert {s for page in removed.values() for s in page} <= free
        # The model stays prefix closed: nothing is evicted from under a cached suffix.
        for k in self.model:
            assert len(k) == self.PS or k[: -self.PS] in self.model
        for path, slots, _node in self.locks:
            assert path in self.model, "a locked node was evicted"
            assert match(self.cache, list(path))[0] == slots

    @precondition(lambda self: not self.locks)
    @rule()
    def evict_all(self):
        self.cache.evict(self.cache.total_size() + 1)
        self._sync_after_evict()
        assert self.cache.total_size() == 0
        assert list(self.cache.all_values()) == []
        assert self.alloc.available_size() == self.alloc.size

    # -- invariants ------------------------------------------------------------------
    @invariant()
    def tree_matches_model(self):
        check_structure(self.cache)
        assert tree_model(self.cache) == self.model

    @invariant()
    def sizes_and_slots(self):
        check_accounting(self.cache, self.alloc)
        assert self.cache.protected_size() == self._locked_tokens()

    @invariant()
    def lock_refs(self):
        # Each lock's node still ends at its path, and every node counts the locks through it.
        for path, _, node in self.locks:
            assert node_path(self.cache, node) == path
        for node in iter_nodes(self.cache):
            if node is self.cache.root:
                continue
            p = node_path(self.cache, node)
            want = sum(1 for path, _, _ in self.locks if path[: len(p)] == p)
            assert node.lock_ref == want, f"node {p} lock_ref {node.lock_ref}, {want} locks go through it"

    def teardown(self):
        for _, _, node in self.locks:
            self.cache.dec_lock_ref(node)
        self.locks.clear()
        assert self.cache.protected_size() == 0
        self.cache.evict(10**9)
        assert self.cache.total_size() == 0
        assert self.alloc.available_size() == self.alloc.size


_STATEFUL = settings(max_examples=40, stateful_step_count=30, deadline=None, suppress_health_check=list(HealthCheck))


class TestRadixPage1(RadixMachine.TestCase):
    settings = _STATEFUL


class RadixMachine2(RadixMachine):
    PS = 2
    NUM_PAGES = 24


class TestRadixPage2(RadixMachine2.TestCase):
    settings = _STATEFUL


class RadixMachine4(RadixMachine):
    PS = 4
    NUM_PAGES = 12


class TestRadixPage4(RadixMachine4.TestCase):
    settings = _STATEFUL


# ---------------------------------------------------------------------------
# cache_finished_req / cache_unfinished_req with real Req objects
# ---------------------------------------------------------------------------


def make_req(rid: str, ids: list[int], max_new: int) -> Req:
    ids = list(ids)
    return Req(rid, len(ids), input_ids_fn=lambda: list(ids), sampling_params=SamplingParams(max_new_tokens=max_new), arrival_time=0.0)


class Harness:
    """Drives a cache as the scheduler does: admit/prefill (maybe in chunks), sample, decode, finish."""

    def __init__(self, num_tokens: int, ps: int, cache_cls=RadixCache, num_reqs: int = 8) -> None:
        self.ps = ps
        self.pool = ReqToTokenPool(num_reqs)
        self.alloc = TokenToKVPoolAllocator(num_tokens, ps)
        self.cache = cache_cls(self.pool, self.alloc, ps)
        self.running: list[Req] = []
        self.final_rows: dict[str, list[int]] = {}  # rid -> its req_to_token row when it finished

    def _alloc(self, fn):
        out = fn()
        if out is None:
            self.cache.evict(10**9 if self.cache.evictable_size() else 0)
            out = fn()
        return out

    def prefill(self, req: Req, chunk_end: int | None = None, chunk_len: int | None = None) -> bool:
        """One prefill round up to chunk_end, or chunk_len tokens past the prefix, or the whole
        prompt + outputs. False if out of memory (then nothing changed)."""
        full = cat(req.origin_input_ids, req.output_ids)
        new = req.req_pool_idx is None
        if new:
            # init_next_round_input: the longest cached prefix, leaving one token to compute.
            req.prefix_indices, req.last_node = self.cache.match_prefix(full[: len(full) - 1])
            self.cache.inc_lock_ref(req.last_node)
            idx = self.pool.alloc()
            assert idx is not None
            req.req_pool_idx = idx
            self.pool.write(idx, 0, req.prefix_indices)
        p = len(req.prefix_indices)
        if chunk_len is not None:
            chunk_end = p + chunk_len
        fill = full if chunk_end is None else full[:chunk_end]
        n = len(fill) - p
        assert n > 0
        row = self.pool.req_to_token[req.req_pool_idx]
        last = row[p - 1] if p else -1
        locs = self._alloc(lambda: self.alloc.alloc_extend([last], [p], [n]))
        if locs is None:
            if new:  # not admitted after all
                self.cache.dec_lock_ref(req.last_node)
                self.pool.free(req.req_pool_idx)
                req.req_pool_idx, req.prefix_indices, req.last_node = None, [], None
            return False
        if new:
            self.running.append(req)
        req.fill_ids = fill
        self.pool.write(req.req_pool_idx, p, locs)
        req.seq_len = p + n
        return True

    def cache_chunk(self, req: Req) -> None:
        """A chunk (not the last) is done: cache what the request prefilled so far."""
        self.cache.cache_unfinished_req(req)

    def sample(self, req: Req, token: int) -> bool:
        """A forward over the request sampled token; return whether the request finished."""
        req.output_ids.append(token)
        req.check_finished()
        if req.finished():
            self.final_rows[req.rid] = list(self.pool.req_to_token[req.req_pool_idx])
            self.cache.cache_finished_req(req)
            req.req_pool_idx = None
            self.running.remove(req)
            return True
        return False

    def after_prefill(self, req: Req, token: int) -> bool:
        finished = self.sample(req, token)
        if not finished:
            self.cache.cache_unfinished_req(req)
        return finished

    def decode(self, req: Req, token: int) -> bool | None:
        row = self.pool.req_to_token[req.req_pool_idx]
        loc = self._alloc(lambda: self.alloc.alloc_decode([row[req.seq_len - 1]], [req.seq_len]))
        if loc is None:
            return None
        row.append(loc[0])
        req.seq_len += 1
        return self.sample(req, token)

    def run_to_end(self, req: Req, tokens: list[int]) -> None:
        """Prefill, then decode until max_new_tokens, sampling tokens in order."""
        it = iter(tokens)
        assert self.prefill(req)
        if self.after_prefill(req, next(it)):
            return
        while True:
            done = self.decode(req, next(it))
            assert done is not None
            if done:
                return

    # -- checks --------------------------------------------------------------
    def check(self) -> None:
        """Every page is free, or the tree's, or one running request's own; rows point at live slots."""
        ps, alloc, cache = self.ps, self.alloc, self.cache
        values = list(cache.all_values())
        tree_slots = set(values)
        assert len(tree_slots) == len(values)
        assert cache.evictable_size() + cache.protected_size() == cache.total_size() == len(values)
        free_list = free_page_list(alloc)
        free_pages = set(free_list)
        assert len(free_pages) == len(free_list), "a page is free twice"
        owner: dict[int, str] = {}
        for s in values:
            assert owner.setdefault(s // ps, "tree") == "tree", "a page holds tree slots and others"
        for r in self.running:
            row = self.pool.req_to_token[r.req_pool_idx]
            assert len(row) == r.seq_len, f"{r.rid}: row of {len(row)} slots, seq_len {r.seq_len}"
            assert list(row[: len(r.prefix_indices)]) == list(r.prefix_indices), (
                f"{r.rid}: req_to_token row {row[: len(r.prefix_indices)]} != prefix_indices {r.prefix_indices}"
            )
            stale = [s for s in row if s // ps in free_pages]
            assert not stale, f"{r.rid}: its req_to_token row points at free slots {stale}"
            for s in row:
                if s not in tree_slots:
                    assert owner.setdefault(s // ps, r.rid) == r.rid, f"page {s // ps} owned by {owner[s // ps]} and {r.rid}"
        assert set(owner).isdisjoint(free_pages)
        assert len(owner) + len(free_pages) == alloc.num_pages, "KV pages leaked"
        assert self.pool.available_size() + len(self.running) == self.pool.size
        if not self.cache.disabled:
            # What running requests lock is exactly what is protected.
            locked: set[int] = set()
            for r in self.running:
                node = r.last_node
                while node is not None and node is not cache.root:
                    locked.update(node.value)
                    node = node.parent
            assert cache.protected_size() == len(locked)

    def check_idle(self) -> None:
        self.check()
        assert not self.running
        assert self.cache.protected_size() == 0
        assert self.alloc.available_size() + self.cache.total_size() == self.alloc.size
        assert self.pool.available_size() == self.pool.size


@pytest.mark.parametrize("ps", [1, 4])
@pytest.mark.parametrize("max_new", [1, 2, 5])
def test_finished_request_is_cached(ps, max_new):
    h = Harness(64, ps)
    prompt = list(range(10, 21))  # 11 tokens
    req = make_req("a", prompt, max_new)
    assert h.prefill(req)
    idx = req.req_pool_idx
    row_at_prefill = list(h.pool.req_to_token[idx])
    if not h.after_prefill(req, 100):
        h.check()
        for t in range(101, 100 + max_new):
            assert h.decode(req, t) is not None
            h.check()
    assert req.finished()
    assert idx in h.pool.free_slots, "the request slot was not freed"
    h.check_idle()
    kv_len = len(prompt) + max_new - 1
    cached = kv_len // ps * ps
    assert h.cache.total_size() == cached
    slots, _ = match(h.cache, prompt)
    assert len(slots) == len(prompt) // ps * ps
    assert slots == row_at_prefill[: len(slots)], "the tree does not hold the request's own slots"
    full, _ = match(h.cache, prompt + req.output_ids)
    assert len(full) == cached, "the outputs that have KV are not cached"
    # The last sampled token has no KV: it is not in the tree.
    assert len(match(h.cache, prompt + req.output_ids + [0] * ps)[0]) == cached


@pytest.mark.parametrize("ps", [1, 4])
def test_identical_requests_concurrent_keep_one_copy(ps):
    h = Harness(96, ps)
    prompt = list(range(10, 23))  # 13 tokens
    a, b = make_req("a", prompt, 3), make_req("b", prompt, 3)
    assert h.prefill(a) and h.prefill(b)  # both admitted before either is cached
    assert len(a.prefix_indices) == 0 and len(b.prefix_indices) == 0
    h.check()
    for r in (a, b):
        assert not h.sample(r, 7)
    h.check()
    for r in (a, b):
        assert h.decode(r, 8) is False
    h.check()
    assert h.decode(a, 9) is True
    h.check()
    assert h.decode(b, 9) is True
    h.check_idle()
    kv_len = len(prompt) + 2  # prompt, 7, 8 (9 has no KV)
    cached = kv_len // ps * ps
    assert h.cache.total_size() == cached, "both copies are cached"
    a_row = h.final_rows["a"]
    assert len(a_row) == kv_len
    assert match(h.cache, prompt + [7, 8, 9])[0] == a_row[:cached], "the first request's slots are not the cached ones"
    assert set(h.final_rows["b"][:cached]).isdisjoint(h.cache.all_values())


@pytest.mark.parametrize("ps", [1, 4])
def test_identical_requests_sequential_reuse_prefix(ps):
    h = Harness(96, ps)
    prompt = list(range(10, 23))
    a = make_req("a", prompt, 3)
    h.run_to_end(a, [7, 8, 9])
    h.check_idle()
    total = h.cache.total_size()
    b = make_req("b", prompt, 3)
    assert h.prefill(b)
    assert len(b.prefix_indices) == (len(prompt) - 1) // ps * ps
    assert h.cache.protected_size() == len(b.prefix_indices)
    h.check()
    assert not h.after_prefill(b, 7)
    h.check()
    assert h.decode(b, 8) is False
    assert h.decode(b, 9) is True
    h.check_idle()
    assert h.cache.total_size() == total


@pytest.mark.parametrize("ps", [1, 4])
def test_requests_with_different_outputs_branch(ps):
    h = Harness(128, ps)
    prompt = list(range(10, 22))  # 12 tokens
    a, b = make_req("a", prompt, 6), make_req("b", prompt, 6)
    h.run_to_end(a, [1, 2, 3, 4, 5, 6])
    h.run_to_end(b, [1, 2, 7, 7, 7, 7])
    h.check_idle()
    assert len(match(h.cache, prompt + [1, 2, 3, 4, 5])[0]) == 17 // ps * ps
    assert len(match(h.cache, prompt + [1, 2, 7, 7, 7])[0]) == 17 // ps * ps
    total = h.cache.total_size()
    assert h.cache.evict(10**6) == total
    assert h.cache.total_size() == 0
    h.check_idle()
    assert h.alloc.available_size() == h.alloc.size


@pytest.mark.parametrize("ps", [1, 4])
def test_unfinished_request_runs_on_tree_slots(ps):
    h = Harness(64, ps)
    prompt = list(range(30, 41))  # 11 tokens
    req = make_req("a", prompt, 4)
    assert h.prefill(req)
    assert not h.after_prefill(req, 1)  # cache_unfinished_req
    aligned = len(prompt) // ps * ps
    assert len(req.prefix_indices) == len(prompt)
    assert h.cache.total_size() == aligned
    assert h.cache.protected_size() == aligned, "the request does not lock what it runs on"
    assert match(h.cache, prompt)[0] == list(req.prefix_indices[:aligned])
    h.check()
    # Nothing it runs on can be evicted.
    h.cache.evict(10**6)
    assert h.cache.total_size() == aligned
    h.check()
    for t in (2, 3):
        assert h.decode(req, t) is False
        h.check()
    assert h.decode(req, 4) is True
    h.check_idle()


@pytest.mark.parametrize("ps", [1, 4])
def test_chunked_prefill_aligned_chunks(ps):
    h = Harness(96, ps)
    prompt = list(range(50, 50 + 4 * ps + 3))
    req = make_req("a", prompt, 2)
    assert h.prefill(req, chunk_end=2 * ps)
    h.cache_chunk(req)
    h.check()
    assert len(req.prefix_indices) == 2 * ps
    assert h.cache.protected_size() == 2 * ps
    assert h.prefill(req, chunk_end=4 * ps)
    h.cache_chunk(req)
    h.check()
    assert h.prefill(req)
    assert not h.after_prefill(req, 5)
    h.check()
    assert h.decode(req, 6) is True
    h.check_idle()
    assert h.cache.total_size() == (len(prompt) + 1) // ps * ps


@pytest.mark.parametrize("ps", [1, 4])
def test_chunked_request_meets_an_identical_finished_one(ps):
    """A chunked request whose next chunk another request has cached meanwhile switches to the tree's slots."""
    h = Harness(96, ps)
    prompt = list(range(60, 60 + 3 * ps))
    a = make_req("a", prompt, 1)
    assert h.prefill(a, chunk_end=ps)
    h.cache_chunk(a)
    b = make_req("b", prompt, 1)
    h.run_to_end(b, [9])  # b reuses a's first page and caches the whole prompt
    h.check()
    assert h.prefill(a)  # a's final chunk recomputes pages b cached
    h.check()
    assert h.sample(a, 9) is True
    h.check_idle()
    assert h.cache.total_size() == 3 * ps


def test_chunked_request_with_unaligned_chunk_meets_an_identical_one():
    """Page size 4, chunk ends at 6 (mid page): a keeps 2 own tail slots in prefix_indices.

    Then b, with the same prompt, caches all 12 tokens with its own slots. a's next
    chunk ends at 12 and cache_unfinished_req(a) finds 12 tokens already cached:
    it frees a's slots for tokens 6..12, which (pages being freed whole) also
    frees a's page holding tokens 4..7, and rewrites a's req_to_token row only
    from position 6. a's row keeps pointing at its freed slots for tokens 4 and 5.
    """
    ps = 4
    h = Harness(96, ps)
    prompt = list(range(70, 82))  # 12 tokens, 3 pages
    a = make_req("a", prompt + [0, 0, 0], 2)  # 15 tokens; chunks end at 6, then 12
    assert h.prefill(a, chunk_end=6)
    h.cache_chunk(a)
    h.check()
    assert len(a.prefix_indices) == 6  # 4 tree slots + 2 own slots
    b = make_req("b", prompt + [0, 0, 0], 1)
    assert h.prefill(b)
    assert len(b.prefix_indices) == 4
    assert h.sample(b, 5) is True  # b caches 12 tokens (3 pages) of the 15
    h.check()
    assert h.prefill(a, chunk_end=12)
    h.cache_chunk(a)  # 12 tokens cached already, by b
    assert list(a.prefix_indices) == match(h.cache, prompt)[0]
    h.check()  # fails: a's row positions 4, 5 point into a freed page
    assert h.prefill(a)
    assert not h.after_prefill(a, 1)
    assert h.decode(a, 2) is True
    h.check_idle()


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_radix_requests_random(data):
    """Random requests sharing prefixes, interleaved prefill (page-aligned chunks), decode and finish."""
    ps = data.draw(st.sampled_from([1, 2, 4]), label="page_size")
    h = Harness(48, ps, num_reqs=6)
    bases = [[1, 2, 3, 1, 2, 3, 1, 2], [1, 2, 3, 3, 3, 3, 3, 3], [2, 2, 2, 2, 2, 2, 2, 2]]
    chunking: dict[str, bool] = {}  # requests whose prefill is not complete
    count = 0
    for _ in range(data.draw(st.integers(5, 25), label="steps")):
        h.check()
        choices = ["admit"] if len(h.running) < 4 else []
        if h.running:
            choices.append("step")
        op = data.draw(st.sampled_from(choices), label="op")
        if op == "admit":
            base = data.draw(st.sampled_from(bases), label="base")
            cut = data.draw(st.integers(1, len(base)), label="cut")
            tail = data.draw(st.lists(st.integers(1, 3), max_size=5), label="tail")
            prompt = base[:cut] + tail
            req = make_req(f"r{count}", prompt, data.draw(st.integers(1, 4), label="max_new"))
            count += 1
            chunk = data.draw(st.sampled_from([None, 1, 2]), label="chunk_pages")
            if not h.prefill(req, chunk_len=None if chunk is None else chunk * ps):
                continue
            if len(req.fill_ids) < len(prompt):
                chunking[req.rid] = True
                h.cache_chunk(req)
            else:
                h.after_prefill(req, data.draw(st.integers(1, 3), label="tok"))
        else:
            req = data.draw(st.sampled_from(h.running), label="req")
            if req.rid in chunking:
                if not h.prefill(req, chunk_len=ps):
                    continue
                if len(req.fill_ids) < req.input_len:
                    h.cache_chunk(req)
                else:
                    del chunking[req.rid]
                    h.after_prefill(req, data.draw(st.integers(1, 3), label="tok"))
            else:
                h.decode(req, data.draw(st.integers(1, 3), label="tok"))
    h.check()


@pytest.mark.parametrize("ps", [1, 4])
def test_chunk_cache_frees_everything(ps):
    h = Harness(96, ps, cache_cls=ChunkCache)
    prompt = list(range(10, 23))
    a, b = make_req("a", prompt, 3), make_req("b", prompt, 2)
    assert h.prefill(a, chunk_end=ps)
    h.cache_chunk(a)
    assert list(a.prefix_indices) == list(h.pool.req_to_token[a.req_pool_idx][:ps])
    h.check()
    assert h.prefill(a)
    assert h.prefill(b)
    assert len(b.prefix_indices) == 0  # no sharing
    assert not h.after_prefill(a, 1)
    assert list(a.prefix_indices) == list(h.pool.req_to_token[a.req_pool_idx])
    assert not h.after_prefill(b, 1)
    h.check()
    assert h.decode(a, 2) is False
    assert h.decode(b, 2) is True
    h.check()
    assert h.decode(a, 3) is True
    h.check_idle()
    assert h.alloc.available_size() == h.alloc.size
    cache = h.cache
    assert cache.total_size() == cache.evictable_size() == cache.protected_size() == 0
    assert list(cache.all_values()) == [] and cache.evict(10) == 0
    assert match(cache, prompt) == ([], None)
