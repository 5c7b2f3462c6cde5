"""What a study measures next: the candidates of a level, what is measured, the strategy, and why a level stops.

:class:`Candidates` is one of a study's three parts (:mod:`tuner.study`): it turns the rows the study's records
hand it into a :class:`tuner.strategies.Level` (candidates in queue order, log ratios measured, launches
pending, each candidate's neighbours) and the measurements of the space at other levels into the strategy's
history, and it holds the rules that stop a level and promote a screened launch.
"""

from __future__ import annotations

import math

from ..db.verdicts import Verdict
from . import strategies

KernelConfig = object  # annotations: the adapter's config type
LAUNCHED = {Verdict.OK, Verdict.WRONG, Verdict.CRASHED, Verdict.TIMEOUT, Verdict.MISSING}  # measured, for the budget
EXPECTED_SHARE = 0.2  # a model strategy's share of a level's launches before any level finished (bench_search)
PROMOTE = 1 / 3  # successive halving's share of screened launches that get the rest of the screening rounds


class Candidates:
    """What a study measures next: the level's candidates in queue order, what it has measured (kept in memory,
    brought up to date from the recorded rows the study hands it), each candidate's neighbours, the strategy's
    history, and the rules that stop a level and promote a screened launch. It reads no database: every row it
    needs is passed in."""

    def __init__(self, plan, strategy: strategies.Strategy, n_trials: int | None, band: float) -> None:
        self.plan, self.strategy = plan, strategy
        self.rep = plan.representatives()  # every feasible config -> the config measured for its launch
        self.n_trials = n_trials  # --n-trials, else the space's (None: the strategy decides)
        self.band = band  # the level's noise band (set again when a GPU's band is known)
        self.prior: list[KernelConfig] = []  # measured first: --first, the previous kernel's best, untried values
        self.queue_order: list[KernelConfig] = []  # the candidates in measuring order
        self.neighbours: dict[KernelConfig, list[KernelConfig]] = {}
        self.history: list[strategies.Measured] = []  # other levels' measurements and the priors
        self.measured: dict[KernelConfig, tuple[KernelConfig, float | None]] = {}  # recorded -> (candidate, log ratio)
        self.more = False  # a finished level reopened by a larger --n-trials: measured up to it, no stop rule
        self.expected_share: float | None = None  # the share of launches measured at this search's finished levels

    # --- opening: values from the study's records -------------------------------------------------------------

    def open(self, first: list[KernelConfig], ranked: list[KernelConfig], done: set[KernelConfig], history) -> None:
        """The queue, the neighbours and the history, from ``first`` (``--first``), the previous kernel's
        configs best first (``ranked``), the configs this study recorded (``done``) and the strategy's history
        (:meth:`history_of`)."""
        self.prior = self._prior_picks(first, ranked, done)
        rep = self.rep
        head = [self.plan.space.baseline, *(rep[p] for p in self.prior if p in rep)]
        self.queue_order = list(dict.fromkeys(c for c in [*head, *self.plan.to_measure()] if c in rep))
        self.neighbours = self._make_neighbours()
        self.history = history

    def _prior_picks(self, first: list, ranked: list, done: set) -> list[KernelConfig]:
        """What is measured first: the user's ``--first`` configs, then the previous kernel's five best configs
        here, then those five with each parameter value the previous kernel never ran (see
        :func:`new_value_variants`); each only if this space holds it, it fits and it is not measured yet."""
        plan = self.plan
        best = ranked[:5]
        variants = new_value_variants(best, ranked, plan.space.parameters)
        return [
            c
            for c in dict.fromkeys([*first, *best, *variants])
            if c in plan.verdicts and plan.verdicts[c].feasible and c not in done
        ]

    def history_of(self, found, study_id: int, kernel_id: int, device: str) -> list[strategies.Measured]:
        """The strategy's history from the space's recorded trials (``found``): this kernel on this device at the
        levels before this one in the space's order (source None), and earlier records (source: kernel hash and
        device) as priors; never this study's own rows, nor this search's levels after this one (a resume)."""
        order = self.plan.space.concurrency
        here = order.index(self.plan.concurrency) if self.plan.concurrency in order else len(order)
        config_type = self.plan.space.adapter.config_type
        rows = []
        for t in found:
            if t.study_id == study_id or t.verdict not in LAUNCHED:
                continue
            own = t.kernel_id == kernel_id and t.gpu_name == device
            if own and not (t.concurrency in order and order.index(t.concurrency) < here):
                continue
            y = math.log(t.ratio) if t.verdict == Verdict.OK and t.ratio is not None else None
            if t.verdict == Verdict.MISSING or (not own and y is None):
                continue
            try:
                cfg = config_type(**t.params)
            except (ValueError, TypeError):  # recorded under another version of the declaration
                continue
            rows.append(strategies.Measured(t.concurrency, cfg, y, None if own else (t.kernel_id, t.gpu_name)))
        return rows

    def _make_neighbours(self) -> dict[KernelConfig, list[KernelConfig]]:
        """Each candidate's neighbours: the launches one step away in one parameter's values (a step that
        launches the same thing, such as a TARGET_CTAS that clamps alike, is walked past), and every value of
        a launch-only parameter (``TARGET_CTAS``: the split count whose best value moves with C) or of one whose
        values are modes rather than a scale (``PREFETCH``)."""
        rep, params = self.rep, self.plan.space.parameters
        adapter = self.plan.space.adapter
        launch_only = {p.name for p in adapter.params if not p.compiled}
        out = {}
        for cand in self.queue_order:
            near = []
            for name, values in params.items():
                if getattr(cand, name) not in values:
                    continue
                if name in launch_only or name in adapter.modes:
                    near += [o for v in values if (o := rep.get(cand.replace(**{name: v}))) not in (None, cand)]
                    continue
                i = values.index(getattr(cand, name))
                for step in (-1, 1):
                    j = i + step
                    while 0 <= j < len(values):
                        other = rep.get(cand.replace(**{name: values[j]}))
                        if other is not None and other != cand:
                            near.append(other)
                            break
                        if other is None:
                            break
                        j += step
            out[cand] = list(dict.fromkeys(near))
        return out

    # --- measuring --------------------------------------------------------------------------------------------

    def update(self, rows) -> None:
        """Take in recorded rows ``(config, verdict, ratio or None)``: every launch tried, whatever came of it (a
        duplicate is left out: its original stands for it)."""
        for cfg, verdict, ratio in rows:
            if cfg not in self.rep or verdict == Verdict.DUPLICATE:
                continue
            y = math.log(ratio) if verdict == Verdict.OK and ratio is not None else None
            self.measured[cfg] = (self.rep[cfg], y)

    def set_band(self, band: float) -> None:
        """The level's noise band, once a GPU's is known (the strategy's and the promotion rule's margin)."""
        self.band = band

    @property
    def n_measured(self) -> int:
        return len(self.measured)

    def level(self, pending_params) -> strategies.Level:
        """The level as the strategy sees it, with the parameters of the trials queued or running
        (``pending_params``)."""
        rep, config_type = self.rep, self.plan.space.adapter.config_type
        # in the order of the recorded configs as stored (their printed keys), as the study's unique index returns them
        measured = {cfg: y for _, (cfg, y) in sorted(self.measured.items(), key=lambda kv: str(kv[0]))}
        pending = {rep[c] for p in pending_params if (c := _config(config_type, p)) in rep}
        return strategies.Level(
            self.plan.concurrency,
            self.plan.workload,
            self.queue_order,
            measured,
            pending - set(measured),
            self.band,
            self.plan.space.baseline,
            self.neighbours,
            rep.get,
            tuple(self.plan.space.concurrency),  # the space's levels in search order
            self.plan.space.adapter,
        )

    def why_stop(self, level: strategies.Level, stopping: bool) -> str | None:
        """Why the level is done (``--n-trials`` reached, or the strategy's stop rule), or None."""
        n = self.n_trials
        if n and len(level.measured) >= n:
            return f"--n-trials {n} reached, {len(level.measured)} of {len(level.candidates)} launches measured"
        if stopping:
            return None
        if self.more:  # reopened by a larger --n-trials: measured up to it
            if len(level.measured) >= len(level.candidates):
                return f"every launch measured, {len(level.measured)} of {len(level.candidates)}"
            return None
        return self.strategy.stop_reason(level, self.history)

    def propose(self, level: strategies.Level) -> KernelConfig | None:
        """The next launch to measure (after :meth:`why_stop` said go on), or None."""
        proposals = self.strategy.propose(level, 1, self.history)
        return proposals[0] if proposals else None

    def not_a_candidate(self, cfg: KernelConfig, recorded) -> str | None:
        """Why a trial's config needs no launch here, or None (``recorded(cfg)``: whether this study recorded it)."""
        if not self.plan.space.satisfies(cfg) or cfg not in self.plan.verdicts:
            return "not a config of the space (its values or constraints exclude it)"
        if recorded(cfg):
            return "already recorded in this study"
        return None

    def promising(self, samples: list[tuple[float, float]]) -> bool:
        """Whether a launch's first screening rounds earn it the rest (asynchronous successive halving): its
        paired ratio ranks in the best :data:`PROMOTE` of the level's measured launches, itself included, or
        lies within twice the band of the best; every launch is promoted while fewer than 3 are measured."""
        ratio = math.exp(sum(math.log(a / b) for a, b in samples) / len(samples))
        seen = sorted(math.exp(y) for _, y in list(self.measured.values()) if y is not None)
        if len(seen) < 3:
            return True
        rank = sum(r < ratio for r in seen)  # launches measured better than this one
        return rank < math.ceil(PROMOTE * (len(seen) + 1)) or ratio <= seen[0] * (1 + 2 * self.band)

    def expected(self, done: int | None = None) -> int:
        """The launches this level is expected to measure, for the progress line's count and time left: the
        strategy's share of the candidates (``expected_share``, or the share measured at the levels this search
        finished, or :data:`EXPECTED_SHARE`; all of them for the grid), within ``--n-trials``; always more
        than ``done``, while candidates are left."""
        n = len(self.queue_order)
        share = getattr(self.strategy, "expected_share", None) or self.expected_share
        if share is None:
            share = 1.0 if self.strategy.name == "grid" else EXPECTED_SHARE
        want = math.ceil(share * n)
        if self.n_trials:
            want = min(want, self.n_trials)
        done = self.n_measured if done is None else done
        return min(n, max(want, done + 1))


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


def _config(config_type, params: dict) -> KernelConfig | None:
    """A trial's config (None for parameters this kernel does not take)."""
    try:
        return config_type.from_dict(params)
    except (ValueError, TypeError):
        return None
