"""The default strategy: one Gaussian-process model of the whole space, across concurrency levels.

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

**Hyperparameters** (length scales, amplitudes, noise) are re-optimized when a level starts, each time its
own measurements grew :data:`REFIT_HERE`-fold, and when the training set grew :data:`REFIT_GROWTH`-fold;
between those the last optimum is reused. The white noise is floored at :data:`NOISE_MIN`. An optimization
takes seconds and a fit with fixed hyperparameters milliseconds, so the optimizations run off the proposal
path (:mod:`tuner.strategies.hpo`): in a worker process, on at most :data:`HPO_MAX` of the training points
(this level's first, then a seeded sample of the others), warm-started from the last optimum, while the
proposals go on with the last hyperparameters; the new ones swap in when ready (``background``, a search
on a GPU) or :data:`HPO_LAG` measurements later (``deterministic``, a replay: the same seed makes the same
search). :attr:`Surrogate.model_seconds` is the time the search spent in the strategy (proposals, the stop
rule and any wait for an optimization); :attr:`Surrogate.hpo_seconds` the optimizations' own time.

**Proposals.** In order: the previous level's best launches (and its :data:`CARRY_LINES` best tile shapes'
best launches at every split target), the incumbent's neighbours, the lines of
the best tile shapes, then expected improvement over the open candidates of the level (feasible,
distinct, not yet measured). Several workers get several launches at once, by the *kriging believer*: each proposal and
each trial still running is added to the model at its predicted value before the next is chosen, so the
proposals spread out instead of repeating. A level with no data from any level starts from
:data:`N_INIT` candidates drawn at random (seeded) among the open ones.

**The stop rule.** After at least :data:`MIN_HERE` measurements at the level, once the previous level's
best, the incumbent's neighbours and the lines (:meth:`Surrogate._lines`) are measured, it stops when
``P(an unmeasured launch beats the best by > band) < STOP_P``: each open candidate's posterior
probability of a log ratio below ``log(best) + log(1 - band)``, summed (the union bound: no independence
assumed). :data:`STOP_P` = 5 % is the threshold the search benchmark (``benchmarks/bench_search.py``) was
run with; ``--n-trials`` stays a hard cap.
"""

from __future__ import annotations

import hashlib
import math
import time
import warnings
import weakref
from typing import TYPE_CHECKING

import numpy as np
from scipy import stats as sps

import sparse_mla_tuner.tuner.strategies.hpo as hpo
from sparse_mla_tuner.tuner.stats import win_edge
from sparse_mla_tuner.tuner.strategies.base import Level
from sparse_mla_tuner.tuner.strategies.base import Strategy

if TYPE_CHECKING:
    from sparse_mla_tuner.tuner.adapter import KernelAdapter

KernelConfig = object  # annotations: the adapter's config type

STOP_P = 0.05  # stop a level when P(an open launch beats the best by more than the band) is below this
N_INIT = 6  # random first picks when the model has no data at all
MIN_HERE = 8  # measurements at a level (the baseline and the queued configs count) before it may stop
MAX_TRAIN = 250  # points the model is fitted to: this level's, then the nearest levels' (by |log C|)
REFIT_HERE = 2  # ... and when the level's own measurements grew by this factor
REFIT_GROWTH = 1.5  # hyperparameters are re-optimized when the training set grew by this factor, and at each level
HPO_MAX = 100  # training points an optimization sees: this level's, then a seeded sample of the rest
HPO_RESTARTS = 1  # random starts besides the start point, at a level's first optimization; the level's later ones
# start only from the last optimum (a warm start converges in 20-40 iterations, a random one runs to 90 and more)
HPO_MAXITER = hpo.MAXITER  # L-BFGS-B iterations per start
HPO_LAG = 2  # deterministic mode: an optimization started at a level's n-th measurement is used from its (n+LAG)-th
FAIL_MARGIN = math.log(1.5)  # a failed launch enters the model this much above the worst value seen
PRIOR_NOISE = 0.05**2  # a prior point's extra noise variance (log-ratio units) at rho = 1 ...
PRIOR_UNKNOWN_RHO = 0.5  # ... and the rho assumed while fewer than MIN_OVERLAP launches are shared
MIN_OVERLAP = 5
LS_MIN = 1e-2  # the kernels' smallest length scale (features in log2 units)
NOISE_MIN = 1e-3  # the white noise's smallest level (normalized units): at 1e-6 the fits interpolated
BLIND_C = 1e5  # the shared kernel's log2 C length scale: its correlation across the levels is 1
CARRY = 3  # the previous level's best launches measured first at each level
CARRY_LINES = 2  # ... and its best tile shapes' best launches at every split target
LINES = 3  # the best tile shapes whose best launch is tried at every split target ...
LINE_WITHIN = 0.10  # ... among those whose best launch is within this share of the level's best


