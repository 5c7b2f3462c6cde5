"""The default strategy: one Gaussian-process model of the whole space, across concurrency levels.

The model (training set, fits, posterior, hyperparameters) is :class:`tuner.strategies.model.Model`; what to
measure next and when a level stops is :class:`Surrogate`'s; the settings of both are :class:`SurrogateOptions`
(the space file's ``sampler:`` mapping sets them; ``tuner search --help`` lists them).

**The model.** scikit-learn's :class:`~sklearn.gaussian_process.GaussianProcessRegressor` predicts a
launch's log ratio to the baseline from its parameters, the split geometry it launches at that level
(programs, slots, tiles per program: what ``TARGET_CTAS`` and ``BALANCED`` turn into at that batch) and
``log2 C``. Its kernel is a sum of two Matérn 5/2 kernels with one length scale per feature, plus white
noise: a *shared* one that does not see ``log2 C`` (what a launch's parameters and geometry cost at every
level: a slow tile shape is slow everywhere) and a *level* one that does (how a level departs from that).
With one kernel over all features the fitted ``log2 C`` length scale sat near 0.2, so each level forgot
the others and re-measured launches they had already shown to be slow. It is fitted to
every measurement of the space at every level this kernel has on this device (levels are searched in
order, so the second level starts from what the first taught), and to earlier records of the space as
priors: other kernels, and this kernel on other devices. A prior's points enter with more noise the
worse they predict this kernel's own measurements (Spearman's rho over the launches both measured, at
the same levels); a failed launch (crashed, wrong, timed out) enters as the worst value seen.

**Hyperparameters** (length scales, amplitudes, noise) are re-optimized when a level starts, each time its own
measurements grew ``refit_here``-fold, and when the training set grew ``refit_growth``-fold; between those the
last optimum is reused. The white noise is floored (:data:`tuner.strategies.model.NOISE_MIN`). An optimization
takes seconds and a fit with fixed hyperparameters milliseconds, so the optimizations run off the proposal
path (:mod:`tuner.strategies.hpo`): in a worker process, on at most ``hpo_max`` of the training points (this
level's first, then a seeded sample of the others), warm-started from the last optimum, while the proposals go
on with the last hyperparameters; the new ones swap in when ready (``background``, a search on a GPU) or
``hpo_lag`` measurements later (``deterministic``, a replay: the same seed makes the same search).
:attr:`Surrogate.model_seconds` is the time the search spent in the strategy (proposals, the stop rule and any
wait for an optimization); :attr:`Surrogate.hpo_seconds` the optimizations' own time.

**Proposals.** In order: the previous level's best launches (and its ``carry_lines`` best tile shapes'
best launches at every split target), the incumbent's neighbours, the lines of
the best tile shapes, then expected improvement over the open candidates of the level (feasible,
distinct, not yet measured). Several workers get several launches at once, by the *kriging believer*: each proposal and
each trial still running is added to the model at its predicted value before the next is chosen, so the
proposals spread out instead of repeating. A level with no data from any level starts from
``n_init`` candidates drawn at random (seeded) among the open ones.

**The floor and the probes.** Whatever the model says, a level does not stop while a tile shape that was within
``floor_within`` (per doubling of C) of the best at the level before has no launch measured here
(:meth:`Surrogate.floor`), nor, with ``probe``, while a tile shape has not been measured as the level's best launch
is, with its shape swapped (:func:`probes`; with ``probe_deals``, where the best launch is balanced, as the best
launch of each other deal within ``line_within`` is, too: :func:`deal_bests`): a model that saw none of a shape's
good launches at a level is sure of what it has not seen (docs/search.md, "The floor under the stop rule"). The lines
(:meth:`Surrogate.lines`) take each close shape's best launch in every pipelining mode (``line_modes``) as well.

**The stop rule.** After at least ``min_here`` measurements at the level, once the previous level's
best, every earlier level's best (``earlier_bests``), the incumbent's neighbours, the floor, the probes and the
lines (:meth:`Surrogate.lines`) are measured, it stops when
``P(an unmeasured launch beats the best by > band) < stop_p``: each open candidate's posterior
probability of a log ratio below ``log(best) + log(1 - band)``, summed (the union bound: no independence
assumed). With launches running on other GPUs, P is asked of the model with them believed at their predicted
values: a level whose open launches cannot win even so proposes nothing more, and stops once those are measured.
``stop_p`` = 5 % is the threshold the search benchmark (``benchmarks/bench_search.py``) was
run with; ``--n-trials`` stays a hard cap.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy.special import ndtr

from ..stats import win_edge
from .base import History
from .base import Level
from .base import Options
from .base import Strategy
from .base import option
from .model import Model

if TYPE_CHECKING:
    from ..adapter import KernelAdapter

KernelConfig = object  # annotations: the adapter's config type


@dataclass(frozen=True)
class SurrogateOptions(Options):
    """The surrogate's settings (see the module); the defaults are what the search benchmark was run with."""

    stop_p: float = option(0.05, "stop a level when P(an open launch beats the best by > band) is below this", 0, 1)
    n_init: int = option(6, "random first picks when the model has no data at all", 1)
    min_here: int = option(8, "measurements at a level before it may stop (the baseline and the queued count)", 0)
    max_train: int = option(250, "points the model is fitted to: this level's, then the nearest levels' (|log C|)", 1)
    refit_here: int = option(2, "re-optimize the hyperparameters when the level's own measurements grew this-fold", 1)
    refit_growth: float = option(1.5, "... and when the training set grew this-fold (and at each level)", 1)
    hpo_max: int = option(100, "training points an optimization sees: this level's, then a seeded sample", 1)
    hpo_restarts: int = option(1, "random starts besides the start point at a level's first optimization", 0)
    hpo_maxiter: int = option(100, "L-BFGS-B iterations per start", 1)
    noise_max: float = option(
        0.01, "the white noise's largest level (normalized units): a fit may not call the data noise", 1e-3, 1
    )
    hpo_lag: int = option(2, "deterministic refits: an optimization swaps in this many measurements later", 0)
    carry: int = option(3, "the previous level's best launches measured first at each level", 0)
    carry_lines: int = option(2, "... and its best tile shapes' best launches at every split target", 0)
    lines: int = option(3, "the best tile shapes whose best launch is tried at every split target before a stop", 0)
    line_within: float = option(0.10, "... among those within this share of the level's best", 0)
    line_modes: int = option(
        1, "1: ... and their best launch in every pipelining mode (num_stages, PREFETCH) at its split and deal", 0, 1
    )
    mode_p: float = option(
        0.0, "... but of no mode the model gives a chance below this of beating the best by > band", 0, 1
    )
    floor_within: float = option(
        0.10,
        "no stop while a tile shape within this share (per doubling of C) of the best at the level before is "
        "unmeasured here",
        0,
    )
    floor_growth: float = option(1.0, "... the margin grows as (doublings of C between the levels) ** this", 0)
    probe: int = option(
        1, "1: before a stop, every tile shape measured as the best launch is, with its shape swapped", 0, 1
    )
    probe_deals: int = option(
        2,
        "1: ... and so is the best launch of each other deal (geometry) within line_within of the best; 2: only "
        "where the best launch's deal is not the default one",
        0,
        2,
    )
    probe_within: float = option(
        100.0, "... but of no shape beyond this share (per doubling of C) of the best at the level before", 0
    )
    earlier_bests: int = option(
        1, "1: before a stop, the best launch of every level searched before, as launched here", 0, 1
    )


