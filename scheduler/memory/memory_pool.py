"""The two index pools of the KV cache. They hand out indices; they own no memory.

- ReqToTokenPool: request slot -> the KV locations of its tokens (a table the
  engine mirrors on the device).
- TokenToKVPoolAllocator: free list of KV locations, in pages of page_size slots.
"""

from __future__ import annotations

from array import array

import numpy as np

from scheduler.core.ids import IDS_TYPECODE, as_ids, extend_range, ids


class ReqToTokenPool:
    def __init__(self, size: int, journal: bool = False) -> None:
        self.size = size
        # Row writes since the last take_journal(), for an executor's device mirror.
        self.journal: list[tuple[int, int, array]] | None = [] if journal else None
        self.req_to_token: list[array] = [ids() for _ in range(size)]
        self.free_slots: list[int] = list(range(size - 1, -1, -1))  # pop() gives 0 first

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self) -> int | None:
        if not self.free_slots:
            return None
        return self.free_slots.pop()

    def free(self, slot: int) -> None:
        self.req_to_token[slot] = ids()
        self.free_slots.append(slot)

    def write(self, slot: int, start: int, locs: array) -> None:
        """req_to_token[slot][start:start+len(locs)] = locs (the row grows at its end)."""
        row = self.req_to_token[slot]
        locs = as_ids(locs)
        if self.journal is not None:
            self.journal.append((slot, start, locs[:]))
        if start == len(row):
            row.extend(locs)
        else:
            assert start < len(row), "write leaves a hole"
            row[start : start + len(locs)] = locs

    def take_journal(self) -> list[tuple[int, int, array]] | None:
        journal = self.journal
        if journal is not None:
            self.journal = []
        return journal

    def get(self, slot: int, start: int, end: int) -> array:
        return self.req_to_token[slot][start:end]


def dealt(taken: array, n: int) -> list[array]:
    """Pages taken n a step, dealt out by place: entry i holds the i-th of each step's (strided
    slices of the array, in C)."""
    return [taken[i::n] for i in range(n)]


