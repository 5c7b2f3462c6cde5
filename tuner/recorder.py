"""What a study records: the tuner's rows (trials, raw samples, statistics, noise bands, the study-wide calls).

:class:`StudyRecorder` is half of the recording part of a study (:mod:`tuner.study`); the other half is what
Optuna is told (:class:`tuner.optuna_study.OptunaStudy`). Both take values and return values: neither reads the
study's other parts.
"""

from __future__ import annotations

import json
import re
import time
import zlib

import numpy as np
import optuna
from sqlalchemy import select

from ..db import queries
from ..db import record
from ..db.errors import DatabaseError
from ..db.errors import DatabaseGoneError
from ..db.models import StudyModel
from ..db.models import TrialModel
from ..db.models import config_fields
from ..db.models import get_or_create
from ..db.verdicts import Effect
from ..db.verdicts import Phase
from ..db.verdicts import Verdict
from . import calibrate
from . import stats
from .adapter import stored_launch
from .candidates import LAUNCHED
from .errors import SpaceError
from .protocol import MeasureReply
from .summary import summary_row

KernelConfig = object  # annotations: the adapter's config type


def recorded_kernel(opts, adapter) -> str:
    """The kernel hash a search records its studies, trials and A/A under: this code's (the space's adapter's
    :meth:`~tuner.adapter.KernelAdapter.source_hash`), unless ``opts.record_kernel`` names another (a benchmark
    replaying one kernel's records as another kernel's priors)."""
    return opts.record_kernel or adapter.source_hash()


def slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", s).strip("_")


def study_name(space: str, workload: str, concurrency: int, device: str, backend: str, kernel: str) -> str:
    return f"{space}/{workload}/C{concurrency}/{slug(device)}/{backend}/k{kernel}"