class Surrogate(Strategy):
    name = "surrogate"
    options_type = SurrogateOptions

    def __init__(self, seed: int = 0, refit: str = "deterministic", options: SurrogateOptions | None = None) -> None:
        """``refit``: when re-optimized hyperparameters swap in (:data:`tuner.strategies.hpo.MODES`)."""
        self.seed = seed
        self.options = options or SurrogateOptions()
        self.model = Model(self.options, seed, refit)
        self.last_p: float | None = None  # the stop rule's last probability
        self.model_seconds = 0.0  # time spent in propose and stop_reason (the proposal path), waits included
        self._ranked = None  # (history, its length and the level, carried()'s ranked launches there)
        self._bests = None  # (history, its length and the level, earlier_bests()'s configs)
        self._modes = None  # (the level, its candidates grouped by all but their pipelining mode)

    @property
    def refitter(self):
        """The model's hyperparameter optimizations (:class:`tuner.strategies.hpo.Refitter`)."""
        return self.model.refitter

    @property
    def hpo_seconds(self) -> float:
        """The hyperparameter optimizations' own time (off the proposal path unless ``refit="inline"``)."""
        return self.model.refitter.seconds

    def close(self) -> None:
        """Stop the optimization worker (a later optimization starts a new one)."""
        self.model.close()

    # --- what comes before the model -----------------------------------------------------------

    def carried(self, level: Level, history: History) -> list[KernelConfig]:
        """The best ``carry`` launches of the nearest level searched before this one (in the space's order:
        never a later one, such as the next level on a resume), as launched here, then the best launch there of
        each of its ``carry_lines`` best tile shapes, at every split target here."""
        ranked = self._ranked_before(level, history)
        if not ranked:
            return []
        rep = level.lookup()
        out = []
        for _, cfg in ranked:
            cand = rep(cfg)
            if cand is not None and cand not in out:
                out.append(cand)
            if len(out) == self.options.carry:
                break
        for cfg in best_shapes(
            [(c, y) for y, c in ranked], self.options.carry_lines, level.adapter.family, self.options.line_within
        ):
            if (cand := rep(cfg)) is not None:
                out += [cand, *_split_line(level, cand)]
        return list(dict.fromkeys(out))

    def _ranked_before(self, level: Level, history: History) -> list[tuple[float, KernelConfig]]:
        """``(y, config)`` of this kernel's launches at the nearest level searched before ``level``, best first
        (ties by the config's key); kept while ``history`` is the same sequence at the same length (as
        :meth:`tuner.strategies.model.Model.sync` takes it), so the priors are not walked at every call."""
        key = (len(history), level.concurrency, tuple(getattr(level, "order", ()) or ()))
        if self._ranked is not None and self._ranked[0] is history and self._ranked[1] == key:
            return self._ranked[2]
        self._ranked = (history, key, ranked_before(level, history))
        return self._ranked[2]

    def earlier_bests(self, level: Level, history: History) -> list[KernelConfig]:
        """With ``earlier_bests``, :func:`level_bests` as launched here, where open (the walk kept as carried's)."""
        if not self.options.earlier_bests:
            return []
        key = (len(history), level.concurrency, tuple(getattr(level, "order", ()) or ()))
        if self._bests is None or self._bests[0] is not history or self._bests[1] != key:
            self._bests = (history, key, level_bests(level, history))
        here = dict.fromkeys(map(level.lookup(), self._bests[2]))  # one lookup map, not one per config
        return [c for c in here if c is not None and c not in level.measured and c not in level.pending]

    def floor(self, level: Level, history: History) -> list[KernelConfig]:
        """The floor under the stop rule: one launch here of each tile shape (the adapter's ``family``) whose best
        launch at the nearest level searched before this one was within the floor's margin of that level's best,
        and which has no measurement here yet. The margin is ``floor_within`` per doubling of C between the two
        levels (at least one doubling's; ``floor_growth`` 0: the same at any distance): the further the level, the
        less its ranking says here. The launch is the shape's open candidate the model predicts best here, or,
        before the model has data, the shape's best launch there as launched here. A landscape turns between
        levels (on the H200, V4's ``BLOCK_T=64 x num_warps=8`` was 7.5 % behind at C=4 and 9 % ahead at C=8), and a
        model that saw none of a shape's launches at a level cannot say so."""
        if self.options.floor_within <= 0:
            return []
        best = (
            shapes_within(
                level,
                history,
                self._ranked_before(level, history),
                self.options.floor_within,
                self.options.floor_growth,
            )
            or {}
        )
        family = level.adapter.family
        shape = lambda c: tuple(getattr(c, p) for p in family)  # noqa: E731
        here = {shape(c) for c in level.measured} | {shape(c) for c in level.pending}
        todo = {f: cfg for f, cfg in best.items() if f not in here}
        if not todo:
            return []
        return _floor_picks(self.model, level, todo, shape)

    def _probes(self, level: Level, history: History) -> list[KernelConfig]:
        """:func:`probes`, but of no shape whose best at the level before was beyond ``probe_within`` of its best;
        with ``probe_deals``, of :func:`deal_bests` too (2: only where the best launch is not in the default deal)."""
        if not self.options.probe:
            return []
        ranked, growth = self._ranked_before(level, history), self.options.floor_growth
        close = shapes_within(level, history, ranked, self.options.probe_within, growth) or {}
        skip = set(shapes_within(level, history, ranked, math.inf, growth) or {}) - set(close)  # far behind
        sources = deal_bests(level, self.options.line_within) if self.options.probe_deals else None
        if self.options.probe_deals == 2 and (best := level.best()) is not None:
            default = {p.name: p.default for p in level.adapter.params}
            if all(getattr(best[0], g) == default[g] for g in getattr(level.adapter, "geometry", ())):
                sources = None
        return probes(level, skip, sources)

    def lines(self, level: Level) -> list[KernelConfig]:
        """The split-target line of the best launch of each of the ``lines`` best tile shapes measured here
        (the adapter's `family`) whose best is within ``line_within`` of the level's: the best ``TARGET_CTAS``
        moves with C and is sharp (one wave more or less), so a shape is judged at its best split count, not
        at the one it happened to be measured with. With ``line_modes``, that launch in every other pipelining mode
        too (:meth:`_mode_variants`): a stage count is no scale to climb (older V3.2 grid, C=16: ``T32-w4-s1-c256``
        leads, ``-s4`` is 10 % behind, ``-s2`` 15 %). With ``mode_p``, only the modes the model gives a chance of at
        least that of beating the best by more than the band (off by default: docs/search.md, "The cost of the
        mode lines")."""
        shapes = best_shapes(level.measured.items(), self.options.lines, level.adapter.family, self.options.line_within)
        out = [c for b in shapes for c in _split_line(level, b)]
        if self.options.line_modes:
            modes = [c for b in shapes for c in self._mode_variants(level, b)]
            modes = [c for c in modes if c not in level.measured and c not in level.pending]
            out += _likely(self.model, level, modes, self.options.mode_p) if self.options.mode_p > 0 else modes
        return [c for c in dict.fromkeys(out) if c not in level.measured and c not in level.pending]

    def _mode_variants(self, level: Level, cfg: KernelConfig) -> list[KernelConfig]:
        """``cfg``'s launches in every other pipelining mode: the candidates that differ from it only in compiled
        parameters that are neither its tile shape (``family``) nor its deal (``geometry``), such as
        ``num_stages`` and ``PREFETCH``, whichever jointly the space allows."""
        key = (id(level), len(level.candidates))
        if self._modes is None or self._modes[0] != key:
            self._modes = (key, _by_mode_class(level))
        fixed = _mode_fixed(level.adapter)
        mine = self._modes[1].get(tuple(getattr(cfg, p) for p in fixed), [])
        return [c for c in mine if c != cfg]

    # --- the strategy --------------------------------------------------------------------------

    def propose(self, level: Level, n: int, history: History) -> list[KernelConfig]:
        t0 = time.perf_counter()
        try:
            with _one_blas_thread():
                self.model.sync(level, history)
                return self._propose(level, n, history)
        finally:
            self.model_seconds += time.perf_counter() - t0

    def _propose(self, level: Level, n: int, history: History) -> list[KernelConfig]:
        open_ = level.open()
        if not open_:
            return []
        is_open = set(open_)  # membership by hash: a list's is one comparison per open launch
        first = dict.fromkeys(
            [*self.carried(level, history), *self.floor(level, history), *self.earlier_bests(level, history)]
        )
        chosen = [c for c in first if c in is_open][:n]
        if len(chosen) == n:
            return chosen
        fitted = self.model.fitted(level)
        if fitted is None:
            rest = [c for c in open_ if c not in chosen]
            k = min(n - len(chosen), len(rest))
            rng = np.random.default_rng([self.seed, level.concurrency, len(level.measured)])  # same on a resume
            return chosen + [rest[i] for i in sorted(rng.choice(len(rest), size=k, replace=False))]
        f, scale = fitted
        best = level.best()
        here_best = best[1] if best is not None else 0.0
        pool = (
            [c for c in incumbent_neighbours(level) if c in is_open]
            or self.lines(level)
            or [c for c in self._probes(level, history) if c in is_open]
            or open_
        )
        believed = [*level.pending, *chosen]
        while len(chosen) < n:
            pool = [c for c in pool if c not in chosen] or [c for c in open_ if c not in chosen]
            if not pool:
                break
            if believed:  # kriging believer: pending and chosen launches at their predicted values
                mu, sd = self.model.posterior(self.model.believe(f, level, believed), self.model.X(pool, level))
            else:
                mu, sd = self.model.open_posterior(f, level, pool)
            ei = _expected_improvement(mu, sd * scale, here_best)
            pick = pool[int(np.argmax(ei))]
            chosen.append(pick)
            believed.append(pick)
        return chosen

    def stop_reason(self, level: Level, history: History) -> str | None:
        t0 = time.perf_counter()
        try:
            with _one_blas_thread():
                self.model.sync(level, history)
                return self._stop_reason(level, history)
        finally:
            self.model_seconds += time.perf_counter() - t0

    def _stop_reason(self, level: Level, history: History) -> str | None:
        open_ = level.open()
        if not open_ and not level.pending:
            return f"every one of the {len(level.candidates)} distinct feasible launches measured"
        here = sum(1 for y in level.measured.values() if y is not None)
        best = level.best()
        if best is None or here < min(self.options.min_here, len(level.candidates)) or not open_:
            return None
        is_open = set(open_)
        if [c for c in self.carried(level, history) if c in is_open] or incumbent_neighbours(level):
            return None  # the previous level's best and the incumbent's neighbours come first
        if self.floor(level, history) or self._probes(level, history):
            return None  # every tile shape close to the best at the level before is measured here, and every shape
            # as the best launch is
        if [c for c in self.earlier_bests(level, history) if c in is_open]:
            return None  # and every earlier level's best
        if self.lines(level):
            return None  # and the best tile shapes at every split target
        fitted = self.model.fitted(level)
        if fitted is None:
            return None
        f, scale = fitted
        if level.pending:  # other workers' launches at their predicted values (the kriging believer): a level whose
            # open launches cannot win even so proposes nothing more, and stops once those are measured
            mu, sd = self.model.posterior(
                self.model.believe(f, level, sorted(level.pending, key=str)), self.model.X(open_, level)
            )
        else:
            mu, sd = self.model.open_posterior(f, level, open_)
        target = best[1] + win_edge(level.band)
        p_each = ndtr((target - mu) / (sd * scale))
        p = float(min(1.0, p_each.sum()))  # the union bound: no independence assumed
        self.last_p = p
        if p < self.options.stop_p:
            return (
                f"P(an unmeasured launch beats the best by > band) = {p:.1%} < {self.options.stop_p:.0%}, "
                f"{len(level.measured)} of {len(level.candidates)} launches measured"
            )
        return None


