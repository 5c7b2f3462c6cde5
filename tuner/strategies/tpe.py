"""Optuna's TPE sampler over the level's parameter values, its proposals narrowed to the candidates.

Each level has an in-memory Optuna study of its own (:class:`optuna.storages.InMemoryStorage`, seeded by the
seed and the level), told every launch the level measured: a finished trial with its log ratio, or a pruned
one for a launch that failed (TPE ranks pruned trials below every finished one). Its parameters are
categorical over the values the level's candidates take. A proposal asks TPE for a suggestion until one
launches an open candidate (``max_asks`` times, then the first open candidate is taken): a suggestion
that launches a measured candidate is told that candidate's value, one that is no candidate (it does not fit
the target, or the space excludes it) is told pruned, so TPE learns from both without a launch. An accepted
suggestion stays running (TPE's constant liar: several workers get different proposals) until its launch is
measured. Only measurements count against the budget; the study's own Optuna study sees ordinary queued
trials, as with the other strategies.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import History
from .base import Level
from .base import Options
from .base import Strategy
from .base import option

KernelConfig = object  # annotations: the adapter's config type


@dataclass(frozen=True)
class TpeOptions(Options):
    """TPE's settings (see the module)."""

    max_asks: int = option(50, "suggestions per proposal before the first open candidate is taken instead", 1)
    n_startup: int = option(10, "measurements of a level before TPE models it (random suggestions until then)", 0)


class _LevelStudy:
    """One level's in-memory Optuna study and what it has been told."""

    def __init__(self, study, distributions: dict) -> None:
        self.study, self.distributions = study, distributions
        self.told: set = set()  # candidates whose measurement the study holds
        self.asked: dict = {}  # candidate -> the number of its running trial (an accepted suggestion)


class Tpe(Strategy):
    name = "tpe"
    options_type = TpeOptions

    def __init__(self, seed: int = 0, options: TpeOptions | None = None) -> None:
        self.seed = seed
        self.options = options or TpeOptions()
        self._levels: dict[int, _LevelStudy] = {}

    def propose(self, level: Level, n: int, history: History) -> list[KernelConfig]:
        import optuna

        open_ = level.open()
        if not open_:
            return []
        ls = self._study(level)
        self._tell_measured(ls, level)
        rep, config_type = level.lookup(), type(level.candidates[0])
        chosen: list = []
        for _ in range(min(n, len(open_))):
            pick = None
            for _ in range(self.options.max_asks):
                trial = ls.study.ask(ls.distributions)
                try:
                    cand = rep(config_type.from_dict(trial.params))
                except (TypeError, ValueError):  # values no config takes together
                    cand = None
                if cand is not None and cand in open_ and cand not in chosen:
                    pick = cand
                    if cand in ls.asked:  # suggested before and not measured yet: its first trial stands for it
                        ls.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                    else:
                        ls.asked[cand] = trial.number
                    break
                y = level.measured.get(cand) if cand is not None else None
                if y is not None:  # the launch of a measured candidate: its value, without a launch
                    ls.study.tell(trial, y)
                else:
                    ls.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            if pick is None:
                pick = next((c for c in open_ if c not in chosen), None)
            if pick is None:
                break
            chosen.append(pick)
        return chosen

    def _study(self, level: Level) -> _LevelStudy:
        """The level's study, made at its first proposal (seeded by the seed and the level)."""
        ls = self._levels.get(level.concurrency)
        if ls is None:
            import optuna

            values: dict[str, set] = {}
            for c in level.candidates:
                for k, v in c.as_dict().items():
                    values.setdefault(k, set()).add(v)
            dists = {k: optuna.distributions.CategoricalDistribution(sorted(v)) for k, v in values.items()}
            sampler = optuna.samplers.TPESampler(
                seed=(self.seed * 1_000_003 + level.concurrency) % 2**32,
                n_startup_trials=self.options.n_startup,
                constant_liar=True,
            )
            study = optuna.create_study(storage=optuna.storages.InMemoryStorage(), sampler=sampler)
            ls = self._levels[level.concurrency] = _LevelStudy(study, dists)
        return ls

    def _tell_measured(self, ls: _LevelStudy, level: Level) -> None:
        """Tell the study every launch measured since the last proposal (an accepted suggestion: its own trial)."""
        import optuna

        pruned = optuna.trial.TrialState.PRUNED
        for cfg, y in level.measured.items():
            if cfg in ls.told:
                continue
            ls.told.add(cfg)
            number = ls.asked.pop(cfg, None)
            if number is not None and y is not None:
                ls.study.tell(number, y)
                continue
            if number is not None:
                ls.study.tell(number, state=pruned)
                continue
            params = {k: v for k, v in cfg.as_dict().items() if k in ls.distributions}
            ls.study.add_trial(
                optuna.trial.create_trial(
                    params=params,
                    distributions=ls.distributions,
                    value=y,
                    state=optuna.trial.TrialState.COMPLETE if y is not None else pruned,
                )
            )