class StudyRecorder:
    """The tuner's rows of one study: its study row, trials, raw samples, statistics, noise bands and the
    study-wide calls. It takes values and returns values; what Optuna is told is :mod:`tuner.optuna_study`'s."""

    def __init__(self, plan, store, opts, info: dict) -> None:
        self.plan, self.store, self.opts, self.info = plan, store, opts, info
        self.kernel_hash = recorded_kernel(opts, plan.space.adapter)
        self.name = study_name(
            plan.space.name, plan.spec.name, plan.concurrency, info["gpu_name"], opts.backend, self.kernel_hash
        )
        self.study_id = self.kernel_id = self.workload_id = self.env_id = 0  # set by open()
        self._since = (0, 0)  # the newest trial and statistic measured_since() has returned

    # --- the study's rows --------------------------------------------------------------------------------------

    def open(self) -> set[KernelConfig]:
        """The study's database rows (created if new); returns the configs it has already recorded. With
        ``--remeasure`` a fresh study beside the old ones: nothing measured before is lost."""
        plan, base = self.plan, self.name
        with self.store.session() as s:
            env = queries.ensure_environment(s, self.info)
            adapter = plan.space.adapter.spec
            kernel = queries.ensure_kernel(s, self.kernel_hash, adapter)
            wrow = queries.ensure_workload(s, adapter, **plan.spec.fields())
            space = plan.space
            srow = queries.ensure_space(s, space.name, space.text_hash, space.text, space.path, adapter)
            if self.opts.remeasure:
                n_old = s.query(StudyModel).filter(StudyModel.name.like(base + "%")).count()
                self.name = f"{base}#r{n_old + 1}" if n_old else base
            row = s.query(StudyModel).filter_by(name=self.name).one_or_none() or get_or_create(
                s,
                StudyModel,
                name=self.name,
                space_id=srow.id,
                workload_id=wrow.id,
                environment_id=env.id,
                kernel_id=kernel.id,
                concurrency=plan.concurrency,
                backend=self.opts.backend,
            )
            row = row or s.query(StudyModel).filter_by(name=self.name).one()  # another process made it meanwhile
            if row.space_id != srow.id or row.workload_id != wrow.id:  # the space file changed: go on unless it may not
                old_wl = row.workload.description()
                problem = plan.space.resume_problem(row.space.text, self.name, old_wl, plan.spec)
                if problem:
                    raise SpaceError(problem)
            self.study_id, self.kernel_id, self.workload_id, self.env_id = row.id, kernel.id, wrow.id, env.id
            return set(self._configs(queries.done_keys(s, row.id)))

    def _configs(self, keys) -> list[KernelConfig]:
        """Stored config keys as this kernel's configs, in order (a key of another version of its parameters is
        left out)."""
        return [c for c in (known_config(self.plan.space.adapter.config_type, k) for k in keys) if c is not None]

    def done(self) -> set[KernelConfig]:
        """The configs this study has recorded."""
        with self.store.session() as s:
            return set(self._configs(queries.done_keys(s, self.study_id)))

    def recorded(self, cfg: KernelConfig) -> bool:
        """Whether this study has recorded ``cfg``."""
        with self.store.session() as s:
            return queries.is_recorded(s, self.study_id, str(cfg))

    def n_launched(self) -> int:
        """The distinct launches this study has measured (whatever came of them)."""
        rep = self.plan.representatives()
        with self.store.session() as s:
            rows = queries.done_verdicts(s, self.study_id)
        launched = self._configs(k for k, v in rows.items() if v in LAUNCHED)
        return len({rep[c] for c in launched if c in rep})

    def measured_since(self) -> list[tuple[KernelConfig, Verdict, float | None]]:
        """``(config, verdict, ratio or None)`` of every trial recorded, or given a statistic, since the last call
        (by this process or another), in id order: the level's state read incrementally."""
        last_trial, last_stat = self._since
        with self.store.session() as s:
            out = []
            for trial_id, key, verdict, ratio, stat_id in queries.done_since(s, self.study_id, last_trial, last_stat):
                last_trial, last_stat = max(last_trial, trial_id), max(last_stat, stat_id)
                cfg = known_config(self.plan.space.adapter.config_type, key)
                if cfg is not None:
                    out.append((cfg, Verdict(verdict), ratio))
        self._since = (last_trial, last_stat)
        return out

    def measured_launch(self, key: str) -> int | None:
        """The trial of this study that already measured the launch ``key``, if any."""
        with self.store.session() as s:
            return queries.measured_launch(s, self.study_id, key)

    def prior_ranked(self) -> list[KernelConfig]:
        """The previous kernel's configs here, best first (see :func:`db.queries.prior_picks`); a config of
        another version of the parameters is left out."""
        plan, where = self.plan, {"device": self.info["gpu_name"], "backend": self.opts.backend}
        with self.store.session() as s:
            keys = queries.prior_picks(
                s, self.kernel_id, plan.concurrency, n=None, space=plan.space.name, workload=plan.spec.name, **where
            )
        return self._configs(keys)

    def history(self, known: SpaceHistory | None = None) -> list:
        """Every recorded trial of this space's workload on this backend (:func:`db.queries.history`); with
        ``known`` (the search's :class:`SpaceHistory` of this workload) only what changed since its last read."""
        known = known or SpaceHistory()
        with self.store.session() as s:
            return known.read(s, self.plan.space.name, self.plan.spec.name, self.opts.backend)

    def recorded_ok(self, cfg: KernelConfig) -> tuple | None:
        """``(trial id, screening statistic, finalist statistic or None)`` of ``cfg``'s ok trial, if recorded."""
        with self.store.session() as s:
            t = queries.done_configs(s, self.study_id).get(str(cfg))
            if t is None or t.verdict != Verdict.OK or t.statistic(Phase.SCREEN) is None:
                return None
            return t.id, t.statistic(Phase.SCREEN), t.statistic(Phase.FINALIST)

    def recorded_baseline_us(self) -> tuple[bool, float | None]:
        """(whether this study's baseline trial is recorded, its baseline median in µs when it is ok)."""
        with self.store.session() as s:
            t = s.scalar(select(TrialModel).filter_by(study_id=self.study_id, config_key=str(self.plan.space.baseline)))
            if t is None:
                return False, None
            st = t.statistic(Phase.SCREEN) if t.verdict == Verdict.OK else None
            return True, (float(st.baseline_median_us) if st is not None else None)

    def finished(self) -> tuple[str, int | None] | None:
        """``(why the level stopped, the --n-trials cap it ran under)`` when a run finished it, else None: the
        tuner's own record, whatever holds Optuna's queue (an in-memory one forgets it)."""
        with self.store.session() as s:
            row = s.get(StudyModel, self.study_id)
            return (row.stopped, row.stopped_n_trials) if row is not None and row.stopped else None

    def set_finished(self, stopped: str | None, n_trials: int | None) -> None:
        """Record that the level finished (``stopped``: why, under ``n_trials``), or that it reopened (None)."""
        with self.store.session() as s:
            record.set_study_stopped(s, self.study_id, stopped, n_trials)

    def summary_row(self) -> dict:
        with self.store.session() as s:
            return summary_row(s, self.study_id, self.plan.spec.name, self.plan.concurrency)

    # --- writes -------------------------------------------------------------------------------------------------

    def trial(self, proc, env_id, cfg: KernelConfig, reply: MeasureReply, band, number, wall_s, key, original):
        """Write the trial, its raw samples and its statistic in one transaction.

        Returns ``(trial id, statistic or None)``, or False when another process already recorded this config.
        """
        fields = trial_fields(self, env_id, cfg, reply, number, wall_s, key, original)
        with self.store.session() as s:
            trial_id = record.insert_trial(s, **fields)
            if trial_id is None:
                return False
            if not reply.samples:  # only an ok measurement has samples
                return trial_id, None
            return trial_id, add_samples(s, trial_id, Phase.SCREEN, reply, proc.gpu_index, band, seed=trial_id)

    def unlaunched(self, items: list[tuple]) -> list[int | None]:
        """Configs decided without a launch, ``(cfg, reply, launch key, original trial id)`` each, in one
        transaction; their trial ids (None where another process recorded the config first)."""
        rows = [
            trial_fields(self, self.env_id, cfg, reply, None, 0.0, key, original) for cfg, reply, key, original in items
        ]
        with self.store.session() as s:
            return record.add_trials(s, rows)

    def infeasible(self) -> list[tuple]:
        """The configs that do not fit the target and are not recorded yet, as :meth:`unlaunched` items."""
        done = self.done()
        return [
            (cfg, MeasureReply(Verdict.INFEASIBLE, feas.reason), None, None)
            for cfg, feas in self.plan.verdicts.items()
            if not feas.feasible and cfg not in done
        ]

    def duplicates(self) -> list[tuple]:
        """Every config whose launch another trial of the study measured, as :meth:`unlaunched` items."""
        config_type = self.plan.space.adapter.config_type
        with self.store.session() as s:
            rows = queries.done_launches(s, self.study_id)
        done = {c: (i, dup) for k, i, dup in rows if (c := known_config(config_type, k)) is not None}
        items = []
        for identity, group in self.plan.launches().items():
            original = next((c for c in group if c in done and done[c][1] is None), None)
            key = stored_launch(identity)
            for cfg in group:
                if original is None or cfg in done:
                    continue
                why = f"launches exactly what trial {done[original][0]} ({original}) measured"
                items.append((cfg, MeasureReply(Verdict.DUPLICATE, why), key, done[original][0]))
        return items

    def finalist(self, proc, trial_id: int, reply: MeasureReply, band: float):
        """A finalist's samples and statistic; None when its measurement failed or another host stored it first."""
        if reply.verdict != Verdict.OK:
            return None
        try:
            with self.store.session() as s, s.begin_nested():
                return add_samples(s, trial_id, Phase.FINALIST, reply, proc.gpu_index, band, seed=trial_id)
        except DatabaseGoneError:
            raise  # every later write fails too
        except DatabaseError:
            return None  # another host re-measured this finalist first

    def finalists_todo(self, proc) -> tuple[list[tuple], float]:
        """The top ``finalists`` by screening ratio without a finalist statistic yet, ``(trial id, config,
        screening statistic)`` each, and the band ``proc``'s GPU uses here."""
        k = self.plan.space.measurement["finalists"]
        with self.store.session() as s:
            ok = [
                t
                for t in queries.done_configs(s, self.study_id).values()
                if t.verdict == Verdict.OK and t.statistic(Phase.SCREEN)
            ]
            ok.sort(key=lambda t: t.statistic(Phase.SCREEN).ratio)  # the estimator that ranks and judges
            config_type = self.plan.space.adapter.config_type
            todo = [
                (t.id, config_type.from_dict(t.param_values()), t.statistic(Phase.SCREEN))
                for t in ok[:k]
                if not t.statistic(Phase.FINALIST)
            ]
            known = record.noise_band(s, self.study_id, proc.info["host"], proc.gpu_index)
            band = known[0] if known else (s.get(StudyModel, self.study_id).noise_band or 0.0)
        return todo, band

    def decide(self) -> None:
        """The study-wide calls: Benjamini-Hochberg over the per-trial p-values of each phase."""
        with self.store.session() as s:
            trials = [t for t in queries.done_configs(s, self.study_id).values() if t.verdict == Verdict.OK]
            for phase in Phase:
                rows = [st for t in trials if (st := t.statistic(phase)) is not None and st.p_value is not None]
                effects = stats.decide([(st.p_value, _direction(st)) for st in rows])
                record.set_effects(s, {st.id: e for st, e in zip(rows, effects, strict=True)})


