"""What a study measures next: one module per search strategy, behind one small interface.

Every strategy searches the *candidates*, not the space: before any launch the tuner knows which configs
fit the target and which of them launch the same kernels on the same grid (:func:`tuner.study.launch_key`),
so a strategy only ever proposes a feasible launch that its level has not measured, and its budget counts
measurements. A study asks its strategy for proposals whenever Optuna's queue is empty and enqueues them
(:meth:`optuna.Study.enqueue_trial`), so storage, optuna-dashboard and workers on many GPUs and hosts see
an ordinary Optuna study; TPE instead proposes through Optuna's own sampler (``asks``).

- :mod:`tuner.strategies.grid`: every launch, in queue order.
- :mod:`tuner.strategies.tpe`: Optuna's TPE sampler, its proposals narrowed to the candidates.
- :mod:`tuner.strategies.surrogate` (the default): one Gaussian-process model over the parameters, the
  launch geometry and log C, fitted to every measurement of the space at every level (and to earlier
  records of the space as weighted priors); it proposes by expected improvement and stops a level when no
  unmeasured launch is likely to beat the best by more than the band.
"""

from __future__ import annotations

from sparse_mla_tuner.tuner.strategies.base import Level
from sparse_mla_tuner.tuner.strategies.base import Strategy

DEFAULT = "surrogate"
NAMES = ("grid", "tpe", "surrogate")

__all__ = ["DEFAULT", "NAMES", "Level", "Strategy", "make"]


def make(name: str, seed: int = 0, refit: str = "deterministic") -> Strategy:
    """The strategy called ``name`` (one of :data:`NAMES`). ``refit``: when the surrogate's re-optimized
    hyperparameters swap in (:mod:`tuner.strategies.hpo`): ``deterministic`` (the same seed makes the same
    search: a replay, the tests) or ``background`` (a search on a GPU, which then never waits for the model)."""
    if name == "grid":
        from sparse_mla_tuner.tuner.strategies.grid import Grid

        return Grid()
    if name == "tpe":
        from sparse_mla_tuner.tuner.strategies.tpe import Tpe

        return Tpe()
    if name == "surrogate":
        from sparse_mla_tuner.tuner.strategies.surrogate import Surrogate

        return Surrogate(seed=seed, refit=refit)
    raise ValueError(f"unknown search strategy {name!r}; allowed: {', '.join(NAMES)}")
