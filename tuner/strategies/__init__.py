"""What a study measures next: one module per search strategy, behind one small interface.

Every strategy searches the *candidates*, not the space: before any launch the tuner knows which configs
fit the target and which of them launch the same kernels on the same grid (:func:`tuner.study.launch_key`),
so a strategy only ever proposes a feasible launch that its level has not measured, and its budget counts
measurements. A study asks its strategy for proposals whenever Optuna's queue is empty and enqueues them
(:meth:`optuna.Study.enqueue_trial`), so storage, optuna-dashboard and workers on many GPUs and hosts see
an ordinary Optuna study.

The interface (:mod:`tuner.strategies.base`): ``propose(level, n, history)`` and ``stop_reason(level, history)``,
where ``level`` is a :class:`Level` (the level's candidates and its own measurements) and ``history`` the
:class:`Measured` rows of the space's other levels and of earlier records (the priors). Each strategy's
settings are a frozen :class:`Options` table (``options_type``), set by :func:`make`'s keywords or a space
file's ``sampler:`` mapping and listed by ``tuner search --help`` (:func:`options_help`).

- :mod:`tuner.strategies.grid`: every launch, in queue order.
- :mod:`tuner.strategies.tpe`: Optuna's TPE sampler, one in-memory study per level, narrowed to the candidates.
- :mod:`tuner.strategies.surrogate` (the default): one Gaussian-process model over the parameters, the
  launch geometry and log C (:mod:`tuner.strategies.model`), fitted to every measurement of the space at every
  level (and to earlier records of the space as weighted priors); it proposes by expected improvement and
  stops a level when no unmeasured launch is likely to beat the best by more than the band.
"""

from __future__ import annotations

from .base import History
from .base import Level
from .base import Measured
from .base import OptionError
from .base import Options
from .base import Strategy

DEFAULT = "surrogate"
NAMES = ("grid", "tpe", "surrogate")

__all__ = [
    "DEFAULT",
    "NAMES",
    "History",
    "Level",
    "Measured",
    "OptionError",
    "Options",
    "Strategy",
    "make",
    "options_help",
    "options_type",
]


def options_type(name: str) -> type[Options]:
    """The options table of the strategy called ``name`` (one of :data:`NAMES`)."""
    if name == "grid":
        from .grid import GridOptions

        return GridOptions
    if name == "tpe":
        from .tpe import TpeOptions

        return TpeOptions
    if name == "surrogate":
        from .surrogate import SurrogateOptions

        return SurrogateOptions
    raise ValueError(f"unknown search strategy {name!r}; allowed: {', '.join(NAMES)}")


def make(name: str, seed: int = 0, refit: str = "deterministic", **options) -> Strategy:
    """The strategy called ``name`` (one of :data:`NAMES`) with ``options`` (its :func:`options_type`'s fields;
    an unknown one or a value out of its rule: :class:`OptionError`). ``refit``: when the surrogate's
    re-optimized hyperparameters swap in (:mod:`tuner.strategies.hpo`): ``deterministic`` (the same seed makes
    the same search: a replay, the tests) or ``background`` (a search on a GPU, which then never waits for the
    model)."""
    opts = options_type(name).from_mapping(options, name)
    if name == "grid":
        from .grid import Grid

        return Grid(opts)
    if name == "tpe":
        from .tpe import Tpe

        return Tpe(seed=seed, options=opts)
    from .surrogate import Surrogate

    return Surrogate(seed=seed, refit=refit, options=opts)


def options_help() -> str:
    """Every strategy's options as a short table (``tuner search --help``)."""
    lines = []
    for name in NAMES:
        table = options_type(name).table()
        if not table:
            lines.append(f"  {name}: no options")
            continue
        lines.append(f"  {name}:")
        width = max(len(f"{n} = {default!r}") for n, _, default, _ in table)
        lines += [f"    {f'{n} = {default!r}':<{width}}  {doc}" for n, _, default, doc in table]
    return "\n".join(lines)
