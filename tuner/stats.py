"""Statistics of the paired A/B protocol (numpy + scipy; nothing hand-rolled that scipy does).

Each round r captures the candidate and the baseline afresh and times them back to back, giving a
paired log-ratio ``d_r = log(c_r / b_r)``: drift that hits both cancels, and the capture-to-capture
noise (a graph captured again runs up to ~1 % faster or slower) is inside every round, so rounds are
independent draws of the same distribution.

One estimator ranks and judges: the geometric-mean ratio ``exp(mean(d))`` with its t confidence
interval. The noise band is ``max(spread, min_effect)``, where the spread is the standard deviation of
``d`` between independent captures of the baseline against itself (A/A, :func:`spread`), measured by
``tuner calibrate`` or at the start of a study, and ``min_effect`` (default 1 %) is the smallest
effect worth deploying. A candidate's test is two one-sided paired t-tests of ``mean(d)`` against the
band's edges:

- **win**        ``mean(d) < log(1 - band)`` is significant
- **regression** ``mean(d) > log(1 + band)`` is significant
- **flat**       otherwise (within noise)

Multiplicity: a study tests every config of its space (about 150 on the shipped spaces), so the calls
of one study control the false-discovery rate with Benjamini-Hochberg at q = 0.05 over the per-trial
p-values (:func:`decide`). BH rather than Bonferroni/Holm: under the complete null (no config differs,
the case that fooled hand-tuning) BH's false-discovery rate equals the family-wise error rate, so a
study with only null configs makes a false call in at most 5 % of runs; when some configs really
differ, BH keeps the power that Holm's family-wise control would spend on hundreds of tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from ..db.verdicts import Effect

N_RESAMPLES = 2000
FDR_Q = 0.05  # false-discovery rate of the win/regression calls of one study
ALPHA = 0.05  # one trial's own level, before the study-wide correction
DEFAULT_MIN_EFFECT = 0.01  # 1 %: the smallest effect worth deploying (search space `measurement.min_effect`)


def median_ci(x: np.ndarray, seed: int = 0, confidence: float = 0.95) -> tuple[float, float]:
    """Bootstrap (percentile) CI of the median of ``x``."""
    x = np.asarray(x, dtype=float)
    if len(x) < 2 or np.all(x == x[0]):
        return float(x[0]), float(x[0])
    res = sps.bootstrap(
        (x,),
        np.median,
        n_resamples=N_RESAMPLES,
        confidence_level=confidence,
        method="percentile",
        rng=np.random.default_rng(seed),
        vectorized=True,
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


@dataclass(frozen=True)
class PairedStats:
    n: int
    median_us: float  # the candidate's own median (shown; the ratio ranks and judges)
    ci_low_us: float
    ci_high_us: float
    baseline_median_us: float
    ratio: float  # exp(mean log ratio): the candidate's time relative to the baseline
    ratio_ci_low: float  # 95 % t interval
    ratio_ci_high: float
    mean_log: float
    se_log: float

    def p_value(self, band: float) -> tuple[float, Effect]:
        """The smaller of the two one-sided p-values against the band's edges, and its direction."""
        if self.n < 2:
            return 1.0, Effect.FLAT
        lo, hi = win_edge(band), math.log(1.0 + band)
        if self.se_log == 0.0:  # identical samples: the sign alone decides
            p_win = 0.0 if self.mean_log < lo else 1.0
            p_reg = 0.0 if self.mean_log > hi else 1.0
        else:
            df = self.n - 1
            p_win = float(sps.t.cdf((self.mean_log - lo) / self.se_log, df))
            p_reg = float(sps.t.sf((self.mean_log - hi) / self.se_log, df))
        return (p_win, Effect.WIN) if p_win <= p_reg else (p_reg, Effect.REGRESSION)

    def classify(self, band: float, alpha: float = ALPHA) -> Effect:
        """This trial's call on its own (before the study-wide correction of :func:`decide`)."""
        p, direction = self.p_value(band)
        return direction if p <= alpha else Effect.FLAT


