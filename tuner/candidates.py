"""What a study's strategy sees: the candidates of a level, what is measured, and why a level stops.

:class:`LevelView` is the part of :class:`tuner.study.StudyRun` that turns the study's rows into a
:class:`tuner.strategies.Level` (candidates in queue order, log ratios measured, launches pending, each
candidate's neighbours) and the measurements of the space at other levels into the strategy's history.
"""

from __future__ import annotations

import math

import optuna

from sparse_mla_tuner.db import queries
from sparse_mla_tuner.db.verdicts import Verdict
from sparse_mla_tuner.tuner import strategies

WAITING, RUNNING = optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING
KernelConfig = object  # annotations: the adapter's config type
LAUNCHED = {Verdict.OK, Verdict.WRONG, Verdict.CRASHED, Verdict.TIMEOUT, Verdict.MISSING}  # measured, for the budget


def _known_config(config_type, key: str) -> KernelConfig | None:
    """A stored config key as this version's config; None when it names a parameter or value this version does
    not know (a record of an older or newer kernel): such a record cannot be a prior here."""
    try:
        return config_type.parse(key)
    except (TypeError, ValueError):
        return None


class LevelView:
    """Mixed into :class:`tuner.study.StudyRun` (which holds plan, store, study, opts and the ids)."""

    def _prior_picks(self, done: set[str]) -> list[KernelConfig]:
        """What is measured first: the user's ``--first`` configs, then the previous kernel's five best configs
        here, then those five with each parameter value the previous kernel never ran (see
        :func:`new_value_variants`); each only if this space holds it, it fits and it is not measured yet."""
        plan, info = self.plan, self.processes[0].info
        with self.store.session() as s:
            ranked = queries.prior_picks(
                s,
                self.kernel_id,
                plan.concurrency,
                n=None,
                space=plan.space.name,
                workload=plan.spec.name,
                device=info["gpu_name"],
                backend=self.opts.backend,
            )
        known = [
            c for c in (_known_config(self.plan.space.adapter.config_type, k) for k in ranked) if c is not None
        ]  # another version's parameter: skipped
        best = known[:5]
        variants = new_value_variants(best, known, plan.space.parameters)
        return [
            c
            for c in dict.fromkeys([*self.opts.first, *best, *variants])
            if c in plan.verdicts and plan.verdicts[c].feasible and str(c) not in done
        ]

    def _queue_order(self, prior: list[KernelConfig]) -> list[KernelConfig]:
        """The candidates in measuring order: the baseline, the launches of ``prior``, then the rest in space
        order (one config per distinct feasible launch)."""
        rep = self.plan.representatives()
        first = [self.plan.space.baseline, *(rep[str(p)] for p in prior if str(p) in rep)]
        return list(dict.fromkeys(c for c in [*first, *self.plan.to_measure()] if str(c) in rep))

    def _history(self) -> list[strategies.Measured]:
        """Every measurement of this space and workload at other levels: this kernel on this device (source
        None), and earlier records (source: kernel hash and device) as the strategy's priors."""
        device = self.processes[0].info["gpu_name"]
        order = self.plan.space.concurrency
        here = order.index(self.plan.concurrency) if self.plan.concurrency in order else len(order)
        rows = []
        config_type = self.plan.space.adapter.config_type
        with self.store.session() as s:
            found = queries.history(s, self.plan.space.name, self.plan.spec.name, self.opts.backend)
        for t in found:
            if t.study_id == self.study_id or t.verdict not in LAUNCHED:
                continue
            own = t.kernel_id == self.kernel_id and t.gpu_name == device
            if own and not (t.concurrency in order and order.index(t.concurrency) < here):
                continue  # this search's own levels after this one (a resume, another --concurrency run)
            y = math.log(t.ratio) if t.verdict == Verdict.OK and t.ratio is not None else None
            if t.verdict == Verdict.MISSING or (not own and y is None):
                continue
            try:
                cfg = config_type(**t.params)
            except (ValueError, TypeError):  # recorded under another version of the declaration
                continue
            rows.append(strategies.Measured(t.concurrency, cfg, y, None if own else (t.kernel_id, t.gpu_name)))
        return rows

    def _level(self) -> strategies.Level:
        """The level as the strategy sees it: candidates, what is measured (log ratios) and what is pending."""
        rep = self.plan.representatives()
        measured = self._refresh()
        pending = {
            rep[k]
            for t in self.study.get_trials(deepcopy=False, states=(WAITING, RUNNING))
            if (k := _key(self.plan.space.adapter.config_type, t.params)) in rep
        }
        self.n_measured = len(measured)
        return strategies.Level(
            self.plan.concurrency,
            self.plan.workload,
            self.queue_order,
            measured,
            pending - set(measured),
            self.band,
            self.plan.space.baseline,
            self._neighbours,
            lambda cfg: rep.get(str(cfg)),
            tuple(self.plan.space.concurrency),  # the space's levels in search order
            self.plan.space.adapter,
        )

    def _refresh(self) -> dict[KernelConfig, float | None]:
        """The level's measurements (log ratios, None for a launch that gave no ratio), kept in memory and
        brought up to date with what was recorded since the last look, by this process or another."""
        state = self.__dict__.setdefault("_state", {"measured": {}, "trial": 0, "stat": 0})
        rep = self.plan.representatives()
        with self.store.session() as s:
            rows = queries.done_since(s, self.study_id, state["trial"], state["stat"])
            for t in rows:  # every launch tried, whatever came of it (a duplicate: its original)
                state["trial"] = max(state["trial"], t.id)
                state["stat"] = max([state["stat"], *(st.id for st in t.statistics)])
                if t.config_key not in rep or t.verdict == Verdict.DUPLICATE:
                    continue
                st = t.statistic()
                y = math.log(st.ratio) if t.verdict == Verdict.OK and st is not None else None
                state["measured"][t.config_key] = (rep[t.config_key], y)
        # in the order of the recorded config keys, as the study's unique index on them returns its rows
        return {cfg: y for _, (cfg, y) in sorted(state["measured"].items())}

    def _make_neighbours(self) -> dict[KernelConfig, list[KernelConfig]]:
        """Each candidate's neighbours: the launches one step away in one parameter's values (a step that
        launches the same thing, such as a TARGET_CTAS that clamps alike, is walked past), and every value of
        a launch-only parameter (``TARGET_CTAS``: the split count whose best value moves with C) or of one whose
        values are modes rather than a scale (``PREFETCH``)."""
        rep, params = self.plan.representatives(), self.plan.space.parameters
        adapter = self.plan.space.adapter
        launch_only = {p.name for p in adapter.params if not p.compiled}
        out = {}
        for cand in self.queue_order:
            near = []
            for name, values in params.items():
                if getattr(cand, name) not in values:
                    continue
                if name in launch_only or name in adapter.modes:
                    near += [o for v in values if (o := rep.get(str(cand.replace(**{name: v})))) not in (None, cand)]
                    continue
                i = values.index(getattr(cand, name))
                for step in (-1, 1):
                    j = i + step
                    while 0 <= j < len(values):
                        other = rep.get(str(cand.replace(**{name: values[j]})))
                        if other is not None and other != cand:
                            near.append(other)
                            break
                        if other is None:
                            break
                        j += step
            out[cand] = list(dict.fromkeys(near))
        return out

    def _why_stop(self, level: strategies.Level) -> str | None:
        n = self.opts.n_trials or self.plan.space.sampler.get("n_trials")
        if n and len(level.measured) >= n:
            return f"--n-trials {n} reached, {len(level.measured)} of {len(level.candidates)} launches measured"
        if self.stop.requested:
            return None
        if self.more:  # reopened by a larger --n-trials: measured up to it
            if len(level.measured) >= len(level.candidates):
                return f"every launch measured, {len(level.measured)} of {len(level.candidates)}"
            return None
        return self.strategy.stop_reason(level, self.history)

    def _done_keys(self) -> set[str]:
        with self.store.session() as s:
            return set(queries.done_keys(s, self.study_id))

    def _not_a_candidate(self, cfg: KernelConfig) -> str | None:
        if not self.plan.space.satisfies(cfg) or cfg not in self.plan.verdicts:
            return "not a config of the space (its values or constraints exclude it)"
        with self.store.session() as s:
            if str(cfg) in queries.done_keys(s, self.study_id):
                return "already recorded in this study"
        return None


def new_value_variants(
    best: list[KernelConfig], measured: list[KernelConfig], parameters: dict[str, list]
) -> list[KernelConfig]:
    """``best`` with each parameter value that no config in ``measured`` has, best config first.

    A changed kernel often brings a new lever or a new value of one (kernel v5's ``PREFETCH=2``). The
    previous kernel's best configs are where the new value is most likely to win, and a bounded sampler
    may not try it there: on the H200, 20 TPE trials per level missed ``PREFETCH=2`` variants worth 10 %
    at V3.2 C=64..96. The caller keeps only what the space holds and what fits.
    """
    if not measured:  # no previous kernel: nothing is new
        return []
    new = {
        name: [v for v in values if v not in {getattr(c, name) for c in measured}]
        for name, values in parameters.items()
    }
    return list(dict.fromkeys(cfg.replace(**{name: v}) for cfg in best for name, vs in new.items() for v in vs))


def _key(config_type, params: dict) -> str:
    """A trial's printed config key ("" for parameters this kernel does not take)."""
    try:
        return str(config_type.from_dict(params))
    except (ValueError, TypeError):
        return ""
