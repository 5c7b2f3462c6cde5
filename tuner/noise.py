"""How a study measures: screening by successive halving, finalist rounds, the A/A and the noise band.

:class:`Measurer` is one of a study's three parts (:mod:`tuner.study`). It sends measurement requests to a
measurement process and returns what came back; it records nothing (the study hands its replies to its
records). Each GPU's band is that GPU's stored band in this study, else this kernel's stored calibration, else
a short A/A now (another kernel's calibration is never used: it measured other binaries), and never less than
the space's ``min_effect``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..db.verdicts import Phase
from ..db.verdicts import Verdict
from . import calibrate
from . import stats
from .protocol import MeasureReply
from .recorder import measurement_seed

KernelConfig = object  # annotations: the adapter's config type


class Measurer:
    """The measurements of one study (one workload at one concurrency): what each request asks, in which
    phase, with which seed, and the time it takes on the study's clock (``gpu``)."""

    def __init__(self, plan, seed: int, clock) -> None:
        self.plan, self.seed, self.clock = plan, seed, clock
        self.measurement = plan.space.measurement
        self.min_effect = self.measurement.get("min_effect", stats.DEFAULT_MIN_EFFECT)
        self.aa_us: float | None = None  # the median of the A/A this study's band comes from

    def measure(self, proc, cfg: KernelConfig, phase: str, rounds: int, check: bool) -> MeasureReply:
        """``rounds`` paired rounds of ``cfg`` against the baseline (``check``: through the correctness gate)."""
        feas = self.plan.verdicts[cfg]
        if not feas.feasible:
            return MeasureReply(Verdict.INFEASIBLE, feas.reason)
        seed = measurement_seed(self.seed, cfg, f"{self.plan.concurrency}/{phase}")
        req = self.plan.request(cfg, seed, rounds, check)
        with self.clock.section("gpu"):
            return proc.measure(req, timeout_s=self.measurement["trial_timeout_s"])

    def screen(self, proc, cfg: KernelConfig, promising) -> MeasureReply:
        """The screening rounds of one launch, by successive halving: ``screen_rounds`` first, then the rest of
        ``rounds`` only if ``promising(samples)`` says the launch earned them; the baseline always gets all."""
        rounds, first = self.measurement["rounds"], self.measurement.get("screen_rounds", self.measurement["rounds"])
        if cfg == self.plan.space.baseline or first >= rounds:
            return self.measure(proc, cfg, Phase.SCREEN, rounds, check=True)
        reply = self.measure(proc, cfg, Phase.SCREEN, first, check=True)
        if reply.verdict != Verdict.OK or not reply.samples or not promising(reply.samples):
            return reply
        more = self.measure(proc, cfg, f"{Phase.SCREEN}/promoted", rounds - first, check=False)
        if more.verdict != Verdict.OK:
            return more
        return dataclasses.replace(reply, samples=[*reply.samples, *more.samples])

    def finalist(self, proc, cfg: KernelConfig) -> MeasureReply:
        """A finalist's re-measurement: ``finalist_rounds`` more rounds, no gate (it passed at screening)."""
        return self.measure(proc, cfg, Phase.FINALIST, self.measurement["finalist_rounds"], check=False)

    def aa(self, proc, announce) -> calibrate.Calibration:
        """A short A/A of the baseline on ``proc``: what the band comes from when nothing is stored
        (``announce``: where the progress line says so)."""
        plan, base = self.plan, self.plan.space.baseline
        pairs = calibrate.study_pairs(self.measurement["rounds"])
        announce(f"A/A of the baseline, {pairs} independent capture pairs")
        seed = measurement_seed(self.seed, base, f"{plan.concurrency}/aa")
        with self.clock.section("gpu"):
            return calibrate.measure(proc, plan.space, plan.workload, plan.concurrency, base, pairs, seed=seed)

    def band(self, spread: float, samples) -> float:
        """The band of a GPU whose A/A gave ``spread`` and ``samples``: ``max(spread, min_effect)``."""
        self.aa_us = self.aa_us or float(np.median([a for a, _ in samples]))
        return stats.band(spread, self.min_effect)

    def known_band(self, band: float, samples) -> float:
        """The band this GPU already uses in the study (a resumed or joined study), with its A/A samples."""
        self.aa_us = self.aa_us or float(np.median([a for a, _ in samples]))
        return band
