"""Ordering of the waiting queue (SGLang's schedule_policy.py).

FCFS keeps arrival order; LPM puts the longest cached prefix first; DFS-weight
walks the radix tree so that requests sharing a prefix run together; LOF puts the
longest output first; random shuffles; priority sorts by the request's priority.
The cache-aware policies fall back to FCFS on long queues, whose prefix matching
would cost more than it saves, as SGLang does.
"""

from __future__ import annotations

import random
from collections import defaultdict

from scheduler.ids import zeros
from scheduler.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator
from scheduler.radix_cache import RadixCache, TreeNode
from scheduler.req import Req

POLICIES = ("fcfs", "lpm", "dfs-weight", "lof", "random", "priority")
CACHE_AWARE = ("lpm", "dfs-weight")

# SGLang's constants for the fallback and for in-batch prefix caching.
LPM_FALLBACK_QUEUE_LEN = 128
IN_BATCH_PREFIX_CHECK_THRESHOLD = 32
IN_BATCH_PREFIX_DEPRIORITIZE_THRESHOLD = 32


class SchedulePolicy:
    def __init__(self, policy: str, tree_cache, seed: int = 0) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
        self.policy = policy
        self.tree_cache = tree_cache
        self.rng = random.Random(seed)
        # A throwaway tree over the waiting prompts: which of them share a prefix.
        self.waiting_queue_tree = RadixCache(ReqToTokenPool(1), TokenToKVPoolAllocator(0), page_size=1)

    def effective_policy(self, queue_len: int) -> str:
        policy = self.policy
        if policy in CACHE_AWARE and (queue_len > LPM_FALLBACK_QUEUE_LEN or self.tree_cache.disabled):
            return "fcfs"
        return policy

    def calc_priority(self, waiting_queue: list[Req]) -> None:
        """Sort waiting_queue in place."""
        policy = self.effective_policy(len(waiting_queue))
        if policy == "fcfs":
            return
        if policy == "lof":
            waiting_queue.sort(key=lambda r: (-r.max_new_tokens, r.index))
        elif policy == "random":
            self.rng.shuffle(waiting_queue)
        elif policy == "priority":
            # Larger value first (SGLang's default), then arrival order.
            waiting_queue.sort(key=lambda r: (-r.priority, r.arrival_time, r.index))
        else:
            deprioritized = self._compute_prefix_matches(waiting_queue)
            if policy == "lpm":
                waiting_queue.sort(key=lambda r: (r.rid in deprioritized, -len(r.prefix_indices), r.index))
            else:
                self._sort_by_dfs_weight(waiting_queue)

    def _compute_prefix_matches(self, waiting_queue: list[Req]) -> set[str]:
        """Match every waiting request against the cache; return those to hold back.

        In-batch prefix caching: when several waiting requests share a prefix the
        cache does not hold yet, run one of them first so the others hit the cache.
        """
        deprioritized: set[str] = set()
        self.waiting_queue_tree.reset()
        for r in waiting_queue:
            r.init_next_round_input(self.tree_cache)
            if len(r.prefix_indices) <= IN_BATCH_PREFIX_CHECK_THRESHOLD:
                key = r.fill_ids[: len(r.fill_ids) - 1]
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
