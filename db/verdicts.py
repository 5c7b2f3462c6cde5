"""The words every layer uses for outcomes: one definition, imported everywhere."""

from __future__ import annotations

import enum


class Verdict(enum.StrEnum):
    """What happened to one config at one concurrency."""

    OK = "ok"  # passed the correctness gate and was timed
    INFEASIBLE = "infeasible"  # does not fit the target (compile-only check) or the GPU at launch
    WRONG = "wrong"  # failed the correctness gate; never eligible for best or export
    CRASHED = "crashed"  # the measurement process died or raised
    TIMEOUT = "timeout"  # no answer within the trial timeout
    DUPLICATE = "duplicate"  # launches exactly what another trial of the study measured (same numbers)
    MISSING = "missing"  # replay backend: no recorded samples for this config; never picked


class Effect(enum.StrEnum):
    """A candidate against the baseline, judged against the noise band."""

    WIN = "win"
    FLAT = "flat"
    REGRESSION = "regression"


class Phase(enum.StrEnum):
    """Which measurement a sample or statistic belongs to."""

    SCREEN = "screen"  # the study's rounds of every config
    FINALIST = "finalist"  # more rounds for the top configs
