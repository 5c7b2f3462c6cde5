"""The interface every strategy implements, and what it sees of a level (see :mod:`tuner.strategies`)."""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only
    from sparse_mla_tuner.tuner.adapter import KernelAdapter

KernelConfig = Workload = object  # annotations: the adapter's config and workload types


@dataclass
class Level:
    """What a strategy sees of one study (one workload at one concurrency)."""

    concurrency: int
    workload: Workload
    candidates: list[KernelConfig]  # one config per distinct feasible launch, in queue order (baseline first)
    measured: dict[KernelConfig, float | None] = field(default_factory=dict)  # log ratio; None: failed
    pending: set[KernelConfig] = field(default_factory=set)  # queued or running, not yet recorded
    band: float = 0.01
    baseline: KernelConfig | None = None
    neighbours: dict[KernelConfig, list[KernelConfig]] = field(default_factory=dict)  # one step in one parameter
    representative: object = None  # config -> the candidate that stands for its launch here (or None)
    order: tuple[int, ...] = ()  # the space's levels in search order (empty: ascending concurrency)
    adapter: KernelAdapter | None = None  # the kernel's (its encoding, its shapes, which parameters compile)

    def __post_init__(self) -> None:
        if self.adapter is None:  # a level made without a space: the kernel a space that names none gets
            from sparse_mla_tuner.tuner.adapter import default_adapter

            self.adapter = default_adapter()

    def open(self) -> list[KernelConfig]:
        """Candidates neither measured nor pending, in queue order."""
        return [c for c in self.candidates if c not in self.measured and c not in self.pending]

    def best(self) -> tuple[KernelConfig, float] | None:
        ok = [(c, y) for c, y in self.measured.items() if y is not None]
        return min(ok, key=lambda cy: cy[1]) if ok else None


class Strategy:
    """One search strategy. ``propose`` and ``stop_reason`` are called under the study's lock."""

    name = ""
    asks = False  # True: Optuna's own sampler proposes (``study.ask``), narrowed to the candidates
    model_seconds = 0.0  # time spent in propose and stop_reason by a model (the surrogate's; 0 for the others)

    def sampler(self, seed: int):
        """The Optuna sampler of the study (None: Optuna's default; every trial is enqueued anyway)."""
        return None

    def propose(self, level: Level, n: int) -> list[KernelConfig]:
        """Up to ``n`` distinct open candidates to measure next; [] when the strategy has nothing more."""
        raise NotImplementedError

    def stop_reason(self, level: Level) -> str | None:
        """Why the level is done, or None to go on."""
        if not level.open():
            return f"every one of the {len(level.candidates)} distinct feasible launches measured"
        return None

    def history(self, rows) -> None:
        """Every measurement of the space at every level (and priors); see :mod:`tuner.strategies.surrogate`."""
