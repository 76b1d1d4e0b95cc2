"""new_token_ratio's decay: each decode step that needs no retraction takes it to
max(ratio - decay, low) (SGLang's update_running_batch). A decode stretch applies many steps
at once; after() gives the very float that many steps one by one give, from a table of the
sequence (the decay runs from one start value, init_new_token_ratio, nearly always)."""

from __future__ import annotations


class NewTokenRatioDecay:
    def __init__(self, decay: float, low: float) -> None:
        self.decay = decay
        self.low = low
        # The sequence from a start value down to low, and each value's place in it.
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
        return seq[min(i + steps, len(seq) - 1)]

    def _tabulate(self, ratio: float) -> None:
        """The sequence from ratio down to low (the same operations as step, one by one)."""
        seq = [ratio]
        while True:
            nxt = self.step(ratio)
            if nxt == ratio:  # low, or a decay of 0
                break
            ratio = nxt
            seq.append(ratio)
        self._seq = seq
        self._index = {r: i for i, r in enumerate(seq)}