_BLAS = None


def _one_blas_thread():
    """The model's matrices are small (at most ``max_train`` rows): one BLAS thread factors them in well
    under a millisecond, where several threads contending with the search's own took 0.1 s on 2 loaded cores."""
    global _BLAS
    if _BLAS is None:
        from threadpoolctl import ThreadpoolController

        _BLAS = ThreadpoolController()
    return _BLAS.limit(limits=1, user_api="blas")


def _before(level: Level):
    """Whether a level was searched before ``level``: earlier in the space's order (``level.order``), or, where
    the order is not given, a smaller concurrency (every shipped space lists its levels in ascending order)."""
    order = list(getattr(level, "order", ()) or ())
    if level.concurrency in order:
        earlier = set(order[: order.index(level.concurrency)])
        return lambda c: c in earlier
    return lambda c: c < level.concurrency


def ranked_before(level: Level, history: History) -> list[tuple[float, KernelConfig]]:
    """``(y, config)`` of this kernel's launches at the nearest level searched before ``level``, best first (ties by
    the config's key)."""
    before = _before(level)
    own = [
        (m.concurrency, m.config, m.y)
        for m in history
        if m.source is None and m.y is not None and before(m.concurrency)
    ]
    if not own:
        return []
    logc = math.log2(level.concurrency)
    nearest = min({c for c, _, _ in own}, key=lambda c: abs(math.log2(c) - logc))
    return [(y, cfg) for y, _, cfg in sorted((y, str(cfg), cfg) for c, cfg, y in own if c == nearest)]


