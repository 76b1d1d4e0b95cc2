"""ReqToTokenPool and TokenToKVPoolAllocator: unit tests and random operation sequences.

The allocator hands out indices of KV slots in pages of page_size slots. What a
user of it relies on:
- no slot is ever handed out twice while held, and allocations never overlap;
- available_size() is exact: free pages + pages held == num_pages;
- a failed allocation (None) changes nothing;
- alloc_extend fills a request's partly filled last page before taking a new one,
  so a request's token i always sits at offset i % page_size of its page and the
  slots of a page are contiguous;
- alloc_decode takes a new page exactly when seq_len % page_size == 0;
- free() gives back whole pages.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from scheduler.memory.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator

PAGE_SIZES = [1, 4, 16]


def pages_of(slots, ps):
    return {s // ps for s in slots}


def free_page_list(alloc: TokenToKVPoolAllocator) -> list[int]:
    """Every free page, with repeats if the allocator lists one twice.

    free_pages lists freed pages; an allocator that hands out never-used pages
    lazily keeps them as [next_fresh_page, num_pages).
    """
    fresh_from = getattr(alloc, "next_fresh_page", alloc.num_pages)
    return list(alloc.free_pages) + list(range(fresh_from, alloc.num_pages))


def free_page_set(alloc: TokenToKVPoolAllocator) -> set[int]:
    return set(free_page_list(alloc))


def alloc_state(alloc: TokenToKVPoolAllocator):
    """Everything that an allocation changes: a failed one must leave it equal."""
    return (list(alloc.free_pages), getattr(alloc, "next_fresh_page", None))


def free_slots(alloc: TokenToKVPoolAllocator) -> list[int]:
    ps = alloc.page_size
    out: list[int] = []
    for p in free_page_list(alloc):
        out.extend(range(p * ps, p * ps + ps))
    return out


def check_request_layout(slots: list[int], ps: int) -> None:
    """Token i of a request sits at offset i % ps of its page; a page's slots are contiguous."""
    for i, s in enumerate(slots):
        assert s % ps == i % ps, f"token {i} at slot {s}: offset {s % ps}, expected {i % ps}"
        if i % ps:
            assert s == slots[i - 1] + 1, f"token {i} at slot {s} does not follow slot {slots[i - 1]} in its page"
    # A request never shares a page between two of its page runs.
    page_seq = [s // ps for s in slots[::ps]]
    assert len(set(page_seq)) == len(page_seq)


# ---------------------------------------------------------------------------
# ReqToTokenPool
# ---------------------------------------------------------------------------


def test_req_to_token_pool_alloc_free_write_get():
    pool = ReqToTokenPool(3)
    assert pool.available_size() == 3
    slots = [pool.alloc(), pool.alloc(), pool.alloc()]
    assert slots == [0, 1, 2]
    assert pool.alloc() is None
    assert pool.available_size() == 0
    pool.write(1, 0, [10, 11, 12])
    pool.write(1, 3, [13])  # grows at its end
    pool.write(1, 1, [21, 22])  # overwrites in place
    assert list(pool.get(1, 0, 4)) == [10, 21, 22, 13]
    assert list(pool.get(1, 2, 10)) == [22, 13]
    with pytest.raises(AssertionError):
        pool.write(1, 6, [1])  # a hole
    pool.free(1)
    assert pool.available_size() == 1
    assert len(pool.req_to_token[1]) == 0
    assert pool.alloc() == 1
    assert len(pool.get(1, 0, 4)) == 0


@settings(max_examples=50, deadline=None)
@given(st.lists(st.booleans(), max_size=60))
def test_req_to_token_pool_never_hands_out_a_held_slot(ops):
    pool = ReqToTokenPool(5)
    held: list[int] = []
    for do_alloc in ops:
        if do_alloc:
            s = pool.alloc()
            if len(held) == 5:
                assert s is None
            else:
                assert s is not None and s not in held and 0 <= s < 5
                held.append(s)
        elif held:
            pool.free(held.pop(0))
        assert pool.available_size() + len(held) == 5


# ---------------------------------------------------------------------------
# Allocator: units
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_sizes(ps):
    a = TokenToKVPoolAllocator(10 * ps + ps - 1, ps)  # the remainder is not a page
    assert a.num_pages == 10
    assert a.size == 10 * ps
    assert a.available_size() == 10 * ps
    assert sorted(free_page_list(a)) == list(range(10))


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_alloc_whole_pages_and_free(ps):
    a = TokenToKVPoolAllocator(8 * ps, ps)
    x = a.alloc(2 * ps + 1)  # three pages, 2*ps+1 slots of them
    assert x is not None and len(x) == 2 * ps + 1
    assert len(set(x)) == len(x)
    check_request_layout(x, ps)
    n_pages = 3 if ps > 1 else 2 * ps + 1
    assert a.available_size() == (8 * ps) - n_pages * ps
    assert pages_of(x, ps).isdisjoint(free_page_set(a))
    a.free(x)
    assert a.available_size() == 8 * ps
    assert sorted(free_page_list(a)) == list(range(8))


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_alloc_zero(ps):
    a = TokenToKVPoolAllocator(4 * ps, ps)
    assert list(a.alloc(0)) == []
    assert a.available_size() == 4 * ps
    assert list(a.alloc_extend([-1], [0], [0])) == []
    assert a.available_size() == 4 * ps
    a.free([])
    assert a.available_size() == 4 * ps


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_alloc_fails_without_side_effects(ps):
    a = TokenToKVPoolAllocator(4 * ps, ps)
    held = a.alloc(3 * ps)
    assert held is not None
    before = alloc_state(a)
    assert a.alloc(ps + 1) is None
    assert alloc_state(a) == before
    # Two requests that together need two pages, with one free.
    assert a.alloc_extend([-1, -1], [0, 0], [1, 1]) is None
    assert alloc_state(a) == before
    assert a.alloc(ps) is not None  # exactly what is left still works
    assert a.available_size() == 0
    assert a.alloc(1) is None
    assert a.alloc_decode([held[-1]], [3 * ps]) is None  # needs a new page
    assert a.available_size() == 0


@pytest.mark.parametrize("ps", [4, 16])
def test_alloc_extend_fills_last_page_first(ps):
    a = TokenToKVPoolAllocator(8 * ps, ps)
    first = a.alloc_extend([-1], [0], [ps + 1])  # one whole page and one slot of the next
    assert first is not None and len(first) == ps + 1
    check_request_layout(first, ps)
    avail = a.available_size()
    # Extend by ps - 1: exactly the rest of the partly filled page, no new page.
    more = a.alloc_extend([first[-1]], [ps + 1], [ps - 1])
    assert list(more) == list(range(first[-1] + 1, first[-1] + ps))
    assert a.available_size() == avail
    seq = first + more
    check_request_layout(seq, ps)
    # The page is now full: the next token takes a new page.
    nxt = a.alloc_extend([seq[-1]], [len(seq)], [1])
    assert nxt is not None and nxt[0] % ps == 0 and nxt[0] // ps in (set(range(8)) - pages_of(seq, ps))
    assert a.available_size() == avail - ps


@pytest.mark.parametrize("ps", [4, 16])
def test_alloc_extend_partial_page_needs_no_free_page(ps):
    a = TokenToKVPoolAllocator(2 * ps, ps)
    x = a.alloc_extend([-1], [0], [2 * ps - 1])  # all pages, the last one missing a slot
    assert x is not None and a.available_size() == 0
    y = a.alloc_extend([x[-1]], [2 * ps - 1], [1])
    assert list(y) == [x[-1] + 1]
    assert a.alloc_extend([y[-1]], [2 * ps], [1]) is None


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_alloc_decode_takes_page_exactly_at_page_boundary(ps):
    a = TokenToKVPoolAllocator(8 * ps, ps)
    seq = a.alloc_extend([-1], [0], [1])
    assert seq is not None
    for _ in range(3 * ps + 2):
        free_before = free_page_set(a)
        avail = a.available_size()
        (loc,) = a.alloc_decode([seq[-1]], [len(seq)])
        if len(seq) % ps == 0:
            assert loc % ps == 0 and loc // ps in free_before
            assert a.available_size() == avail - ps
        else:
            assert loc == seq[-1] + 1
            assert a.available_size() == avail
        seq.append(loc)
        check_request_layout(seq, ps)
    assert len(set(seq)) == len(seq)


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_free_returns_whole_pages(ps):
    a = TokenToKVPoolAllocator(6 * ps, ps)
    x = a.alloc(3 * ps)
    assert x is not None
    # Freeing one slot of a page gives back the whole page.
    a.free([x[ps + ps // 2]])
    assert a.available_size() == 4 * ps
    assert x[ps] // ps in free_page_set(a)
    a.free(x[:ps] + x[2 * ps :])
    assert a.available_size() == 6 * ps
    assert sorted(free_page_list(a)) == list(range(6))


def test_page_size_one_slots_are_independent():
    a = TokenToKVPoolAllocator(8, 1)
    x = a.alloc(5)
    assert list(x) == [0, 1, 2, 3, 4]
    a.free([1, 3])
    assert a.available_size() == 5
    y = a.alloc(2)
    assert set(y) == {1, 3}
    assert list(a.alloc_decode([4, 3], [7, 9])) == [5, 6]
    assert list(a.alloc_extend([], [3], [1])) == [7]  # page size 1 needs no last_locs
    assert a.available_size() == 0


def test_alloc_decode_page1_as_the_scheduler_calls_it():
    """ScheduleBatch.prepare_for_decode passes last_locs=[] when page_size == 1.

    alloc_decode must still give one slot per request (len(seq_lens_before)),
    as alloc_extend does for the same calling convention.
    """
    a = TokenToKVPoolAllocator(8, 1)
    out = a.alloc_decode([], [5, 3, 1])
    assert out is not None and len(out) == 3, f"3 requests decode, got slots {out}"
    assert len(set(out)) == 3
    assert a.available_size() == 5


# ---------------------------------------------------------------------------
# Allocator: random operation sequences (stateful)
# ---------------------------------------------------------------------------


class AllocatorMachine(RuleBasedStateMachine):
    """Requests grow by extend and decode, raw chunks are allocated, everything is freed."""

    PS = 1
    NUM_PAGES = 10

    def __init__(self) -> None:
        super().__init__()
        ps = self.PS
        self.a = TokenToKVPoolAllocator(self.NUM_PAGES * ps + (ps - 1), ps)
        self.reqs: dict[int, list[int]] = {}  # request id -> its slots, token order
        self.chunks: list[list[int]] = []  # raw alloc() results
        self.next_rid = 0

    # -- helpers -------------------------------------------------------------
    def _held_slots(self) -> list[int]:
        out: list[int] = []
        for s in self.reqs.values():
            out.extend(s)
        for c in self.chunks:
            out.extend(c)
        return out

    def _held_pages(self) -> set[int]:
        return pages_of(self._held_slots(), self.PS)

    def _pages_needed(self, before: int, n: int) -> int:
        ps = self.PS
        return -(-(before + n) // ps) - (-(-before // ps))

    # -- rules ---------------------------------------------------------------
    @rule(
        new=st.lists(st.integers(0, 40), max_size=3),
        grow=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 40)), max_size=3),
    )
    def extend(self, new, grow):
        ps = self.PS
        batch: list[tuple[int | None, int]] = []
        seen: set[int] = set()
        rids = sorted(self.reqs)
        for pick, n in grow:
            if rids:
                rid = rids[pick % len(rids)]
                if rid not in seen:
                    seen.add(rid)
                    batch.append((rid, n))
        batch.extend((None, n) for n in new)
        if not batch:
            return
        last_locs = [self.reqs[r][-1] if r is not None and self.reqs[r] else -1 for r, _ in batch]
        before = [len(self.reqs[r]) if r is not None else 0 for r, _ in batch]
        lens = [n for _, n in batch]
        need = sum(self._pages_needed(b, n) for b, n in zip(before, lens))
        free_before = free_page_set(self.a)
        state = alloc_state(self.a)
        out = self.a.alloc_extend(last_locs if self.PS > 1 else [], before, lens)
        if need > len(free_before):
            assert out is None, f"needed {need} pages with {len(free_before)} free, got {out}"
            assert alloc_state(self.a) == state, "a failed alloc_extend changed the free list"
            return
        assert out is not None, f"needed {need} pages with {len(free_before)} free, got None"
        assert len(out) == sum(lens)
        free_after = free_page_set(self.a)
        assert len(free_before) - len(free_after) == need, "alloc_extend took more or fewer pages than needed"
        fresh_pages = free_before - free_after
        held_before = set(self._held_slots())
        assert held_before.isdisjoint(out), "alloc_extend handed out a held slot"
        pos = 0
        for (rid, n), b in zip(batch, before):
            got = out[pos : pos + n]
            pos += n
            if rid is None:
                rid = self.next_rid
                self.next_rid += 1
                self.reqs[rid] = []
            seq = self.reqs[rid]
            # Slots that continue a partly filled page, then slots on fresh pages.
            in_last = min(n, (-b) % ps)
            if in_last:
                assert list(got[:in_last]) == list(range(seq[-1] + 1, seq[-1] + 1 + in_last))
            assert pages_of(got[in_last:], ps) <= fresh_pages
            seq.extend(got)
            check_request_layout(seq, ps)

    @rule(picks=st.lists(st.integers(0, 10**6), min_size=1, max_size=4, unique=True))
    def decode(self, picks):
        ps = self.PS
        rids = sorted(r for r, s in self.reqs.items() if s)
        if not rids:
            return
        batch = sorted({rids[p % len(rids)] for p in picks})
        before = [len(self.reqs[r]) for r in batch]
        last_locs = [self.reqs[r][-1] for r in batch]
        need = sum(1 for b in before if b % ps == 0) if ps > 1 else len(batch)
        free_before = free_page_set(self.a)
        state = alloc_state(self.a)
        # The scheduler passes no last_locs with page size 1 (they are not needed).
        out = self.a.alloc_decode(last_locs if ps > 1 else [], before)
        if need > len(free_before):
            assert out is None
            assert alloc_state(self.a) == state
            return
        assert out is not None and len(out) == len(batch)
        assert len(free_before) - len(free_page_set(self.a)) == need
        assert set(self._held_slots()).isdisjoint(out)
        for r, b, loc in zip(batch, before, out):
            if b % ps == 0:
                assert loc % ps == 0 and loc // ps in free_before, "decode at a page boundary must take a fresh page"
            else:
                assert loc == self.reqs[r][-1] + 1, "decode inside a page must take the next slot"
            self.reqs[r].append(loc)
            check_request_layout(self.reqs[r], ps)

    @rule(n=st.integers(0, 40))
    def raw_alloc(self, n):
        ps = self.PS
        need = -(-n // ps)
        free_before = free_page_set(self.a)
        state = alloc_state(self.a)
        out = self.a.alloc(n)
        if need > len(free_before):
            assert out is None
            assert alloc_state(self.a) == state
            return
        assert out is not None and len(out) == n
        assert len(free_before) - len(free_page_set(self.a)) == need
        assert pages_of(out, ps) <= free_before
        assert set(self._held_slots()).isdisjoint(out)
        check_request_layout(out, ps)
        self.chunks.append(out)

    @precondition(lambda self: self.reqs)
    @rule(pick=st.integers(0, 10**6))
    def free_request(self, pick):
        rids = sorted(self.reqs)
        rid = rids[pick % len(rids)]
        slots = self.reqs.pop(rid)
        avail = self.a.available_size()
        self.a.free(slots)
        assert self.a.available_size() == avail + len(pages_of(slots, self.PS)) * self.PS

    @precondition(lambda self: self.chunks)
    @rule(pick=st.integers(0, 10**6))
    def free_chunk(self, pick):
        chunk = self.chunks.pop(pick % len(self.chunks))
        avail = self.a.available_size()
        self.a.free(chunk)
        assert self.a.available_size() == avail + len(pages_of(chunk, self.PS)) * self.PS

    # -- invariants ------------------------------------------------------------
    @invariant()
    def accounting(self):
        a, ps = self.a, self.PS
        held = self._held_slots()
        assert len(set(held)) == len(held), "a slot is held twice"
        assert all(0 <= s < a.size for s in held)
        free = free_page_list(a)
        assert len(set(free)) == len(free), "a page is free twice"
        assert all(0 <= p < a.num_pages for p in free)
        held_pages = self._held_pages()
        assert held_pages.isdisjoint(free), "a held page is also free"
        assert a.available_size() == len(free) * ps
        assert len(held_pages) + len(free) == a.num_pages, "pages leaked"
        assert a.available_size() + len(held_pages) * ps == a.size
        # Two requests never share a page (a page belongs to one holder).
        owners: dict[int, int] = {}
        holders = list(self.reqs.values()) + self.chunks
        for i, slots in enumerate(holders):
            for p in pages_of(slots, ps):
                assert owners.setdefault(p, i) == i, f"page {p} shared by two holders"

    def teardown(self):
        for s in list(self.reqs.values()) + self.chunks:
            self.a.free(s)
        assert self.a.available_size() == self.a.size
        assert sorted(free_page_list(self.a)) == list(range(self.a.num_pages))


_STATEFUL = settings(max_examples=40, stateful_step_count=30, deadline=None, suppress_health_check=list(HealthCheck))


class TestAllocatorPage1(AllocatorMachine.TestCase):
    settings = _STATEFUL


class AllocatorMachine4(AllocatorMachine):
    PS = 4


class TestAllocatorPage4(AllocatorMachine4.TestCase):
    settings = _STATEFUL


class AllocatorMachine16(AllocatorMachine):
    PS = 16
    NUM_PAGES = 6


class TestAllocatorPage16(AllocatorMachine16.TestCase):
    settings = _STATEFUL
