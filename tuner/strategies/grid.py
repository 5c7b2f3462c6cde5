"""The exhaustive grid: every distinct feasible launch, in queue order (the baseline, the configs measured
first, then the space's order). Reliable, and the reference the others are judged against. No options."""

from __future__ import annotations

from dataclasses import dataclass

from .base import History
from .base import Level
from .base import Options
from .base import Strategy


@dataclass(frozen=True)
class GridOptions(Options):
    """The grid has none."""


class Grid(Strategy):
    name = "grid"
    options_type = GridOptions

    def __init__(self, options: GridOptions | None = None) -> None:
        self.options = options or GridOptions()

    def propose(self, level: Level, n: int, history: History) -> list:
        return level.open()[:n]
