"""A study's noise band and its reference: what its verdicts and Optuna's values are measured against.

:class:`StudyNoise` is the part of :class:`tuner.study.StudyRun` that finds each GPU's band (this kernel's
stored calibration, else a short A/A now; another kernel's calibration is never used) and fixes the one
scale of Optuna's values, ``reference_us``: the baseline's median in this study's own baseline trial.
"""

from __future__ import annotations

import json
import time

import numpy as np
from sqlalchemy import select

from sparse_mla_tuner.db import queries
from sparse_mla_tuner.db import record
from sparse_mla_tuner.db.models import TrialModel
from sparse_mla_tuner.db.verdicts import Phase
from sparse_mla_tuner.db.verdicts import Verdict
from sparse_mla_tuner.tuner import calibrate
from sparse_mla_tuner.tuner import stats
from sparse_mla_tuner.tuner.recorder import measurement_seed
from sparse_mla_tuner.tuner.recorder import recorded_kernel
from sparse_mla_tuner.tuner.recorder import shared_write


class StudyNoise:
    """Mixed into :class:`tuner.study.StudyRun` (which holds plan, store, study, opts and the ids)."""

    def _noise_band(self, proc) -> tuple[int, float]:
        """The band this GPU's verdicts use in the study: ``max(spread, min_effect)``, the spread from the
        latest calibration of this kernel in this environment, workload and concurrency, else from a short
        A/A now. A calibration of another kernel is never used: it measured other binaries."""
        plan, host, gpu = self.plan, proc.info["host"], proc.gpu_index
        min_effect = plan.space.measurement.get("min_effect", stats.DEFAULT_MIN_EFFECT)
        with self.store.session() as s:
            env_id = queries.ensure_environment(s, proc.info).id
            known = record.noise_band(s, self.study_id, host, gpu)
            cal = queries.latest_calibration(
                s, env_id, self.workload_id, plan.concurrency, self.opts.backend, kernel_id=self.kernel_id
            )
            if known is None and cal is not None:
                spread, multimodal, samples = cal.spread, cal.multimodal, json.loads(cal.samples)
        if known is not None:
            self.band = known[0]
            self._aa_us = self._aa_us or float(np.median([a for a, _ in known[1]]))
            return env_id, known[0]
        if cal is None:
            base = plan.space.baseline
            pairs = calibrate.study_pairs(plan.space.measurement["rounds"])
            self.bar.phase(f"A/A of the baseline, {pairs} independent capture pairs")
            seed = measurement_seed(self.opts.seed, base, f"{plan.concurrency}/aa")
            with self.clock.section("gpu"):
                c = calibrate.measure(proc, plan.space, plan.workload, plan.concurrency, base, pairs, seed=seed)
            with self.store.session() as s:
                calibrate.store_calibration(
                    s,
                    c,
                    proc.info,
                    plan.spec,
                    plan.concurrency,
                    self.opts.backend,
                    base,
                    recorded_kernel(self.opts, plan.space.adapter),
                )
            spread, multimodal, samples = c.spread, c.multimodal, c.samples
        band = self.band = stats.band(spread, min_effect)
        self._aa_us = self._aa_us or float(np.median([a for a, _ in samples]))
        shared_write(lambda: self.study.set_user_attr("noise_band", band))
        with self.store.session() as s:
            record.add_noise(s, self.study_id, host, gpu, band, samples)
            record.set_study_noise(s, self.study_id, band, spread, min_effect, multimodal, len(samples))
        if multimodal:
            self.ui.warn(
                f"warning: the baseline's A/A samples look multimodal (two speeds) at C={plan.concurrency}; "
                "treat close calls with care"
            )
        return env_id, band

    def reference(self) -> float:
        """The one scale of Optuna's values in this study, fixed when the first value is told and kept across
        resumes, GPUs and processes (so Optuna orders trials as the ratios do): the baseline's median in this
        study's own baseline trial, which is queued first.

        Every process that shares the study must use the same number, or Optuna's best is not the tuner's
        (two processes each holding the scale they computed gave two scales in one study). So the number is
        read where all of them see it: the value already stored with the study, else the baseline trial as
        the database recorded it. A process that has a value to tell before the baseline is recorded (a
        screening trial ends before the baseline's full rounds) waits for it, at most one trial's time limit;
        only when the baseline cannot give it (not feasible, not ok, never recorded) does this kernel's A/A
        median stand in."""
        if self.reference_us is not None:
            return self.reference_us
        base = self.plan.space.baseline
        verdict = self.plan.verdicts.get(base)
        wait_s = self.plan.space.measurement["trial_timeout_s"] if verdict is not None and verdict.feasible else 0
        deadline = time.monotonic() + wait_s
        while True:
            stored = self.storage.get_study_user_attrs(self.optuna_study_id).get("reference_us")
            if stored:
                self.reference_us = float(stored)
                return self.reference_us
            recorded, ref = self._recorded_baseline_us()
            if ref is None and (recorded or self._baseline_us or time.monotonic() >= deadline):
                ref = self._baseline_us or self._aa_us  # the baseline cannot give it: the A/A stands in
            if ref is not None:
                break
            time.sleep(0.1)
        shared_write(lambda: self.study.set_user_attr("reference_us", ref))
        self.reference_us = ref
        return ref

    def _recorded_baseline_us(self) -> tuple[bool, float | None]:
        """(whether this study's baseline trial is recorded, its baseline median in µs when it is ok)."""
        with self.store.session() as s:
            t = s.scalar(select(TrialModel).filter_by(study_id=self.study_id, config_key=str(self.plan.space.baseline)))
            if t is None:
                return False, None
            st = t.statistic(Phase.SCREEN) if t.verdict == Verdict.OK else None
            return True, (float(st.baseline_median_us) if st is not None else None)