def trial_fields(
    rec: StudyRecorder, env_id, cfg: KernelConfig, reply: MeasureReply, number, wall_s, key, original
) -> dict:
    """One ``tuner_trials`` row's fields, of a config of ``rec``'s study."""
    feas = rec.plan.verdicts[cfg]
    return dict(
        study_id=rec.study_id,
        workload_id=rec.workload_id,
        environment_id=env_id,
        kernel_id=rec.kernel_id,
        concurrency=rec.plan.concurrency,
        backend=rec.opts.backend,
        config_key=str(cfg),
        **config_fields(rec.plan.space.adapter.spec, cfg.as_dict()),
        num_splits=reply.num_splits,
        launch_key=key,
        duplicate_of=original,
        is_baseline=cfg == rec.plan.space.baseline,
        verdict=reply.verdict,
        reason=reply.reason or (feas.reason if feas.feasible else ""),
        shared_bytes=feas.shared_bytes,
        limit_bytes=feas.limit_bytes,
        registers=feas.registers,
        spill_bytes=feas.spill_bytes,
        estimate_bytes=feas.estimate_bytes,
        out_rel_err=reply.out_rel_err,
        lse_abs_err=reply.lse_abs_err,
        optuna_study=rec.name,
        optuna_trial_number=number,
        wall_s=wall_s,
    )