def shapes_within(level: Level, history: History, ranked: list, within: float, growth: float) -> dict | None:
    """Tile shape -> its best launch in ``ranked`` (:func:`ranked_before`), for the shapes within ``within`` per
    doubling of C between the levels (``** growth``, at least one doubling's) of that level's best; None without
    such a level."""
    if not ranked:
        return None
    before = _nearest_before(level, history)
    doublings = abs(math.log2(level.concurrency / before)) if before else 1.0
    edge = ranked[0][0] + math.log(1.0 + within * max(1.0, doublings) ** growth)
    family = level.adapter.family
    best: dict = {}
    for y, cfg in ranked:  # best first: the first of each shape is its best
        if y <= edge:
            best.setdefault(tuple(getattr(cfg, p) for p in family), cfg)
    return best


def _floor_picks(model, level: Level, todo: dict, shape) -> list[KernelConfig]:
    """The floor's launch of each tile shape of ``todo`` (shape -> its best launch at the level before): the shape's
    open candidate the model predicts best here, or, before the model has data, that launch as launched here."""
    open_, fitted, rep = level.open(), model.fitted(level), level.lookup()
    out = []
    for f, cfg in todo.items():
        mine = [c for c in open_ if shape(c) == f]
        if not mine:
            continue
        if fitted is not None:
            mu, _ = model.posterior(fitted[0], model.X(mine, level))
            out.append(mine[int(np.argmin(mu))])
        else:
            cand = rep(cfg)
            out.append(cand if cand in mine else mine[0])
    return out