class Surrogate(Strategy):
    name = "surrogate"

    def __init__(self, seed: int = 0, stop_p: float = STOP_P, refit: str = "deterministic") -> None:
        """``refit``: when re-optimized hyperparameters swap in (:data:`tuner.strategies.hpo.MODES`)."""
        self.seed = seed
        self.stop_p = stop_p
        self.rows: list[tuple] = []  # (concurrency, config, log ratio | None, source); source None: this kernel
        self._kernel = None  # the hyperparameters in use (a fitted kernel), until an optimization swaps in
        self._n_fit = 0  # the training set's size when the last optimization started
        self._fit_level = None  # the level whose data the hyperparameters were last optimized on
        self._here_fit = 0  # and how many of its own measurements they saw
        self.last_p: float | None = None
        self._features: dict = {}
        self._last = None  # (data key, fitted model)
        self._version = 0  # bumped whenever ``rows`` change: what the training set and the model are cached by
        self._cached: dict = {}  # kind -> (rows version, level, ...) and the last result of that kind
        self._theta_of = None  # (kernel, its theta)
        self.refitter = hpo.Refitter(refit, HPO_LAG)
        weakref.finalize(self, self.refitter.close)  # the worker ends with the strategy
        self.model_seconds = 0.0  # time spent in propose and stop_reason (the proposal path), waits included

    @property
    def hpo_seconds(self) -> float:
        """The hyperparameter optimizations' own time (off the proposal path unless ``refit="inline"``)."""
        return self.refitter.seconds

    def close(self) -> None:
        """Stop the optimization worker (a later optimization starts a new one)."""
        self.refitter.close()

    def history(self, rows) -> None:
        rows = list(rows)
        if rows != self.rows:
            self.rows = rows
            self._version += 1
        self.refitter.start()  # a search is starting: the optimization worker starts beside it

    # --- features ------------------------------------------------------------------------------

    def features(self, adapter: KernelAdapter, cfg, wl, concurrency: int) -> list[float]:
        """The adapter's encoding of a config at a level (:meth:`tuner.adapter.KernelAdapter.encode`), kept."""
        key = (cfg, wl, concurrency)
        if key not in self._features:
            self._features[key] = adapter.encode(cfg, wl, concurrency)
        return self._features[key]

    # --- the model -----------------------------------------------------------------------------

    def _memo(self, kind: str, key: tuple, make):
        """``make()``, or its last result for the same rows and ``key`` (propose and the stop rule of one
        measurement ask for the same training set and model)."""
        full = (self._version, *key)
        hit = self._cached.get(kind)
        if hit is None or hit[0] != full:
            hit = self._cached[kind] = (full, make())
        return hit[1]

    def _training(self, level: Level):
        """(X, y, noise) from every row: this kernel's at weight 1, priors with noise by how they predict."""
        return self._memo("training", (level.concurrency,), lambda: self._make_training(level))

    def _make_training(self, level: Level):
        own = [(c, cfg, y) for c, cfg, y, src in self.rows if src is None]
        if not own and not self.rows:
            return None
        worst = max((y for *_, y, _ in self.rows if y is not None), default=0.0)
        rho = self._prior_rho(own)
        logc = math.log2(level.concurrency)
        pts = []
        for c, cfg, y, src in self.rows:
            if src is not None and rho.get(src, 0.0) <= 0.0:
                continue
            value = worst + FAIL_MARGIN if y is None else y
            extra = 0.0 if src is None else PRIOR_NOISE / rho[src] ** 2
            near = abs(math.log2(c) - logc) + (0.5 if src is not None else 0.0)
            pts.append((near, c, cfg, value, extra))
        pts.sort(key=lambda p: p[0])
        pts = pts[:MAX_TRAIN]
        X = np.array([self.features(level.adapter, cfg, level.workload, c) for _, c, cfg, _, _ in pts])
        y = np.array([p[3] for p in pts])
        extra = np.array([p[4] for p in pts])
        return X, y, extra

    def _prior_rho(self, own) -> dict:
        """Spearman's rho of each prior source against this kernel's values on the launches both measured."""
        mine = {(c, cfg): y for c, cfg, y in own if y is not None}
        by_src: dict = {}
        for c, cfg, y, src in self.rows:
            if src is not None and y is not None:
                by_src.setdefault(src, []).append(((c, cfg), y))
        rho = {}
        for src, pts in by_src.items():
            both = [(mine[k], y) for k, y in pts if k in mine]
            if len(both) < MIN_OVERLAP:
                rho[src] = PRIOR_UNKNOWN_RHO
                continue
            r = sps.spearmanr([a for a, _ in both], [b for _, b in both]).statistic
            rho[src] = 0.0 if not np.isfinite(r) else max(0.0, float(r))
        return rho

    def _fit(self, level: Level, X, y, extra):
        """The model of ``(X, y)`` at ``level`` with the hyperparameters in use (no optimization: milliseconds).
        Propose and the stop rule ask for the same one, so the last is kept, by the level and the data itself."""
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.gaussian_process import GaussianProcessRegressor

        digest = hashlib.blake2b(digest_size=16)
        for a in (X, y, extra, self._theta()):
            digest.update(np.ascontiguousarray(a, dtype=float).tobytes())
        key = (level.concurrency, X.shape, digest.digest())
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        gp = GaussianProcessRegressor(kernel=self._kernel, alpha=_alpha(y, extra), normalize_y=True, optimizer=None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            gp.fit(X, y)
        self._last = (key, gp)
        return gp

    def _theta(self) -> np.ndarray:
        """The hyperparameters in use (scikit-learn builds ``theta`` anew at every access: kept per kernel)."""
        if self._theta_of is None or self._theta_of[0] is not self._kernel:
            self._theta_of = (self._kernel, self._kernel.theta)
        return self._theta_of[1]

    def _refit(self, level: Level, X, y, extra, here: int, at_level) -> None:
        """Swap in a finished optimization, and start one when due (see the module's docstring)."""
        first = self._kernel is None
        new_level = self._fit_level != level.concurrency
        due = first or new_level or here >= REFIT_HERE * max(self._here_fit, 2) or len(y) >= REFIT_GROWTH * self._n_fit
        kernel = self.refitter.take(level.concurrency, here, due=due)
        if kernel is not None:
            self._kernel = kernel
        if not due or self.refitter.pending:
            return  # background: the worker is busy, the next call starts it
        if new_level or here >= REFIT_HERE * max(self._here_fit, 2):
            # a new level, or one whose own data doubled: even when MAX_TRAIN keeps the data's size (a level that
            # departs from the others needs its own amplitude)
            self._fit_level, self._here_fit = level.concurrency, here
        self._n_fit = len(y)
        sel = np.arange(len(y))
        if len(y) > HPO_MAX:  # this level's points, then a seeded sample of the others
            mine, rest = np.flatnonzero(at_level), np.flatnonzero(~at_level)
            rng = np.random.default_rng([self.seed, level.concurrency, len(y)])
            k = max(0, HPO_MAX - len(mine))
            sel = np.sort(np.concatenate([mine[:HPO_MAX], rng.choice(rest, size=min(k, len(rest)), replace=False)]))
        start = _kernel(X.shape[1]) if first else self._kernel  # warm-started from the last optimum
        restarts = HPO_RESTARTS if first or new_level else 0
        args = (X[sel], y[sel], _alpha(y[sel], extra[sel]), start, restarts, self.seed, HPO_MAXITER)
        # the first optimization has no hyperparameters to go on with: it swaps in at once, in every mode
        self.refitter.submit(args, level.concurrency, here, lag=0 if first else None)
        if first:
            self._kernel = self.refitter.take(level.concurrency, here, wait=True)
            if self._kernel is None:  # the worker died: here, then
                self.refitter.submit(args, level.concurrency, here, lag=0)
                self._kernel = self.refitter.take(level.concurrency, here, wait=True)

    def _posterior(self, gp, X) -> tuple[np.ndarray, np.ndarray]:
        """The latent function's mean and standard deviation (the white noise taken out)."""
        mu, sd = gp.predict(X, return_std=True)
        noise = gp.kernel_.k2.noise_level * gp._y_train_std**2
        return mu, np.sqrt(np.maximum(sd**2 - noise, 1e-12))

    def _open_posterior(self, gp, level: Level, configs: list) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_posterior` of ``configs`` under the level's model, kept: the stop rule and the next proposal
        ask for the same one (the open candidates, when no neighbour or line comes first)."""
        key = (level.concurrency, gp, tuple(configs))  # the model itself (compared by identity), held
        return self._memo("posterior", key, lambda: self._posterior(gp, self._X(configs, level)))

    # --- the strategy --------------------------------------------------------------------------

    def _model(self, level: Level):
        """The fitted model and the factor its standard deviations are widened by (its leave-one-out errors at
        this level, never below 1), or None with too little data."""
        data = self._training(level)
        if data is None or len(data[1]) < N_INIT:
            return None
        at_level = data[0][:, 0] == math.log2(level.concurrency)
        here = int(at_level.sum())
        self._refit(level, *data, here, at_level)
        key = (level.concurrency, self._theta().tobytes())
        return self._memo("model", key, lambda: self._fitted(level, data, at_level))

    def _fitted(self, level: Level, data, at_level):
        gp = self._fit(level, *data)
        return gp, _loo_scale(gp, data[0], data[1], here=at_level)

    def _carried(self, level: Level) -> list[KernelConfig]:
        """The best :data:`CARRY` launches of the nearest level searched before this one (in the space's order:
        never a later one, such as the next level on a resume), as launched here, then the best launch there of
        each of its :data:`CARRY_LINES` best tile shapes, at every split target here."""
        before = _before(level)
        own = [(c, cfg, y) for c, cfg, y, src in self.rows if src is None and y is not None and before(c)]
        if not own:
            return []
        logc = math.log2(level.concurrency)
        nearest = min({c for c, _, _ in own}, key=lambda c: abs(math.log2(c) - logc))
        ranked = [(y, cfg) for y, _, cfg in sorted((y, str(cfg), cfg) for c, cfg, y in own if c == nearest)]
        rep = level.representative
        if rep is None:
            by_key = {str(c): c for c in level.candidates}
            rep = lambda cfg: by_key.get(str(cfg))  # noqa: E731
        out = []
        for _, cfg in ranked:
            cand = rep(cfg)
            if cand is not None and cand not in out:
                out.append(cand)
            if len(out) == CARRY:
                break
        for cfg in _best_shapes([(c, y) for y, c in ranked], CARRY_LINES, level.adapter.family):
            if (cand := rep(cfg)) is not None:
                out += [cand, *_split_line(level, cand)]
        return list(dict.fromkeys(out))

    def _incumbent_neighbours(self, level: Level) -> list[KernelConfig]:
        best = level.best()
        if best is None:
            return []
        return [c for c in level.neighbours.get(best[0], []) if c not in level.measured]

    def _lines(self, level: Level) -> list[KernelConfig]:
        """The split-target line of the best launch of each of the :data:`LINES` best tile shapes measured here
        (the adapter's `family`) whose best is within :data:`LINE_WITHIN` of the level's: the best ``TARGET_CTAS``
        moves with C and is sharp (one wave more or less), so a shape is judged at its best split count, not
        at the one it happened to be measured with."""
        out = [
            c for b in _best_shapes(level.measured.items(), LINES, level.adapter.family) for c in _split_line(level, b)
        ]
        return [c for c in dict.fromkeys(out) if c not in level.measured and c not in level.pending]

    def propose(self, level: Level, n: int) -> list[KernelConfig]:
        t0 = time.perf_counter()
        try:
            with _one_blas_thread():
                return self._propose(level, n)
        finally:
            self.model_seconds += time.perf_counter() - t0

    def _propose(self, level: Level, n: int) -> list[KernelConfig]:
        open_ = level.open()
        if not open_:
            return []
        chosen = [c for c in self._carried(level) if c in open_][:n]
        if len(chosen) == n:
            return chosen
        fitted = self._model(level)
        if fitted is None:
            rest = [c for c in open_ if c not in chosen]
            k = min(n - len(chosen), len(rest))
            rng = np.random.default_rng([self.seed, level.concurrency, len(level.measured)])  # same on a resume
            return chosen + [rest[i] for i in sorted(rng.choice(len(rest), size=k, replace=False))]
        gp, scale = fitted
        best = level.best()
        here_best = best[1] if best is not None else 0.0
        pool = [c for c in self._incumbent_neighbours(level) if c in open_] or self._lines(level) or open_
        believed = [*level.pending, *chosen]
        while len(chosen) < n:
            pool = [c for c in pool if c not in chosen] or [c for c in open_ if c not in chosen]
            if not pool:
                break
            if believed:  # kriging believer: pending and chosen launches at their predicted values
                mu, sd = self._posterior(self._believe(gp, level, believed), self._X(pool, level))
            else:
                mu, sd = self._open_posterior(gp, level, pool)
            ei = _expected_improvement(mu, sd * scale, here_best)
            pick = pool[int(np.argmax(ei))]
            chosen.append(pick)
            believed.append(pick)
        return chosen

    def _X(self, configs, level: Level) -> np.ndarray:
        return np.array([self.features(level.adapter, c, level.workload, level.concurrency) for c in configs])

    def _believe(self, gp, level: Level, believed):
        X, y, extra = self._training(level)
        Xb = self._X(believed, level)
        mu_b, _ = self._posterior(gp, Xb)
        return self._fit(level, np.vstack([X, Xb]), np.concatenate([y, mu_b]), np.concatenate([extra, 0 * mu_b]))

    def stop_reason(self, level: Level) -> str | None:
        t0 = time.perf_counter()
        try:
            with _one_blas_thread():
                return self._stop_reason(level)
        finally:
            self.model_seconds += time.perf_counter() - t0

    def _stop_reason(self, level: Level) -> str | None:
        open_ = level.open()
        if not open_ and not level.pending:
            return f"every one of the {len(level.candidates)} distinct feasible launches measured"
        here = sum(1 for y in level.measured.values() if y is not None)
        best = level.best()
        if best is None or here < min(MIN_HERE, len(level.candidates)) or level.pending or not open_:
            return None
        if [c for c in self._carried(level) if c in open_] or self._incumbent_neighbours(level):
            return None  # the previous level's best and the incumbent's neighbours come first
        if self._lines(level):
            return None  # and the best tile shapes at every split target
        fitted = self._model(level)
        if fitted is None:
            return None
        gp, scale = fitted
        mu, sd = self._open_posterior(gp, level, open_)
        target = best[1] + win_edge(level.band)
        p_each = sps.norm.cdf((target - mu) / (sd * scale))
        p = float(min(1.0, p_each.sum()))  # the union bound: no independence assumed
        self.last_p = p
        if p < self.stop_p:
            return (
                f"P(an unmeasured launch beats the best by > band) = {p:.1%} < {self.stop_p:.0%}, "
                f"{len(level.measured)} of {len(level.candidates)} launches measured"
            )
        return None


def _kernel(n_features: int):
    """Shared + level Matérn 5/2 kernels and white noise (see the module's docstring). Feature 0 is log2 C;
    the shared kernel's length scale for it is fixed so long that it does not see it."""
    from sklearn.gaussian_process.kernels import ConstantKernel
    from sklearn.gaussian_process.kernels import Matern
    from sklearn.gaussian_process.kernels import WhiteKernel

    ones = np.ones(n_features)
    blind = np.array([[LS_MIN, 1e3]] * n_features)
    blind[0] = (BLIND_C, BLIND_C * (1 + 1e-7))
    shared = ConstantKernel(1.0, (1e-3, 1e3)) * Matern(
        length_scale=np.where(np.arange(n_features) == 0, BLIND_C, 1.0), length_scale_bounds=blind, nu=2.5
    )
    level = ConstantKernel(0.1, (1e-4, 1e3)) * Matern(length_scale=ones, length_scale_bounds=(LS_MIN, 1e3), nu=2.5)
    return shared + level + WhiteKernel(1e-3, (NOISE_MIN, 1e-1))


_BLAS = None


def _one_blas_thread():
    """The model's matrices are small (at most :data:`MAX_TRAIN` rows): one BLAS thread factors them in well
    under a millisecond, where several threads contending with the search's own took 0.1 s on 2 loaded cores."""
    global _BLAS
    if _BLAS is None:
        from threadpoolctl import ThreadpoolController

        _BLAS = ThreadpoolController()
    return _BLAS.limit(limits=1, user_api="blas")


def _alpha(y, extra) -> np.ndarray:
    """The noise added to the kernel's diagonal: a prior point's extra variance, in the normalized units that
    ``normalize_y`` fits."""
    return 1e-8 + extra / max(float(np.var(y)), 1e-12)


def _before(level: Level):
    """Whether a level was searched before ``level``: earlier in the space's order (``level.order``), or, where
    the order is not given, a smaller concurrency (every shipped space lists its levels in ascending order)."""
    order = list(getattr(level, "order", ()) or ())
    if level.concurrency in order:
        earlier = set(order[: order.index(level.concurrency)])
        return lambda c: c in earlier
    return lambda c: c < level.concurrency


def _loo_scale(gp, X, y, here) -> float:
    """How much wider the model's standard deviations must be to match its own leave-one-out errors: the
    root mean square of the standardized LOO residuals (closed form for a GP) over this level's points, or
    all points while the level has fewer than 3; never below 1."""
    from scipy.linalg.lapack import dtrtri

    Linv, info = dtrtri(gp.L_, lower=1)  # K = L L^T, so diag(K^-1) = column sums of (L^-1)^2
    if info != 0:
        return 1.0
    d = np.einsum("ij,ij->j", Linv, Linv)
    resid = gp.alpha_.ravel() / d  # y - mu_loo, normalized units
    z = resid * np.sqrt(d)  # over sigma_loo
    sel = here if here.sum() >= 3 else np.ones_like(here)
    return max(1.0, float(np.sqrt(np.mean(z[sel] ** 2))))


def _best_shapes(pairs, n: int, family: tuple[str, ...]) -> list[KernelConfig]:
    """The best launch of each of the ``n`` best tile shapes (``family``: the adapter's parameters of a shape) among
    ``(config, log ratio)`` pairs, best first, of those within :data:`LINE_WITHIN` of the best."""
    best: dict = {}
    for c, y in pairs:
        f = tuple(getattr(c, p) for p in family)
        if y is not None and (f not in best or y < best[f][0]):
            best[f] = (y, c)
    ranked = sorted(best.values(), key=lambda t: t[0])[:n]
    return [c for y, c in ranked if y <= ranked[0][0] + math.log(1.0 + LINE_WITHIN)]


def _split_line(level: Level, cfg: KernelConfig) -> list[KernelConfig]:
    """``cfg``'s neighbours at the other split targets (``TARGET_CTAS`` and the like: the same binary)."""
    return [c for c in level.neighbours.get(cfg, []) if _launch_only_variant(level.adapter, c, cfg)]


def _launch_only_variant(adapter: KernelAdapter, a: KernelConfig, b: KernelConfig) -> bool:
    """Whether ``a`` differs from ``b`` only in launch-only parameters (the grid, not the binary)."""
    return all(getattr(a, p.name) == getattr(b, p.name) for p in adapter.params if p.compiled)


def _expected_improvement(mu: np.ndarray, sd: np.ndarray, best: float) -> np.ndarray:
    """EI of a minimization at ``best`` under independent normal posteriors."""
    z = (best - mu) / sd
    return (best - mu) * sps.norm.cdf(z) + sd * sps.norm.pdf(z)
