"""The interface every strategy implements, what it sees of a level and of the other levels, and its options
(see :mod:`tuner.strategies`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from typing import TYPE_CHECKING
from typing import Any
from typing import NamedTuple

if TYPE_CHECKING:  # annotations only
    from ..adapter import KernelAdapter

KernelConfig = Workload = object  # annotations: the adapter's config and workload types


class Measured(NamedTuple):
    """One measurement a strategy learns from: a launch at a level, of this kernel or a prior's."""

    concurrency: int
    config: KernelConfig
    y: float | None  # the log ratio to the baseline; None: the launch failed (crashed, wrong, timed out)
    source: tuple | None = None  # None: this kernel on this device; else (kernel, device) of an earlier record


# every measurement at the space's *other* levels, and the priors: one sequence per level, or the same one appended to
# between levels, never changed in place otherwise (a strategy may compute what it takes from it once per level)
History = Sequence[Measured]


@dataclass
class Level:
    """What a strategy sees of one study (one workload at one concurrency). Its own measurements are
    ``measured``; those of the other levels come with each call, as the ``history`` argument."""

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
            from ..adapter import default_adapter

            self.adapter = default_adapter()

    def open(self) -> list[KernelConfig]:
        """Candidates neither measured nor pending, in queue order."""
        return [c for c in self.candidates if c not in self.measured and c not in self.pending]

    def best(self) -> tuple[KernelConfig, float] | None:
        ok = [(c, y) for c, y in self.measured.items() if y is not None]
        return min(ok, key=lambda cy: cy[1]) if ok else None

    def own(self) -> tuple[Measured, ...]:
        """This level's measurements as history rows (this kernel's, in the order they were recorded)."""
        return tuple(Measured(self.concurrency, c, y, None) for c, y in self.measured.items())

    def lookup(self) -> Callable[[KernelConfig], KernelConfig | None]:
        """config -> the candidate that launches what it launches here, or None: ``representative``, or without
        one the candidate equal to it."""
        if self.representative is not None:
            return self.representative
        return {c: c for c in self.candidates}.get


# --- options: a strategy's settings as a typed, validated, documented table -------------------------------


def option(default: Any, doc: str, low: float | None = None, high: float | None = None) -> Any:
    """One field of a strategy's :class:`Options`: its default (whose type is the option's: an int or a float),
    what it does (``doc``) and its range (``low`` and ``high``, inclusive, where given)."""
    kind = "an integer" if isinstance(default, int) else "a number"
    if low is not None and high is not None:
        rule = f"{kind} in [{low}, {high}]"
    else:
        rule = f"{kind} >= {low}" if low is not None else f"{kind} <= {high}" if high is not None else kind
    return field(default=default, metadata={"doc": doc, "rule": rule, "low": low, "high": high})


class OptionError(ValueError):
    """An option a strategy does not have, or a value it does not take: ``name`` and ``problem``, one sentence."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"option {name} {problem}")
        self.name, self.problem = name, problem


@dataclass(frozen=True)
class Options:
    """A strategy's options (subclassed per strategy, one :func:`option` field each). Made from a mapping by
    :meth:`from_mapping` (a space file's ``sampler:``, :func:`tuner.strategies.make`'s keywords), checked on
    construction; :meth:`table` lists them."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            want = type(f.default)
            ok_type = isinstance(value, want) and not isinstance(value, bool) or want is float and _is_int(value)
            low, high = f.metadata["low"], f.metadata["high"]
            if not ok_type or (low is not None and value < low) or (high is not None and value > high):
                raise OptionError(f.name, f"must be {f.metadata['rule']}, got {value!r}")
            if want is float:
                object.__setattr__(self, f.name, float(value))

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_mapping(cls, given: dict, strategy: str = "") -> Options:
        """The options ``given`` names, the rest at their defaults. An unknown name or a value out of its rule:
        :class:`OptionError`, naming the option and what is allowed."""
        unknown = [k for k in given if k not in cls.names()]
        if unknown:
            allowed = ", ".join(cls.names()) or "none"
            raise OptionError(unknown[0], f"is not an option of strategy {strategy or '?'}; allowed: {allowed}")
        return cls(**given)

    @classmethod
    def table(cls) -> list[tuple[str, str, Any, str]]:
        """(name, rule, default, doc) of every option."""
        return [(f.name, f.metadata["rule"], f.default, f.metadata["doc"]) for f in dataclasses.fields(cls)]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class Strategy:
    """One search strategy. ``propose`` and ``stop_reason`` are called under the study's lock, each with the
    level and the history of the other levels (:class:`Measured` rows, never this level's own)."""

    name = ""
    options_type: type[Options] = Options  # its options (a subclass of :class:`Options`)
    model_seconds = 0.0  # time spent in propose and stop_reason by a model (the surrogate's; 0 for the others)

    def sampler(self, seed: int):
        """The Optuna sampler of the study (None: Optuna's default; every trial is enqueued anyway)."""
        return None

    def propose(self, level: Level, n: int, history: History) -> list[KernelConfig]:
        """Up to ``n`` distinct open candidates to measure next; [] when the strategy has nothing more."""
        raise NotImplementedError

    def stop_reason(self, level: Level, history: History) -> str | None:
        """Why the level is done, or None to go on."""
        if not level.open():
            return f"every one of the {len(level.candidates)} distinct feasible launches measured"
        return None