def _likely(model, level: Level, modes: list[KernelConfig], p_min: float) -> list[KernelConfig]:
    """The launches of ``modes`` the model gives a chance of at least ``p_min`` of beating the level's best by more
    than the band (all of them before the model has data)."""
    if not modes or (fitted := model.fitted(level)) is None:
        return modes
    f, scale = fitted
    mu, sd = model.posterior(f, model.X(modes, level))
    p = ndtr((level.best()[1] + win_edge(level.band) - mu) / (sd * scale))
    return [c for c, q in zip(modes, p, strict=True) if q >= p_min]


def best_shapes(pairs, n: int, family: tuple[str, ...], within: float) -> list[KernelConfig]:
    """The best launch of each of the ``n`` best tile shapes (``family``: the adapter's parameters of a shape)
    among ``(config, log ratio)`` pairs, best first, of those within ``within`` of the best."""
    best: dict = {}
    for c, y in pairs:
        f = tuple(getattr(c, p) for p in family)
        if y is not None and (f not in best or y < best[f][0]):
            best[f] = (y, c)
    ranked = sorted(best.values(), key=lambda t: t[0])[:n]
    return [c for y, c in ranked if y <= ranked[0][0] + math.log(1.0 + within)]


def incumbent_neighbours(level: Level) -> list[KernelConfig]:
    """The neighbours of the level's best launch that are neither measured nor running."""
    best = level.best()
    if best is None:
        return []
    return [c for c in level.neighbours.get(best[0], []) if c not in level.measured and c not in level.pending]


