"""The surrogate's model: one Gaussian process over the parameters, the launch geometry and log C.

:class:`Model` owns the training set (every measurement of the space, this kernel's and the priors', as
:class:`tuner.strategies.base.Measured` rows), the fit with the hyperparameters in use, the posterior, the
leave-one-out scale, what is kept between calls (by the rows' version, the level and the data itself) and
when the hyperparameters are re-optimized (off the proposal path: :mod:`tuner.strategies.hpo`). What to
propose and when to stop is :class:`tuner.strategies.surrogate.Surrogate`'s; its module says how the model
is built and why.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import math
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from . import hpo
from .base import Level
from .base import Measured
from .base import Options

if TYPE_CHECKING:
    from ..adapter import KernelAdapter

FAIL_MARGIN = math.log(1.5)  # a failed launch enters the model this much above the worst value seen
PRIOR_NOISE = 0.05**2  # a prior point's extra noise variance (log-ratio units) at rho = 1 ...
PRIOR_UNKNOWN_RHO = 0.5  # ... and the rho assumed while fewer than MIN_OVERLAP launches are shared
MIN_OVERLAP = 5
LS_MIN = 1e-2  # the kernels' smallest length scale (features in log2 units)
NOISE_MIN = 1e-3  # the white noise's smallest level (normalized units): at 1e-6 the fits interpolated
NOISE_MAX = 1e-2  # its largest (the surrogate's ``noise_max`` option): at 1e-1 a fit of V3.2 C=48 on two GPUs called
# the data noise (its white noise went to the bound), claimed P = 1 for 500 launches and measured 636 of 713
BLIND_C = 1e5  # the shared kernel's log2 C length scale: its correlation across the levels is 1
# the kernel's parts by their names in ``get_params()`` (see :func:`kernel`)
SHARED_LS, LEVEL_LS = "k1__k1__k2__length_scale", "k1__k2__k2__length_scale"


class Fitted:
    """The process fitted to ``(X, y)`` with fixed hyperparameters: the algebra of scikit-learn's
    ``GaussianProcessRegressor(normalize_y=True, optimizer=None)`` (Rasmussen and Williams, algorithm 2.1), step for
    step and so to the bit, without what its ``fit`` adds that the search never reads (the log marginal likelihood,
    a second kernel matrix and Cholesky factor; input validation; a clone of the kernel)."""

    __slots__ = ("kernel", "X", "L", "alpha", "mean", "std", "noise")

    def __init__(self, kernel, X: np.ndarray, y: np.ndarray, alpha: np.ndarray) -> None:
        from scipy.linalg import cho_solve
        from scipy.linalg import cholesky

        self.kernel, self.X = kernel, X
        self.mean = np.mean(y, axis=0)
        std = np.std(y, axis=0)
        self.std = 1.0 if std == 0.0 else std  # the targets' scale (a constant's is 1)
        K = kernel(X)
        K[np.diag_indices_from(K)] += alpha
        self.L = cholesky(K, lower=True, check_finite=False)  # K = L L^T
        self.alpha = cho_solve((self.L, True), (y - self.mean) / self.std, check_finite=False)
        self.noise = white_noise(kernel) * self.std**2  # the white noise's variance in the targets' units

    def predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The posterior mean and standard deviation at ``X`` (the white noise included)."""
        from scipy.linalg import solve_triangular

        K_trans = self.kernel(X, self.X)
        mu = self.std * (K_trans @ self.alpha) + self.mean
        V = solve_triangular(self.L, K_trans.T, lower=True, check_finite=False)
        var = self.kernel.diag(X).copy()
        var -= np.einsum("ij,ji->i", V.T, V)
        var[var < 0] = 0.0
        return mu, np.sqrt(var * self.std**2)


