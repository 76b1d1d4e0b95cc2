"""new_token_ratio's decay: each decode step that needs no retraction takes it to
max(ratio - decay, low) (SGLang's update_running_batch). A decode stretch applies many steps
at once; after() gives the very float that many steps one by one give, from a table of the
sequence (the decay runs from one start value, init_new_token_ratio, nearly always)."""

from __future__ import annotations

# Table entries at most (SGLang's default decay reaches low in 600 steps from its start, about
# 900 from 1.0; a tiny decay's long tail is stepped as before).
TABLE_LIMIT = 4096


class NewTokenRatioDecay:
    def __init__(self, decay: float, low: float) -> None:
        self.decay = decay
        self.low = low
        # The sequence from the last start value met (down to low, or TABLE_LIMIT values), and
        # each value's place in it.
        self._seq: list[float] = []
        self._index: dict[float, int] = {}

    def step(self, ratio: float) -> float:
        """One step's decay."""
        return max(ratio - self.decay, self.low)

    def after(self, ratio: float, steps: int) -> float:
        """The ratio after `steps` steps' decay from `ratio`."""
        i = self._index.get(ratio)
        if i is None:
            self._tabulate(ratio)
            i = 0
        seq = self._seq
        if i + steps < len(seq):
            return seq[i + steps]
        ratio = seq[-1]
        for _ in range(i + steps - len(seq) + 1):  # past the table (a decay too small to tabulate)
            nxt = self.step(ratio)
            if nxt == ratio:
                break
            ratio = nxt
        return ratio

    def _tabulate(self, ratio: float) -> None:
        """The sequence from ratio on (the same operations as step, one by one)."""
        seq = [ratio]
        while len(seq) < TABLE_LIMIT:
            nxt = self.step(ratio)
            if nxt == ratio:  # low (or a decay of 0): it stays there
                break
            ratio = nxt
            seq.append(ratio)
        self._seq = seq
        self._index = {r: i for i, r in enumerate(seq)}
