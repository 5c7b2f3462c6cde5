"""The paired A/B statistics against synthetic timers of known distributions."""

import math

import numpy as np
import pytest

from sparse_mla_tuner.tuner import stats

ROUNDS = 10  # the shipped spaces' default
REPS = 300


def _rates(effect, drift, jitter, seed=0):
    """Fraction of repetitions classified win / regression for a candidate ``effect`` faster.

    Each round: both configs see the same drift factor (they run back to back), plus independent jitter.
    """
    rng = np.random.default_rng(seed)
    wins = regs = 0
    for i in range(REPS):

        def run(true_us):
            d = rng.normal(1.0, drift, ROUNDS)
            a = true_us * d * rng.normal(1.0, jitter, ROUNDS)
            b = 100.0 * d * rng.normal(1.0, jitter, ROUNDS)
            return a, b

        band = stats.band(stats.spread(list(zip(*run(100.0), strict=True))))  # A/A at the start of the study
        verdict = stats.paired(*run(100.0 * (1 - effect)), seed=i, bootstrap=False).classify(band)
        wins += verdict == "win"
        regs += verdict == "regression"
    return wins / REPS, regs / REPS


def test_true_3pct_win_under_5pct_drift_is_found():
    win, reg = _rates(effect=0.03, drift=0.05, jitter=0.005)
    assert win >= 0.8 and reg == 0, (win, reg)


def test_no_difference_is_rarely_called_a_win():
    win, reg = _rates(effect=0.0, drift=0.05, jitter=0.005, seed=1)
    assert win < 0.05 and reg < 0.05, (win, reg)


def test_independent_5pct_noise_is_not_faked_into_a_win():
    """Without pairing to cancel it, 5 % noise hides a 3 % effect: the protocol says flat, not win."""
    win0, _ = _rates(effect=0.0, drift=0.0, jitter=0.05, seed=2)
    assert win0 < 0.05, win0


def test_regression_and_flat():
    s = stats.paired([110.0] * 5 + [111.0] * 5, [100.0] * 10)
    assert s.classify(0.02) == "regression" and s.ratio == pytest.approx(1.105, abs=0.01)
    assert stats.paired([100.0, 101.0, 99.0], [100.0, 100.0, 100.0]).classify(0.02) == "flat"


def test_rejects_unpaired_samples():
    with pytest.raises(ValueError, match="equal-length"):
        stats.paired([1.0, 2.0], [1.0])


def test_a_band_of_100_percent_or_more_allows_no_win_and_breaks_nothing():
    """An A/A so noisy that its spread (the band) reaches 1: no ratio is a win, and nothing raises."""
    from sparse_mla_tuner.tuner.stats import mde
    from sparse_mla_tuner.tuner.stats import win_edge

    assert win_edge(1.0) == -math.inf and win_edge(1.7) == -math.inf
    assert win_edge(0.01) == pytest.approx(math.log(0.99))
    assert mde(1.2, 10, 1.2) == 1.0
    assert mde(0.01, 10, 0.01) < 0.05