class Model:
    """The training set, the fits and the hyperparameters of one surrogate (see the module)."""

    def __init__(self, options: Options, seed: int = 0, refit: str = "deterministic") -> None:
        self.options, self.seed = options, seed  # options: the surrogate's (tuner.strategies.surrogate)
        # every measurement it learns from: the history (other levels, priors), then the level's own
        self.history: Sequence[Measured] = ()
        self._history_len = 0
        self.own: tuple[Measured, ...] = ()
        self._prepared: _History | None = None  # what ``history`` gives at one level, computed once
        self.version = 0  # bumped whenever the rows change: what the training set and the fits are kept by
        self.kernel = None  # the hyperparameters in use (a kernel), until an optimization swaps in
        self.n_fit = 0  # the training set's size when the last optimization started
        self.fit_level = None  # the level whose data the hyperparameters were last optimized on
        self.here_fit = 0  # and how many of its own measurements they saw
        self._features: dict = {}
        self._last = None  # (data key, the last fit)
        self._cached: dict = {}  # kind -> (rows version, key...) and the last result of that kind
        self._theta_of = None  # (kernel, its theta)
        self.refitter = hpo.Refitter(refit, options.hpo_lag)
        weakref.finalize(self, self.refitter.close)  # the worker ends with the model

    def sync(self, level: Level, history) -> None:
        """Learn from ``history`` (the other levels, the priors) and the level's own measurements. ``history`` is
        taken to be unchanged while it is the same sequence at the same length (a caller passes a new one per
        level, or appends to it between levels): what it gives is computed once (:class:`_History`), not at
        every measurement."""
        own = level.own()
        changed = own != self.own
        if history is not self.history or len(history) != self._history_len:
            self.history, self._history_len = history, len(history)
            changed = True
        if changed:
            self.own = own
            self.version += 1
        self.refitter.start()  # a search is starting: the optimization worker starts beside it

    # --- the training set ----------------------------------------------------------------------

    def features(self, adapter: KernelAdapter, cfg, wl, concurrency: int) -> list[float]:
        """The adapter's encoding of a config at a level (:meth:`tuner.adapter.KernelAdapter.encode`), kept per
        workload and level (a config is hashed once per lookup, the workload once per batch)."""
        at = self._features.get((wl, concurrency))
        if at is None:
            at = self._features[(wl, concurrency)] = {}
        row = at.get(cfg)
        if row is None:
            row = at[cfg] = adapter.encode(cfg, wl, concurrency)
        return row

    def X(self, configs, level: Level) -> np.ndarray:
        at = self._features.get((level.workload, level.concurrency)) or {}
        rows = [at.get(c) for c in configs]
        if any(r is None for r in rows):
            rows = [self.features(level.adapter, c, level.workload, level.concurrency) for c in configs]
        return np.array(rows)

    def memo(self, kind: str, key: tuple, make):
        """``make()``, or its last result for the same rows and ``key`` (propose and the stop rule of one
        measurement ask for the same training set and model)."""
        full = (self.version, *key)
        hit = self._cached.get(kind)
        if hit is None or hit[0] != full:
            hit = self._cached[kind] = (full, make())
        return hit[1]

    def training(self, level: Level):
        """(X, y, noise) from every row: this kernel's at weight 1, priors with noise by how they predict."""
        return self.memo("training", (level.concurrency,), lambda: self._make_training(level))

    def prepared(self, level: Level) -> _History:
        """:class:`_History` of the rows' history at ``level``, made once per history and level."""
        h = self._prepared
        if h is None or h.history is not self.history or h.n != len(self.history) or h.concurrency != level.concurrency:
            h = self._prepared = _History(self.history, level.concurrency)
        return h

    def prior_rho(self, level: Level) -> dict:
        """Spearman's rho of each prior source against this kernel's values on the launches both measured."""
        return self.prepared(level).rho({(c, cfg): y for c, cfg, y, _ in self.own if y is not None})

    def _make_training(self, level: Level):
        """Every row, this kernel's first by nearness: the history's, kept sorted per source by :class:`_History`,
        merged with the level's own rows (which come after the history's: a tie keeps the rows' order)."""
        h = self.prepared(level)
        own = self.own
        if not own and not h.n:
            return None
        ys = [y for *_, y, _ in own if y is not None]
        if h.worst is not None:
            ys.insert(0, h.worst)
        worst = max(ys, default=0.0)
        rho = self.prior_rho(level)
        logc = math.log2(level.concurrency)
        mine = []
        for j, (c, cfg, y, src) in enumerate(own):
            near = abs(math.log2(c) - logc) + (0.5 if src is not None else 0.0)
            mine.append((near, h.n + j, c, cfg, y, src))
        mine.sort(key=lambda p: p[0])
        groups = [rows for src, rows in h.groups.items() if src is None or rho.get(src, 0.0) > 0.0]
        pts = list(itertools.islice(heapq.merge(*groups, mine), self.options.max_train))
        X = np.array([self.features(level.adapter, cfg, level.workload, c) for _, _, c, cfg, _, _ in pts])
        y = np.array([worst + FAIL_MARGIN if v is None else v for *_, v, _ in pts])
        extra = np.array([0.0 if src is None else PRIOR_NOISE / rho[src] ** 2 for *_, src in pts])
        return X, y, extra

    # --- fits ----------------------------------------------------------------------------------

    def fit(self, level: Level, X, y, extra) -> Fitted:
        """The model of ``(X, y)`` at ``level`` with the hyperparameters in use (no optimization: milliseconds).
        Propose and the stop rule ask for the same one, so the last is kept, by the level and the data itself."""
        digest = hashlib.blake2b(digest_size=16)
        for a in (X, y, extra, self.theta()):
            digest.update(np.ascontiguousarray(a, dtype=float).tobytes())
        key = (level.concurrency, X.shape, digest.digest())
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        fitted = Fitted(self.kernel, X, y, _alpha(y, extra))
        self._last = (key, fitted)
        return fitted

    def theta(self) -> np.ndarray:
        """The hyperparameters in use (scikit-learn builds ``theta`` anew at every access: kept per kernel)."""
        if self._theta_of is None or self._theta_of[0] is not self.kernel:
            self._theta_of = (self.kernel, self.kernel.theta)
        return self._theta_of[1]

    def fitted(self, level: Level) -> tuple[Fitted, float] | None:
        """The fitted model and the factor its standard deviations are widened by (its leave-one-out errors at
        this level, never below 1), or None with too little data."""
        data = self.training(level)
        if data is None or len(data[1]) < self.options.n_init:
            return None
        at_level = data[0][:, 0] == math.log2(level.concurrency)
        here = int(at_level.sum())
        self._refit(level, *data, here, at_level)
        key = (level.concurrency, self.theta().tobytes())
        return self.memo("model", key, lambda: self._fitted(level, data, at_level))

    def _fitted(self, level: Level, data, at_level):
        f = self.fit(level, *data)
        return f, _loo_scale(f, at_level)

    def posterior(self, f: Fitted, X) -> tuple[np.ndarray, np.ndarray]:
        """The latent function's mean and standard deviation (the white noise taken out)."""
        mu, sd = f.predict(X)
        return mu, np.sqrt(np.maximum(sd**2 - f.noise, 1e-12))

    def open_posterior(self, f: Fitted, level: Level, configs: list) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`posterior` of ``configs`` under the level's model, kept: the stop rule and the next proposal
        ask for the same one (the open candidates, when no neighbour or line comes first)."""
        key = (level.concurrency, f, tuple(configs))  # the model itself (compared by identity), held
        return self.memo("posterior", key, lambda: self.posterior(f, self.X(configs, level)))

    def believe(self, f: Fitted, level: Level, believed) -> Fitted:
        """The model with ``believed`` launches added at their predicted values (the kriging believer)."""
        X, y, extra = self.training(level)
        Xb = self.X(believed, level)
        mu_b, _ = self.posterior(f, Xb)
        return self.fit(level, np.vstack([X, Xb]), np.concatenate([y, mu_b]), np.concatenate([extra, 0 * mu_b]))

    # --- hyperparameters -----------------------------------------------------------------------

    def _refit(self, level: Level, X, y, extra, here: int, at_level) -> None:
        """Swap in a finished optimization, and start one when due (see :mod:`tuner.strategies.surrogate`)."""
        o = self.options
        first = self.kernel is None
        new_level = self.fit_level != level.concurrency
        grown = here >= o.refit_here * max(self.here_fit, 2)
        due = first or new_level or grown or len(y) >= o.refit_growth * self.n_fit
        kernel = self.refitter.take(level.concurrency, here, due=due)
        if kernel is not None:
            self.kernel = kernel
        if not due or self.refitter.pending:
            return  # background: the worker is busy, the next call starts it
        if new_level or grown:
            # a new level, or one whose own data doubled: even when max_train keeps the data's size (a level that
            # departs from the others needs its own amplitude)
            self.fit_level, self.here_fit = level.concurrency, here
        self.n_fit = len(y)
        sel = np.arange(len(y))
        if len(y) > o.hpo_max:  # this level's points, then a seeded sample of the others
            mine, rest = np.flatnonzero(at_level), np.flatnonzero(~at_level)
            rng = np.random.default_rng([self.seed, level.concurrency, len(y)])
            k = max(0, o.hpo_max - len(mine))
            sel = np.sort(np.concatenate([mine[: o.hpo_max], rng.choice(rest, size=min(k, len(rest)), replace=False)]))
        start = kernel_for(X.shape[1], o.noise_max) if first else self.kernel  # warm-started from the last optimum
        restarts = o.hpo_restarts if first or new_level else 0
        args = (X[sel], y[sel], _alpha(y[sel], extra[sel]), start, restarts, self.seed, o.hpo_maxiter)
        # the first optimization has no hyperparameters to go on with: it swaps in at once, in every mode
        self.refitter.submit(args, level.concurrency, here, lag=0 if first else None)
        if first:
            self.kernel = self.refitter.take(level.concurrency, here, wait=True)
            if self.kernel is None:  # the worker died: here, then
                self.refitter.submit(args, level.concurrency, here, lag=0)
                self.kernel = self.refitter.take(level.concurrency, here, wait=True)

    def close(self) -> None:
        self.refitter.close()


class _History:
    """What the model takes from one history (the other levels' rows and the priors, :meth:`Model.sync`) at one
    level, computed once: what depends on the history alone is not walked again at every measurement (on the
    H200's results a space's history holds over 10,000 prior rows). With the level's own rows, :meth:`rho` and
    :meth:`Model._make_training` give what walking every row in order (the history's, then the level's) gives:
    the same values, in the same order."""

    def __init__(self, history: Sequence[Measured], concurrency: int) -> None:
        self.history, self.n, self.concurrency = history, len(history), concurrency
        self.worst = max((m.y for m in history if m.y is not None), default=None)  # the first of the largest
        # this kernel's values at the other levels, as the level's own rows would see them (the later wins)
        self.mine = {(c, cfg): y for c, cfg, y, src in history if src is None and y is not None}
        # per prior source, its launches with a value, in the rows' order; where each launch is in that list; and
        # (position, this kernel's value, the source's) at the launches this kernel measured at the other levels
        self.by_src: dict = {}
        for c, cfg, y, src in history:
            if src is not None and y is not None:
                self.by_src.setdefault(src, []).append(((c, cfg), y))
        self.where = {src: {} for src in self.by_src}
        self.shared = {src: [] for src in self.by_src}
        for src, pts in self.by_src.items():
            for i, (k, y) in enumerate(pts):
                self.where[src].setdefault(k, []).append(i)
                if k in self.mine:
                    self.shared[src].append((i, k, self.mine[k], y))
        # the training set's candidates: (nearness, row index, C, config, y, source) per source (None: this
        # kernel's), each sorted by nearness and then the rows' order, as the training set ranks them
        logc = math.log2(concurrency)
        self.groups: dict = {None: []}
        for i, (c, cfg, y, src) in enumerate(history):
            near = abs(math.log2(c) - logc) + (0.5 if src is not None else 0.0)
            self.groups.setdefault(src, []).append((near, i, c, cfg, y, src))
        for rows in self.groups.values():
            rows.sort(key=lambda p: (p[0], p[1]))

    def rho(self, here: dict) -> dict:
        """Spearman's rho of each prior source against this kernel's values (``self.mine``, updated with the
        level's own: ``here``, (C, config) -> y) on the launches both measured, the pairs in the source's order."""
        again = any(k in self.mine for k in here)  # a launch of the history's own rows measured again: here's wins
        out = {}
        for src, pts in self.by_src.items():
            both = [(i, v, y) for i, k, v, y in self.shared[src] if not again or k not in here]
            at = self.where[src]
            new = [(i, v, pts[i][1]) for k, v in here.items() for i in at.get(k, ())]
            if new:
                both = sorted(both + new, key=lambda p: p[0])
            if len(both) < MIN_OVERLAP:
                out[src] = PRIOR_UNKNOWN_RHO
                continue
            from scipy import stats as sps

            r = sps.spearmanr([a for _, a, _ in both], [b for _, _, b in both]).statistic
            out[src] = 0.0 if not np.isfinite(r) else max(0.0, float(r))
        return out


def kernel_for(n_features: int, noise_max: float = NOISE_MAX):
    """Shared + level Matérn 5/2 kernels and white noise (see :mod:`tuner.strategies.surrogate`). Feature 0 is
    log2 C; the shared kernel's length scale for it is fixed so long that it does not see it. Their length
    scales are ``get_params()[SHARED_LS]`` and ``[LEVEL_LS]``."""
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
    return shared + level + WhiteKernel(min(1e-3, noise_max), (NOISE_MIN, max(noise_max, NOISE_MIN)))


def white_noise(kernel) -> float:
    """The noise level of the kernel's white-noise part (normalized units)."""
    from sklearn.gaussian_process.kernels import WhiteKernel

    return next(v.noise_level for v in kernel.get_params().values() if isinstance(v, WhiteKernel))


def _alpha(y, extra) -> np.ndarray:
    """The noise added to the kernel's diagonal: a prior point's extra variance, in the normalized units that
    ``normalize_y`` fits."""
    return 1e-8 + extra / max(float(np.var(y)), 1e-12)


def _loo_scale(f: Fitted, here) -> float:
    """How much wider the model's standard deviations must be to match its own leave-one-out errors: the
    root mean square of the standardized LOO residuals (closed form for a GP) over this level's points, or
    all points while the level has fewer than 3; never below 1."""
    from scipy.linalg.lapack import dtrtri

    Linv, info = dtrtri(f.L, lower=1)  # K = L L^T, so diag(K^-1) = column sums of (L^-1)^2
    if info != 0:
        return 1.0
    d = np.einsum("ij,ij->j", Linv, Linv)
    resid = f.alpha.ravel() / d  # y - mu_loo, normalized units
    z = resid * np.sqrt(d)  # over sigma_loo
    sel = here if here.sum() >= 3 else np.ones_like(here)
    return max(1.0, float(np.sqrt(np.mean(z[sel] ** 2))))