def level_bests(level: Level, history: History) -> list[KernelConfig]:
    """The best launch (lowest measured log ratio; ties by key) of each level searched before ``level``, from this
    kernel's own measurements, in order of concurrency. A launch that won somewhere is cheap to check at every level
    after, and a landscape that turns back can bring it back: on V3.2's current grids (H200) ``T32-w4-s1-c256-p3``
    was the best at C=16-40, 64 and 88, and a search that had last measured it at C=64 picked a launch 2.2 % behind
    it at C=88."""
    before = _before(level)
    per: dict[int, tuple] = {}
    for m in history:
        if m.source is None and m.y is not None and before(m.concurrency):
            cur = per.get(m.concurrency)
            if cur is None or (m.y, str(m.config)) < (cur[0], str(cur[1])):
                per[m.concurrency] = (m.y, m.config)
    return [cfg for _, (_, cfg) in sorted(per.items())]


def probes(level: Level, skip: set | None = None, sources: list | None = None) -> list[KernelConfig]:
    """The level's best launch with its tile shape (the adapter's ``family``) swapped for each
    other shape the level's candidates hold, where that launch is a candidate not yet measured. A shape is
    judged at the split count and options that win here, not at whichever it happened to be tried with: on
    V3.2 at C=48 (kernel 32ae50587d54) ``T16-w2-s1-c512-p1`` is 7 % ahead of every other launch, while the
    same shape at ``TARGET_CTAS=128`` was 181 % behind and ended the shape's trial there. Where the swapped
    launch is no candidate (it does not fit), the shape's candidate nearest to it stands in (fewest other
    parameters changed; the first in queue order among equals): on V4 at C=8 (kernel be009e1b9a4c) the best
    launch was ``T32-w4-s1-c128-p2``, ``BLOCK_T=64 x num_warps=8`` does not fit with ``PREFETCH=2``, and its
    ``-p3`` launch is 11 % ahead. ``sources``: the launches probed so (default: the level's best)."""
    best = level.best()
    if best is None:
        return []
    out = []
    for source in sources or [best[0]]:
        out += _probes_of(level, source, skip)
    return list(dict.fromkeys(out))


