"""Ordering of the waiting queue (SGLang's schedule_policy.py).

FCFS keeps queue order; LPM puts the longest cached prefix first; DFS-weight
walks the radix tree so that requests sharing a prefix run together; LOF puts the
longest output first; random shuffles. With priority scheduling (SGLang's
--enable-priority-scheduling; the `priority` policy is FCFS with it) FCFS and LOF
sort by priority first, larger first, then by when a request entered the queue.
LPM falls back to FCFS on long queues, whose prefix matching would cost more than
it saves; without a radix cache the cache-aware policies are FCFS. Sorts are stable
(SGLang 0.5.23's schedule_policy.py): equal keys keep queue order, so a retracted or
preempted request, re-queued at the back, goes after its equals.
"""

from __future__ import annotations

import random
from collections import defaultdict

from scheduler.core.ids import ids, zeros
from scheduler.core.req import Req
from scheduler.memory.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator
from scheduler.memory.radix_cache import RadixCache, TreeNode

POLICIES = ("fcfs", "lpm", "dfs-weight", "lof", "random", "priority")
CACHE_AWARE = ("lpm", "dfs-weight")
FALLBACK_TO_FCFS = ("lpm",)  # SGLang falls back for LPM (and HRRN), not for DFS-weight

# SGLang's constants for the fallback, for in-batch prefix caching and for refreshing
# the LRU stamps of waiting requests' prefixes.
LPM_FALLBACK_QUEUE_LEN = 128
IN_BATCH_PREFIX_CHECK_THRESHOLD = 32
IN_BATCH_PREFIX_DEPRIORITIZE_THRESHOLD = 32
WAITING_PREFIX_REFRESH_INTERVAL = 32


class SchedulePolicy:
    def __init__(self, policy: str, tree_cache, seed: int = 0, enable_priority_scheduling: bool = False) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
        self.enable_priority_scheduling = enable_priority_scheduling or policy == "priority"
        if policy == "priority" or (policy in CACHE_AWARE and tree_cache.disabled):
            policy = "fcfs"
        self.policy = policy
        self.tree_cache = tree_cache
        self.rng = random.Random(seed)
        self._refresh_calls = 0
        # A throwaway tree over the waiting prompts: which of them share a prefix.
        self.waiting_queue_tree = RadixCache(ReqToTokenPool(1), TokenToKVPoolAllocator(0), page_size=1)

    def effective_policy(self, queue_len: int) -> str:
        policy = self.policy
        if policy in FALLBACK_TO_FCFS and queue_len > LPM_FALLBACK_QUEUE_LEN:
            return "fcfs"
        return policy

    def calc_priority(self, waiting_queue: list[Req]) -> None:
        """Sort waiting_queue in place."""
        policy = self.effective_policy(len(waiting_queue))
        if self.policy == "fcfs":
            if self.enable_priority_scheduling:
                waiting_queue.sort(key=lambda r: (-r.priority, r.queue_entry))
        elif policy in CACHE_AWARE:
            deprioritized = self._compute_prefix_matches(waiting_queue)
            if policy == "lpm":
                inf = float("inf")
                waiting_queue.sort(key=lambda r: inf if r.rid in deprioritized else -len(r.prefix_indices))
            else:
                self._sort_by_dfs_weight(waiting_queue)
        elif policy == "lof":
            if self.enable_priority_scheduling:
                waiting_queue.sort(key=lambda r: (-r.priority, -r.max_new_tokens))
            else:
                waiting_queue.sort(key=lambda r: -r.max_new_tokens)
        elif policy == "random":
            self.rng.shuffle(waiting_queue)
        if policy not in CACHE_AWARE:
            self._touch_waiting_prefixes(waiting_queue)

    def _touch_waiting_prefixes(self, waiting_queue: list[Req]) -> None:
        """Every 32nd pass, refresh the LRU stamps of the first 128 waiting requests' cached
        prefixes, the head last, so that eviction spares what is about to be admitted
        (SGLang's waiting-prefix refresh; cache-aware policies touch them by matching)."""
        if not waiting_queue or self.tree_cache.disabled:
            return
        refresh = self._refresh_calls % WAITING_PREFIX_REFRESH_INTERVAL == 0
        self._refresh_calls += 1
        if refresh:
            for r in reversed(waiting_queue[:LPM_FALLBACK_QUEUE_LEN]):
                self.tree_cache.touch_prefix(r.origin_input_ids + ids(r.output_ids) if r.output_ids else r.origin_input_ids)

    def _compute_prefix_matches(self, waiting_queue: list[Req]) -> set[str]:
        """Match every waiting request against the cache; return those to hold back.

        In-batch prefix caching: when several waiting requests share a prefix the
        cache does not hold yet, run one of them first so the others hit the cache.
        """
        deprioritized: set[str] = set()
        self.waiting_queue_tree.reset()
        for r in waiting_queue:
            r.match_full_prefix(self.tree_cache)
            if len(r.prefix_indices) <= IN_BATCH_PREFIX_CHECK_THRESHOLD:
                key = r.origin_input_ids + ids(r.output_ids) if r.output_ids else r.origin_input_ids
                matched, _ = self.waiting_queue_tree.match_prefix(key)
                if len(matched) >= IN_BATCH_PREFIX_DEPRIORITIZE_THRESHOLD:
                    deprioritized.add(r.rid)
                else:
                    self.waiting_queue_tree.insert(key, zeros(len(key)))
        return deprioritized

    def _sort_by_dfs_weight(self, waiting_queue: list[Req]) -> None:
        """SGLang's DFS-weight order: walk the cache tree, heaviest subtree first, and list
        each node's requests after its subtree's (post-order), so that requests sharing a
        prefix run together, the longest matches first."""
        last_node_to_reqs: dict[TreeNode, list[Req]] = defaultdict(list)
        for r in waiting_queue:
            last_node_to_reqs[r.last_node].append(r)
        weight: dict[TreeNode, int] = defaultdict(int)
        for node, reqs in last_node_to_reqs.items():
            while node is not None:  # a node weighs as much as the requests in its subtree
                weight[node] += len(reqs)
                node = node.parent
        ordered: list[Req] = []
        # Iterative post-order: (node, children expanded?).
        stack: list[tuple[TreeNode, bool]] = [(self.tree_cache.root, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                ordered.extend(last_node_to_reqs.get(node, ()))
                continue
            stack.append((node, True))
            children = [c for c in node.children.values() if weight.get(c, 0) > 0]
            # Heaviest first: stable sort keeps tree order among equals; push lightest first.
            children.sort(key=lambda c: -weight[c])
            stack.extend((c, False) for c in reversed(children))
        waiting_queue[:] = ordered
