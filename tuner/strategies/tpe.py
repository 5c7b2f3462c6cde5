"""Optuna's TPE sampler over the space, its proposals narrowed to the candidates.

TPE samples the whole space. A suggestion that cannot fit the target, that launches what the level has
measured already, or that the level measured itself costs no launch: the study records it as a pruned
Optuna trial with its reason, which TPE learns from, and asks again (:data:`MAX_ASKS` times, then the
first open candidate). Only measurements count against the budget.
"""

from __future__ import annotations

import optuna

from sparse_mla_tuner.tuner.strategies.base import Level
from sparse_mla_tuner.tuner.strategies.base import Strategy

MAX_ASKS = 50  # suggestions per measurement before the first open candidate is taken instead


class Tpe(Strategy):
    name = "tpe"
    asks = True

    def sampler(self, seed: int):
        return optuna.samplers.TPESampler(seed=seed)

    def propose(self, level: Level, n: int) -> list:
        return level.open()[:n]  # the fallback when TPE keeps suggesting what is not a candidate
