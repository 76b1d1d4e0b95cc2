"""The two index pools of the KV cache. They hand out indices; they own no memory.

- ReqToTokenPool: request slot -> the KV locations of its tokens (a table the
  engine mirrors on the device).
- TokenToKVPoolAllocator: free list of KV locations, in pages of page_size slots.
"""

from __future__ import annotations


class ReqToTokenPool:
    def __init__(self, size: int) -> None:
        self.size = size
        self.req_to_token: list[list[int]] = [[] for _ in range(size)]
        self.free_slots: list[int] = list(range(size - 1, -1, -1))  # pop() gives 0 first

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self) -> int | None:
        if not self.free_slots:
            return None
        return self.free_slots.pop()

    def free(self, slot: int) -> None:
        self.req_to_token[slot] = []
        self.free_slots.append(slot)

    def write(self, slot: int, start: int, locs: list[int]) -> None:
        """req_to_token[slot][start:start+len(locs)] = locs (the row grows at its end)."""
        row = self.req_to_token[slot]
        if start == len(row):
            row.extend(locs)
        else:
            assert start < len(row), "write leaves a hole"
            row[start : start + len(locs)] = locs

    def get(self, slot: int, start: int, end: int) -> list[int]:
        return self.req_to_token[slot][start:end]


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
        # Pop from the end gives the lowest index first: deterministic and cache friendly.
        self.free_pages: list[int] = list(range(self.num_pages - 1, -1, -1))

    def available_size(self) -> int:
        return len(self.free_pages) * self.page_size

    def alloc(self, need_size: int) -> list[int] | None:
        """need_size fresh slots (whole pages when page_size > 1)."""
        ps = self.page_size
        num_pages = -(-need_size // ps)
        if num_pages > len(self.free_pages):
            return None
        pages = self.free_pages[-num_pages:] if num_pages else []
        del self.free_pages[len(self.free_pages) - num_pages :]
        pages.reverse()
        if ps == 1:
            return pages
        out: list[int] = []
        for p in pages:
            out.extend(range(p * ps, p * ps + ps))
        return out[:need_size]

    def alloc_extend(self, last_locs: list[int], seq_lens_before: list[int], extend_lens: list[int]) -> list[int] | None:
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
        if need_pages > len(self.free_pages):
            return None
        out: list[int] = []
        for last, before, n in zip(last_locs, seq_lens_before, extend_lens):
            in_last_page = min(n, (-before) % ps)  # free slots left in the last page
            if in_last_page:
                out.extend(range(last + 1, last + 1 + in_last_page))
            rest = n - in_last_page
            if rest:
                out.extend(self.alloc(rest))  # type: ignore[arg-type]
        return out

    def alloc_decode(self, last_locs: list[int], seq_lens_before: list[int]) -> list[int] | None:
        """One slot per request for its next token."""
        ps = self.page_size
        if ps == 1:
            return self.alloc(len(last_locs))
        need_pages = sum(1 for before in seq_lens_before if before % ps == 0)
        if need_pages > len(self.free_pages):
            return None
        out: list[int] = []
        for last, before in zip(last_locs, seq_lens_before):
            if before % ps == 0:
                p = self.free_pages.pop()
                out.append(p * ps)
            else:
                out.append(last + 1)
        return out

    def free(self, locs: list[int]) -> None:
        if not locs:
            return
        ps = self.page_size
        if ps == 1:
            self.free_pages.extend(locs)
        else:
            # Freeing any slot of a page frees the page.
            self.free_pages.extend(sorted({loc // ps for loc in locs}, reverse=True))