def paired(candidate_us, baseline_us, seed: int = 0, *, bootstrap: bool = True) -> PairedStats:
    """The paired statistics of one measurement; ``bootstrap=False`` skips the median's CI (simulations)."""
    c = np.asarray(candidate_us, dtype=float)
    b = np.asarray(baseline_us, dtype=float)
    if c.shape != b.shape or c.ndim != 1 or len(c) == 0:
        raise ValueError(f"need two equal-length 1-D sample arrays, got {c.shape} and {b.shape}")
    d = np.log(c / b)
    n = len(d)
    mean = float(d.mean())
    se = float(d.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0
    half = float(sps.t.ppf(0.975, n - 1)) * se if n > 1 else 0.0
    lo, hi = median_ci(c, seed) if bootstrap else (float(np.min(c)), float(np.max(c)))
    return PairedStats(
        n,
        float(np.median(c)),
        lo,
        hi,
        float(np.median(b)),
        math.exp(mean),
        math.exp(mean - half),
        math.exp(mean + half),
        mean,
        se,
    )


def decide(tests: list[tuple[float, Effect]], q: float = FDR_Q) -> list[Effect]:
    """Benjamini-Hochberg over one study's ``(p_value, direction)`` pairs: the calls that stand."""
    if not tests:
        return []
    adjusted = sps.false_discovery_control([p for p, _ in tests], method="bh")
    return [d if a <= q else Effect.FLAT for (_, d), a in zip(tests, adjusted, strict=True)]


def band(spread_: float, min_effect: float = DEFAULT_MIN_EFFECT) -> float:
    """The band verdicts use: the measured capture-to-capture spread, never below ``min_effect``."""
    return max(spread_, min_effect)


def log_ratios(pairs) -> np.ndarray:
    """``log(a / a')`` of each independent A/A capture pair ``(a_us, a2_us)``."""
    a = np.asarray(pairs, dtype=float)
    return np.log(a[:, 0] / a[:, 1])


def spread(pairs) -> float:
    """Standard deviation of the log ratio between independent captures of one config (A/A)."""
    d = log_ratios(pairs)
    return float(d.std(ddof=1)) if len(d) > 1 else 0.0


def win_edge(band_: float) -> float:
    """``log(1 - band)``, the log ratio a win must be below: ``-inf`` for a band of 100 % or more (an A/A so
    noisy that no ratio is a win), where the logarithm itself is undefined."""
    return math.log(1.0 - band_) if band_ < 1.0 else -math.inf


def mde(spread_: float, rounds: int, band_: float, alpha: float = ALPHA) -> float:
    """The smallest true effect a trial of ``rounds`` rounds calls a win half of the time (1.0: none can be)."""
    margin = -win_edge(band_) + float(sps.t.ppf(1 - alpha, rounds - 1)) * spread_ / math.sqrt(rounds)
    return 1.0 - math.exp(-margin)


def false_rate(pairs, rounds: int, band_: float, trials: int = 400, seed: int = 0) -> float:
    """How often the current policy calls an A/A trial non-flat: trials of ``rounds`` rounds drawn from
    the independent capture pairs (with replacement), each judged on its own (no study-wide correction,
    so this bounds one trial's error)."""
    d = log_ratios(pairs)
    if len(d) < 2:
        return 0.0
    rng = np.random.default_rng(seed)
    calls = 0
    for _ in range(trials):
        x = rng.choice(d, size=rounds, replace=True)
        mean, se = float(x.mean()), float(x.std(ddof=1) / math.sqrt(rounds))
        st = PairedStats(rounds, 1.0, 1.0, 1.0, 1.0, math.exp(mean), math.exp(mean), math.exp(mean), mean, se)
        calls += st.classify(band_) is not Effect.FLAT
    return calls / trials


def multimodal(x) -> bool:
    """Whether samples look like two populations (Sarle's bimodality coefficient > 5/9 with a spread
    of at least 5 %), e.g. a baseline that alternates between two speeds inside one trial."""
    x = np.asarray(x, dtype=float)
    n = len(x)
    if n < 8 or np.ptp(x) < 0.05 * np.median(x):
        return False
    g = float(sps.skew(x, bias=False))
    k = float(sps.kurtosis(x, bias=False))
    bc = (g * g + 1.0) / (k + 3.0 * (n - 1) ** 2 / ((n - 2) * (n - 3)))
    return bc > 5.0 / 9.0


def ratio_of_ratios(ratios_a, ratios_b, seed: int = 0) -> tuple[float, float, float]:
    """A against B when both were measured against the same baseline in separate rounds:
    median(a) / median(b) of their per-round ratios, with an unpaired bootstrap 95 % CI."""
    a, b = np.asarray(ratios_a, dtype=float), np.asarray(ratios_b, dtype=float)
    point = float(np.median(a) / np.median(b))
    if len(a) < 2 or len(b) < 2:
        return point, point, point
    res = sps.bootstrap(
        (a, b),
        lambda x, y, axis=-1: np.median(x, axis=axis) / np.median(y, axis=axis),
        n_resamples=N_RESAMPLES,
        method="percentile",
        rng=np.random.default_rng(seed),
        vectorized=True,
        paired=False,
    )
    return point, float(res.confidence_interval.low), float(res.confidence_interval.high)