class TokenToKVPoolAllocator:
    """Free list of KV slots, page aligned.

    With page_size 1 the free list holds slots; otherwise it holds page ids, slot
    = page * page_size + offset, and a request fills its last page before it
    takes a new one (as SGLang's paged allocator does).
    """

    def __init__(self, size: int, page_size: int = 1) -> None:
        assert page_size >= 1
        self.page_size = page_size
        self.num_pages = size // page_size
        self.size = self.num_pages * page_size
        # Freed pages; pages never used yet are [next_fresh_page, num_pages), so memory
        # grows with the pages in use, not with the pool (a tiny model's pool on a big
        # GPU holds billions of tokens).
        self.free_pages: array = ids()
        self.next_fresh_page = 0

    def available_size(self) -> int:
        return (len(self.free_pages) + self.num_pages - self.next_fresh_page) * self.page_size

    def num_free_pages(self) -> int:
        return len(self.free_pages) + self.num_pages - self.next_fresh_page

    def take_pages(self, num_pages: int) -> array:
        free = self.free_pages
        if num_pages <= len(free):
            pages = free[len(free) - num_pages :]
            del free[len(free) - num_pages :]
            return pages
        pages = free
        self.free_pages = ids()
        fresh = num_pages - len(pages)
        extend_range(pages, self.next_fresh_page, self.next_fresh_page + fresh)
        self.next_fresh_page += fresh
        return pages

    def take_pages_singly(self, num_pages: int) -> array:
        """The pages of num_pages calls of take_pages(1), in call order (the last freed page
        first, then fresh ones): one request at a time taking a page, in one call."""
        free = self.free_pages
        t = min(num_pages, len(free))
        pages = free[len(free) - t :]
        del free[len(free) - t :]
        pages.reverse()
        fresh = num_pages - t
        if fresh:
            extend_range(pages, self.next_fresh_page, self.next_fresh_page + fresh)
            self.next_fresh_page += fresh
        return pages

    def take_pages_in_steps(self, num_pages: int, steps: int) -> array:
        """The pages of `steps` calls of take_pages(num_pages), concatenated in call order:
        each call takes the tail of the free list in order, then fresh pages."""
        free = self.free_pages
        from_free = min(steps, len(free) // num_pages) if num_pages else steps
        out = ids()
        end = len(free)
        if from_free:
            # Blocks of num_pages from the tail, the last block first, each in its own order.
            if from_free <= 16:  # (a few slices cost less than numpy's fixed cost)
                for k in range(from_free):
                    out.extend(free[end - (k + 1) * num_pages : end - k * num_pages])
            else:
                # (One expression: the numpy view of `free` is gone before `free` is cut below.)
                out.frombytes(
                    np.frombuffer(free, dtype=np.int64)[end - from_free * num_pages : end].reshape(from_free, num_pages)[::-1].tobytes()
                )
            end -= from_free * num_pages
        if from_free < steps:
            # The call that empties the free list takes what is left, then fresh pages.
            out.extend(free[:end])
            end = 0
            fresh = steps * num_pages - len(out)
            extend_range(out, self.next_fresh_page, self.next_fresh_page + fresh)
            self.next_fresh_page += fresh
        del free[end:]
        return out

    def take_pages_in_steps_dealt(self, num_pages: int, steps: int) -> list[array]:
        """take_pages_in_steps(num_pages, steps) dealt out by place: entry i holds the i-th page
        of each call, in call order (with page size 1, a decode stretch's slots of request i).
        From the free list alone, each entry is one strided slice of it (call k's block is
        free[end - (k + 1) * num_pages : end - k * num_pages])."""
        free, n = self.free_pages, num_pages
        end = len(free)
        low = end - steps * n
        if n == 0 or low < 0:
            taken = self.take_pages_in_steps(n, steps)
            return dealt(taken, n)
        out = [free[end - n + i : (low + i - 1 if low + i else None) : -n] for i in range(n)]
        del free[low:]
        return out

    def alloc(self, need_size: int) -> array | None:
        """need_size fresh slots (whole pages when page_size > 1)."""
        ps = self.page_size
        num_pages = -(-need_size // ps)
        if num_pages > self.num_free_pages():
            return None
        pages = self.take_pages(num_pages) if num_pages else ids()
        if ps == 1:
            return pages
        if len(pages) > 8:  # (a long prompt's pages: their slots by numpy)
            slots = (np.frombuffer(pages, dtype=np.int64)[:, None] * ps + np.arange(ps, dtype=np.int64)).ravel()
            return array(IDS_TYPECODE, slots[:need_size].tobytes())
        out = ids()
        for p in pages:
            out.extend(range(p * ps, p * ps + ps))
        return out[:need_size]

    def alloc_extend(self, last_locs: list[int], seq_lens_before: list[int], extend_lens: list[int]) -> array | None:
        """KV slots for extending each request by extend_lens tokens.

        last_locs[i] is the slot of the request's last token (-1 if none): a partly
        filled last page is filled first. Returns the flat list of slots, or None if
        the pool lacks pages (then nothing is allocated).
        """
        ps = self.page_size
        if ps == 1:
            return self.alloc(sum(extend_lens))
        need_pages = 0
        for before, n in zip(seq_lens_before, extend_lens):
            need_pages += -(-(before + n) // ps) - (-(-before // ps))
        if need_pages > self.num_free_pages():
            return None
        out = ids()
        for last, before, n in zip(last_locs, seq_lens_before, extend_lens):
            in_last_page = min(n, (-before) % ps)  # free slots left in the last page
            if in_last_page:
                extend_range(out, last + 1, last + 1 + in_last_page)
            rest = n - in_last_page
            if rest:
                out.extend(self.alloc(rest))  # type: ignore[arg-type]
        return out

    def alloc_decode(self, last_locs: list[int], seq_lens_before: list[int]) -> array | None:
        """One slot per request for its next token."""
        ps = self.page_size
        if ps == 1:
            return self.alloc(len(seq_lens_before))
        need_pages = sum(1 for before in seq_lens_before if before % ps == 0)
        if need_pages > self.num_free_pages():
            return None
        new_pages = self.take_pages(need_pages)
        out = ids()
        for last, before in zip(last_locs, seq_lens_before):
            if before % ps == 0:
                out.append(new_pages.pop() * ps)
            else:
                out.append(last + 1)
        return out

    def free(self, locs: array) -> None:
        if not locs:
            return
        ps = self.page_size
        if ps == 1:
            self.free_pages.extend(locs)
        elif len(locs) < 64:
            # Freeing any slot of a page frees the page.
            self.free_pages.extend(sorted({loc // ps for loc in locs}, reverse=True))
        else:  # (a long prompt's slots: the same pages, sorted by numpy)
            pages = np.unique(np.asarray(locs, dtype=np.int64) // ps)[::-1]
            self.free_pages.frombytes(pages.tobytes())