def deal_bests(level: Level, within: float) -> list[KernelConfig]:
    """The level's best launch, then the best launch of each other deal (the adapter's ``geometry`` values) within
    ``within`` of it. A shape swapped into the best launch is judged in that launch's deal, at that deal's best
    split count; in the other deal its best split count is another (V3.2 at C=48, kernel 32ae50587d54: the best
    launch measured was ``T32-w4-s1-c256-p3-b1``, ``T16-w2`` as launched so is 105 % behind, while
    ``T32-w4-s1-c512-p3``, 1 % behind it, puts that shape at 14 % behind, one pipelining mode from the needle)."""
    best = level.best()
    if best is None:
        return []
    geometry = getattr(level.adapter, "geometry", ())
    edge = best[1] + math.log(1.0 + within)
    per: dict = {}
    for c, y in level.measured.items():
        g = tuple(getattr(c, p) for p in geometry)
        if y is not None and y <= edge and (g not in per or y < per[g][1]):
            per[g] = (c, y)
    return [best[0], *(c for c, _ in per.values() if c != best[0])]


def _probes_of(level: Level, source: KernelConfig, skip: set | None) -> list[KernelConfig]:
    """:func:`probes` of one launch."""
    family = level.adapter.family
    by_shape: dict = {}
    for c in level.candidates:
        by_shape.setdefault(tuple(getattr(c, p) for p in family), []).append(c)
    rep = level.lookup()
    others = [p for p in level.adapter.param_names if p not in family]
    out = []
    for f, mine in by_shape.items():
        if skip and f in skip:  # ``skip``: shapes left out
            continue
        try:
            cand = rep(source.replace(**dict(zip(family, f, strict=True))))
        except (ValueError, TypeError):
            cand = None
        if cand is None:  # the nearest of the shape's candidates
            cand = min(mine, key=lambda c: sum(getattr(c, p) != getattr(source, p) for p in others))
        if cand not in level.measured and cand not in level.pending:
            out.append(cand)
    return list(dict.fromkeys(out))


