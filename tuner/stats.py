"""Statistics of the paired A/B protocol (numpy + scipy; nothing hand-rolled that scipy does).

Each round r gives a candidate time c_r and a baseline time b_r measured back to back, so drift
that hits both cancels in the ratio c_r / b_r. The objective is median(c); the effect is the
median ratio with a bootstrap 95 % CI. The noise band is the half-width of the same CI measured
baseline-against-baseline (A/A) at the start of a study:

- **win**        the whole ratio CI lies below 1 - band
- **regression** the whole ratio CI lies above 1 + band
- **flat**       otherwise (within noise)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from db.verdicts import Effect

N_RESAMPLES = 2000


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
    median_us: float
    ci_low_us: float
    ci_high_us: float
    baseline_median_us: float
    ratio: float
    ratio_ci_low: float
    ratio_ci_high: float

    def classify(self, band: float) -> Effect:
        if self.ratio_ci_high < 1.0 - band:
            return Effect.WIN
        if self.ratio_ci_low > 1.0 + band:
            return Effect.REGRESSION
        return Effect.FLAT


def paired(candidate_us, baseline_us, seed: int = 0) -> PairedStats:
    c = np.asarray(candidate_us, dtype=float)
    b = np.asarray(baseline_us, dtype=float)
    if c.shape != b.shape or c.ndim != 1 or len(c) == 0:
        raise ValueError(f"need two equal-length 1-D sample arrays, got {c.shape} and {b.shape}")
    r = c / b
    lo, hi = median_ci(c, seed)
    rlo, rhi = median_ci(r, seed + 1)
    return PairedStats(len(c), float(np.median(c)), lo, hi, float(np.median(b)), float(np.median(r)), rlo, rhi)


def noise_band(a_us, a2_us, seed: int = 0) -> float:
    """A/A: the half-width (relative) of the median-ratio CI of the baseline against itself."""
    s = paired(a_us, a2_us, seed)
    return float(max(1.0 - s.ratio_ci_low, s.ratio_ci_high - 1.0, 0.0))


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
