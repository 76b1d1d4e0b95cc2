"""The end-of-run checks both schedulers make: every KV slot free or held by the cache,
nothing locked, every request finished (or rejected) with exactly its output length."""

from __future__ import annotations

from typing import Sized

import numpy as np

from scheduler.core.req import FinishReason, Req
from scheduler.memory.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator


class InvariantError(AssertionError):
    pass


def check_end_of_run(
    *,
    idle: bool,
    waiting: Sized,
    num_running: int,
    allocator: TokenToKVPoolAllocator,
    cache,
    req_to_token_pool: ReqToTokenPool,
    done: list[Req],
    num_requests: int,
) -> None:
    """Raise InvariantError naming every broken invariant."""
    alloc = allocator
    errors: list[str] = []
    # O(pages ever used), not O(pool): pages past next_fresh_page were never handed out.
    # Counted with numpy: a long run's cache holds hundreds of thousands of slots.
    used = alloc.next_fresh_page
    free = np.array(alloc.free_pages, dtype=np.int64)
    if free.size and (free.min() < 0 or free.max() >= used):
        errors.append("a fresh page is on the free list")
        free = free[(free >= 0) & (free < used)]
    times_free = np.bincount(free, minlength=used)
    if (times_free > 1).any():
        errors.append("a KV page is free twice")
    if cache.protected_size() != 0:
        errors.append(f"{cache.protected_size()} KV slots still locked in the cache")
    held = np.frombuffer(cache.all_values(), dtype=np.int64)
    held_pages = held // alloc.page_size if alloc.page_size > 1 else held
    if held.size and (held_pages.min() < 0 or held_pages.max() >= used):
        errors.append("the cache holds a page never handed out")
        held_pages = held_pages[(held_pages >= 0) & (held_pages < used)]
    is_held = np.bincount(held_pages, minlength=used) > 0
    if len(held) != cache.evictable_size() or (is_held & (times_free > 0)).any():
        errors.append("the cache's slots and its evictable size disagree, or a cached page is also free")
    leaked = used - int(np.count_nonzero(times_free | is_held))
    if leaked:
        errors.append(f"KV leak: {leaked} pages neither free nor cached")
    errors += end_of_run_errors(
        idle=idle, waiting=waiting, num_running=num_running, req_to_token_pool=req_to_token_pool, done=done, num_requests=num_requests
    )
    if errors:
        raise InvariantError("; ".join(errors))


def end_of_run_errors(
    *, idle: bool, waiting: Sized, num_running: int, req_to_token_pool: ReqToTokenPool, done: list[Req], num_requests: int
) -> list[str]:
    """The checks that do not look at the KV pool: nothing left to run, every request row
    free, every request done with its length."""
    errors: list[str] = []
    if not idle:
        errors.append(f"{len(waiting)} waiting and {num_running} running requests left")
    if req_to_token_pool.available_size() != req_to_token_pool.size:
        errors.append("request slots leaked")
    if len(done) != num_requests:
        errors.append(f"{num_requests - len(done)} requests never finished")
    for r in done:
        if r.finished_reason == FinishReason.REJECTED:
            continue
        if r.sampling_params.ignore_eos and len(r.output_ids) != max(r.max_new_tokens, 1):  # a cut to 0 still samples its prefill token
            errors.append(f"request {r.rid} produced {len(r.output_ids)} tokens, expected {r.max_new_tokens}")
            break
    return errors