def _nearest_before(level: Level, history: History) -> int | None:
    """The concurrency of the nearest level searched before ``level`` with this kernel's measurements."""
    before = _before(level)
    levels = {m.concurrency for m in history if m.source is None and m.y is not None and before(m.concurrency)}
    if not levels:
        return None
    logc = math.log2(level.concurrency)
    return min(levels, key=lambda c: abs(math.log2(c) - logc))


def _split_line(level: Level, cfg: KernelConfig) -> list[KernelConfig]:
    """``cfg``'s launches at the other split targets (``TARGET_CTAS`` and the like: the same binary), and those of
    each of its variants in a parameter that changes how the work is dealt (the adapter's ``geometry``: the
    balanced deal), at every split target too: the best split count of one deal is not the other's (V3.2 C=56 on
    the current kernel's grids: ``T32-w4-s1-c512-p3`` 2.3 % behind ``T32-w4-s1-c256-p3-b1``)."""
    near = level.neighbours.get(cfg, [])
    line = [c for c in near if _launch_only_variant(level.adapter, c, cfg)]
    geometry = set(getattr(level.adapter, "geometry", ()))
    for g in near if geometry else ():
        if _launch_only_variant(level.adapter, g, cfg, free=geometry) and g not in line:
            line += [g, *(c for c in level.neighbours.get(g, []) if _launch_only_variant(level.adapter, c, g))]
    return [c for c in dict.fromkeys(line) if c != cfg]


def _mode_fixed(adapter: KernelAdapter) -> tuple[str, ...]:
    """The parameters a pipelining mode leaves alone: the tile shape, the deal and the launch-only ones."""
    keep = set(adapter.family) | set(getattr(adapter, "geometry", ()))
    return tuple(p.name for p in adapter.params if not p.compiled or p.name in keep)


def _by_mode_class(level: Level) -> dict:
    """The level's candidates grouped by their :func:`_mode_fixed` values."""
    fixed = _mode_fixed(level.adapter)
    out: dict = {}
    for c in level.candidates:
        out.setdefault(tuple(getattr(c, p) for p in fixed), []).append(c)
    return out


def _launch_only_variant(adapter: KernelAdapter, a: KernelConfig, b: KernelConfig, free: set = frozenset()) -> bool:
    """Whether ``a`` differs from ``b`` only in launch-only parameters (the grid, not the binary) or in ``free``."""
    return all(getattr(a, p.name) == getattr(b, p.name) for p in adapter.params if p.compiled and p.name not in free)


def _expected_improvement(mu: np.ndarray, sd: np.ndarray, best: float) -> np.ndarray:
    """EI of a minimization at ``best`` under independent normal posteriors."""
    z = (best - mu) / sd
    return (best - mu) * ndtr(z) + sd * _pdf(z)


_SQRT_2PI = math.sqrt(2 * math.pi)


def _pdf(z: np.ndarray) -> np.ndarray:
    """The standard normal density, as ``scipy.stats.norm.pdf`` computes it (without its argument checks)."""
    return np.exp(-(z**2) / 2.0) / _SQRT_2PI
