"""The exhaustive grid: every distinct feasible launch, in queue order (the baseline, the configs measured
first, then the space's order). Reliable, and the reference the others are judged against."""

from __future__ import annotations

from sparse_mla_tuner.tuner.strategies.base import Level
from sparse_mla_tuner.tuner.strategies.base import Strategy


class Grid(Strategy):
    name = "grid"

    def propose(self, level: Level, n: int) -> list:
        return level.open()[:n]
