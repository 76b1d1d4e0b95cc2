"""The router's own approximate index of what each instance has cached, as SGLang's router keeps
one (its "approximate tree"): the prompts it sent to each instance, not the instance's real
cache, trimmed to a size by least recent use.

Prompts are indexed by blocks of BLOCK tokens, each block keyed by a hash of the whole prefix up
to its end (scheduler/vllm/block_hashes.py), so a prefix match is a walk over block keys. A
request's match on an instance is the number of its leading tokens (in whole blocks) that the
instance was sent before; its match rate is that over its prompt length.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from scheduler.vllm.block_hashes import block_hashes

BLOCK = 16


def prompt_keys(prompt) -> list[int]:
    """The block keys of a prompt's whole blocks."""
    tokens = np.asarray(prompt, dtype=np.int64)
    n = len(tokens) // BLOCK * BLOCK
    return block_hashes(tokens[:n], 0, 0, BLOCK).tolist() if n else []


class PrefixIndex:
    """One instance's blocks as the router has sent them, least recently used first."""

    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max_blocks
        self.blocks: OrderedDict[int, None] = OrderedDict()

    def match(self, keys: list[int]) -> int:
        """How many leading blocks of keys this instance was sent."""
        n = 0
        for k in keys:
            if k not in self.blocks:
                break
            n += 1
        return n

    def insert(self, keys: list[int]) -> None:
        blocks = self.blocks
        for k in keys:
            if k in blocks:
                blocks.move_to_end(k)
            else:
                blocks[k] = None
        while len(blocks) > self.max_blocks:
            blocks.popitem(last=False)

    def __len__(self) -> int:
        return len(self.blocks)