class SpaceHistory:
    """The history of one workload of a space as a search reads it level after level: read whole once, then only the
    trials recorded or given a statistic since (:func:`db.queries.history` with the ids seen), so a level's opening
    no longer reads every kernel's trials again (1.5-2 s a level on a copy of the H200's results)."""

    def __init__(self) -> None:
        self._rows: dict[int, queries.HistoryRow] = {}  # by trial id
        self._since = (0, 0)  # the newest trial id and statistic id read

    def read(self, session, space: str, workload: str, backend: str) -> list:
        """Every trial, oldest first, as :func:`db.queries.history` returns them all."""
        last_trial, last_stat = self._since
        for row in queries.history(session, space, workload, backend, last_trial, last_stat):
            self._rows[row.trial_id] = row
            last_trial, last_stat = max(last_trial, row.trial_id), max(last_stat, row.stat_id)
        self._since = (last_trial, last_stat)
        return [self._rows[k] for k in sorted(self._rows)]


class NoiseRecords:
    """The noise rows of one study: the band each GPU uses in it, and this kernel's A/A calibrations (the tuner's
    rows, as :class:`StudyRecorder`'s, whose study it reads once that is open)."""

    def __init__(self, records: StudyRecorder) -> None:
        self.records = records

    def noise(self, proc) -> tuple[int, tuple | None, tuple | None]:
        """``(environment id, (band, A/A samples) this GPU already uses here or None, (spread, multimodal,
        samples) of this kernel's latest calibration here or None)``."""
        r = self.records
        with r.store.session() as s:
            env_id = queries.ensure_environment(s, proc.info).id
            known = record.noise_band(s, r.study_id, proc.info["host"], proc.gpu_index)
            cal = queries.latest_calibration(
                s, env_id, r.workload_id, r.plan.concurrency, r.opts.backend, kernel_id=r.kernel_id
            )
            stored = None if cal is None else (cal.spread, cal.multimodal, json.loads(cal.samples))
        return env_id, known, stored

    def calibration(self, proc, c) -> None:
        """An A/A this study measured, stored as this kernel's calibration here."""
        r, plan = self.records, self.records.plan
        with r.store.session() as s:
            calibrate.store_calibration(
                s,
                c,
                proc.info,
                plan.spec,
                plan.concurrency,
                r.opts.backend,
                plan.space.baseline,
                r.kernel_hash,
                plan.space.adapter,
            )

    def band(self, proc, band: float, spread: float, min_effect: float, multimodal: bool, samples) -> None:
        """The band one GPU uses in this study, with the A/A it comes from."""
        r = self.records
        with r.store.session() as s:
            record.add_noise(s, r.study_id, proc.info["host"], proc.gpu_index, band, samples)
            record.set_study_noise(s, r.study_id, band, spread, min_effect, multimodal, len(samples))


def add_samples(s, trial_id: int, phase: Phase, reply: MeasureReply, gpu_index: int, band: float, seed: int):
    c, b = zip(*reply.samples, strict=True)
    ps = stats.paired(c, b, seed=seed)
    p, _ = ps.p_value(band)
    same = ("n", "median_us", "ci_low_us", "ci_high_us", "baseline_median_us", "ratio", "ratio_ci_low", "ratio_ci_high")
    summary = record.Summary(**{f: getattr(ps, f) for f in same}, noise_band=band, effect=ps.classify(band), p_value=p)
    return record.add_samples(s, trial_id, phase, reply.samples, reply.replays, gpu_index, summary)


def ok_attrs(screen, final=None) -> dict:
    """What Optuna shows of an ok trial: the phase whose estimate is its value, that estimate, and both phases."""
    told = final or screen
    attrs = {
        "phase": Phase(told.phase).value,
        "ratio": told.ratio,
        "ratio_ci": [told.ratio_ci_low, told.ratio_ci_high],
        "effect": told.classification,
        "median_us_measured": told.median_us,
        "screening_ratio": screen.ratio,
        "screening_median_us": screen.median_us,
    }
    if final is not None:
        attrs |= {"finalist_median_us": final.median_us, "finalist_rounds": final.n}
    return attrs


def shared_write(write, attempts: int = 5) -> None:
    """A study attribute that several processes (or hosts) may write at the same moment: Optuna inserts
    it if missing, so two first writers can collide on the unique key; the loser retries (then updates)."""
    for i in range(attempts):
        try:
            return write()
        except optuna.exceptions.StorageInternalError:
            if i == attempts - 1:
                raise
            time.sleep(0.05 * (i + 1))


def measurement_seed(run_seed: int, cfg: KernelConfig, phase: str) -> int:
    """The seed of one measurement: fixed by the run's ``--seed``, the config and the phase (not by the trial's
    number), so a replayed config draws the same rounds whichever strategy measures it, in whatever order."""
    return zlib.crc32(f"{run_seed}/{cfg}/{phase}".encode()) & 0x7FFFFFFF


def known_config(config_type, key: str):
    """A stored config key as this version's config; None when it names a parameter or value this version does
    not know (a record of an older or newer kernel)."""
    try:
        return config_type.parse(key)
    except (TypeError, ValueError):
        return None


def baseline_median(samples) -> float:
    """The baseline's median µs in a list of (candidate, baseline) rounds."""
    return float(np.median([b for _, b in samples]))


def _direction(st) -> Effect:
    return Effect.WIN if st.ratio < 1.0 else Effect.REGRESSION
