"""How a study records: the tuner's rows (trials, raw samples, statistics) and what Optuna is told.

Two rules keep Optuna's view equal to the tuner's. Every value Optuna holds is the paired ratio times the
study's one reference (``reference_us``: this study's own baseline median), so Optuna orders trials as the
tuner ranks them and optuna-dashboard plots µs within noise of what was measured; and a screening result
that beats every value told so far gets its finalist rounds before Optuna is told
(:meth:`StudyRun._record_finalist <tuner.study.StudyRun>`).
"""

from __future__ import annotations

import re
import time
import zlib

import numpy as np
import optuna

from sparse_mla_tuner.db import queries
from sparse_mla_tuner.db import record
from sparse_mla_tuner.db.errors import DatabaseError
from sparse_mla_tuner.db.errors import DatabaseGoneError
from sparse_mla_tuner.db.models import StudyModel
from sparse_mla_tuner.db.models import get_or_create
from sparse_mla_tuner.db.verdicts import Effect
from sparse_mla_tuner.db.verdicts import Phase
from sparse_mla_tuner.db.verdicts import Verdict
from sparse_mla_tuner.tuner import optuna_rows
from sparse_mla_tuner.tuner import stats
from sparse_mla_tuner.tuner.errors import SpaceError
from sparse_mla_tuner.tuner.heartbeat import OWNER_ATTR
from sparse_mla_tuner.tuner.heartbeat import owner
from sparse_mla_tuner.tuner.heartbeat import owner_alive
from sparse_mla_tuner.tuner.protocol import MeasureReply

KernelConfig = object  # annotations: the adapter's config type

RUNNING, COMPLETE, FAIL = (
    optuna.trial.TrialState.RUNNING,
    optuna.trial.TrialState.COMPLETE,
    optuna.trial.TrialState.FAIL,
)


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
    """The writes of one study: its database rows and its Optuna trials."""

    def __init__(self, run) -> None:
        self.run = run  # tuner.study.StudyRun: plan, store, study, ids, reference_us

    def trial(
        self, proc, env_id, cfg: KernelConfig, reply: MeasureReply, band, number, wall_s, key=None, original=None
    ):
        """Write the trial, its raw samples and its statistic in one transaction.

        Returns ``(trial id, statistic or None)``, or False when another process already recorded this config.
        """
        run = self.run
        fields = self._fields(proc, env_id, cfg, reply, number, wall_s, key, original)
        with run.store.session() as s:
            t = record.add_trial(s, **fields)
            if t is None:
                return False
            if not reply.samples:  # only an ok measurement has samples
                return t.id, None
            return t.id, add_samples(s, t.id, Phase.SCREEN, reply, proc.gpu_index, band, seed=t.id)

    def _fields(self, proc, env_id, cfg: KernelConfig, reply: MeasureReply, number, wall_s, key, original) -> dict:
        """One ``tuner_trials`` row's fields."""
        run = self.run
        feas = run.plan.verdicts[cfg]
        return dict(
            study_id=run.study_id,
            workload_id=run.workload_id,
            environment_id=env_id,
            kernel_id=run.kernel_id,
            concurrency=run.plan.concurrency,
            backend=run.opts.backend,
            config_key=str(cfg),
            **cfg.as_dict(),
            num_splits=reply.num_splits,
            launch_key=key,
            duplicate_of=original,
            is_baseline=cfg == run.plan.space.baseline,
            verdict=reply.verdict,
            reason=reply.reason or (feas.reason if feas.feasible else ""),
            shared_bytes=feas.shared_bytes,
            limit_bytes=feas.limit_bytes,
            registers=feas.registers,
            spill_bytes=feas.spill_bytes,
            estimate_bytes=feas.estimate_bytes,
            out_rel_err=reply.out_rel_err,
            lse_abs_err=reply.lse_abs_err,
            optuna_study=run.name,
            optuna_trial_number=number,
            wall_s=wall_s,
        )

    def unlaunched(self, items: list[tuple]) -> None:
        """Configs decided without a launch, ``(cfg, reply, launch key, original trial id)`` each: the tuner's rows
        in one transaction, then one pruned Optuna trial each with the reason, in another."""
        run = self.run
        if not items:
            return
        env_id = run.env_id()
        rows = [self._fields(None, env_id, cfg, reply, None, 0.0, key, original) for cfg, reply, key, original in items]
        with run.store.session() as s:
            ids = record.add_trials(s, rows)
        made = []
        for (cfg, reply, _, original), trial_id in zip(items, ids, strict=True):
            if trial_id is None:
                continue  # another process recorded it first
            attrs = {"tuner_trial_id": trial_id, "verdict": reply.verdict.value, "reason": reply.reason[:500]}
            if original is not None:
                attrs["duplicate_of"] = original
            made.append(
                optuna.trial.create_trial(
                    state=optuna.trial.TrialState.PRUNED,
                    params=cfg.as_dict(),
                    distributions=run.dists,
                    user_attrs=attrs,
                )
            )
        optuna_rows.add_finished(run.study, made)

    def infeasible(self, done: set[str]) -> None:
        """Configs that do not fit the target are recorded at once, with their numbers; nothing launches."""
        run = self.run
        items = [
            (cfg, MeasureReply(Verdict.INFEASIBLE, feas.reason), None, None)
            for cfg, feas in run.plan.verdicts.items()
            if not feas.feasible and str(cfg) not in done
        ]
        self.unlaunched(items)
        done.update(str(cfg) for cfg, *_ in items)

    def duplicates(self) -> None:
        """Every config whose launch was measured by another trial of the study, recorded as its duplicate."""
        run = self.run
        with run.store.session() as s:
            done = {k: (t.id, t.duplicate_of) for k, t in queries.done_configs(s, run.study_id).items()}
        items = []
        for key, group in run.plan.launches().items():
            original = next((str(c) for c in group if str(c) in done and done[str(c)][1] is None), None)
            for cfg in group:
                if original is None or str(cfg) in done:
                    continue
                why = f"launches exactly what trial {done[original][0]} ({original}) measured"
                items.append((cfg, MeasureReply(Verdict.DUPLICATE, why), key, done[original][0]))
        self.unlaunched(items)

    def finalist(self, proc, trial_id: int, cfg: KernelConfig, band: float):
        """Measure one finalist and store its statistic; None when it failed or another host stored it first."""
        run = self.run
        rounds = run.plan.space.measurement["finalist_rounds"]
        reply = run.measure(proc, cfg, Phase.FINALIST, rounds, check=False)
        if reply.verdict != Verdict.OK:
            return None
        try:
            with run.store.session() as s, s.begin_nested():
                return add_samples(s, trial_id, Phase.FINALIST, reply, proc.gpu_index, band, seed=trial_id)
        except DatabaseGoneError:
            raise  # every later write fails too
        except DatabaseError:
            return None  # another host re-measured this finalist first

    def optuna_trial(self, cfg: KernelConfig, state, attrs: dict, ratio: float | None = None) -> None:
        """A finished trial added to the Optuna study without launching anything through it."""
        run = self.run
        value = None if ratio is None else ratio * run.reference()
        trial = optuna.trial.create_trial(
            state=state, params=cfg.as_dict(), distributions=run.dists, value=value, user_attrs=attrs
        )
        run.study.add_trial(trial)

    def decide(self) -> None:
        """The study-wide calls: Benjamini-Hochberg over the per-trial p-values of each phase."""
        run = self.run
        with run.store.session() as s:
            trials = [t for t in queries.done_configs(s, run.study_id).values() if t.verdict == Verdict.OK]
            for phase in Phase:
                rows = [st for t in trials if (st := t.statistic(phase)) is not None and st.p_value is not None]
                effects = stats.decide([(st.p_value, _direction(st)) for st in rows])
                record.set_effects(s, {st.id: e for st, e in zip(rows, effects, strict=True)})

    def finalists(self, proc) -> None:
        """Re-measure the top ``finalists`` by screening ratio that have no finalist statistic yet with
        ``finalist_rounds``, on one GPU, against its own band; each is an Optuna trial of its own."""
        run = self.run
        k, rounds = run.plan.space.measurement["finalists"], run.plan.space.measurement["finalist_rounds"]
        with run.store.session() as s:
            ok = [
                t
                for t in queries.done_configs(s, run.study_id).values()
                if t.verdict == Verdict.OK and t.statistic(Phase.SCREEN)
            ]
            ok.sort(key=lambda t: t.statistic(Phase.SCREEN).ratio)  # the estimator that ranks and judges
            todo = [(t.id, t.config(), t.statistic(Phase.SCREEN)) for t in ok[:k] if not t.statistic(Phase.FINALIST)]
            known = record.noise_band(s, run.study_id, proc.info["host"], proc.gpu_index)
            band = known[0] if known else (s.get(StudyModel, run.study_id).noise_band or 0.0)
        if todo and rounds:
            run.bar.phase(f"finalists: {len(todo)} x {rounds} rounds")
        told = {
            t.user_attrs.get("tuner_trial_id"): t.number
            for t in run.study.get_trials(deepcopy=False, states=(COMPLETE,))
        }
        for trial_id, cfg, screen in todo if rounds else []:
            final = self.finalist(proc, trial_id, cfg, band)
            if final is None:
                continue
            attrs = {"tuner_trial_id": trial_id, "verdict": Verdict.OK.value, **ok_attrs(screen, final)}
            if trial_id in told:  # the config's one trial now holds its finalist estimate
                optuna_rows.revise(run.study, told[trial_id], final.ratio * run.reference(), attrs)
            else:  # its process ended before Optuna was told
                self.optuna_trial(cfg, optuna.trial.TrialState.COMPLETE, attrs, final.ratio)


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


def baseline_median(samples) -> float:
    """The baseline's median µs in a list of (candidate, baseline) rounds."""
    return float(np.median([b for _, b in samples]))


def _direction(st) -> Effect:
    return Effect.WIN if st.ratio < 1.0 else Effect.REGRESSION


class StudyRecords:
    """Mixed into :class:`tuner.study.StudyRun`: the study's own rows, what the Optuna study shows of it beyond
    its trials (attributes, heartbeats of running trials), and the finalist re-measurement that keeps Optuna's
    best the tuner's best."""

    def _open_rows(self) -> set[str]:
        """The study's database rows (created if new); returns the configs it has already recorded."""
        plan, info = self.plan, self.processes[0].info
        kernel_hash = recorded_kernel(self.opts, plan.space.adapter)
        base = study_name(
            plan.space.name,
            plan.spec.name,
            plan.concurrency,
            info["gpu_name"],
            self.opts.backend,
            kernel_hash,
        )
        with self.store.session() as s:
            env = queries.ensure_environment(s, info)
            kernel = queries.ensure_kernel(s, kernel_hash)
            wrow = queries.ensure_workload(s, **plan.spec.fields())
            srow = queries.ensure_space(s, plan.space.name, plan.space.text_hash, plan.space.text, plan.space.path)
            self.name = base
            if self.opts.remeasure:  # a fresh study beside the old ones: nothing measured before is lost
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
                old_wl = {c.name: getattr(row.workload, c.name) for c in row.workload.__table__.columns}
                problem = plan.space.resume_problem(row.space.text, self.name, old_wl, plan.spec)
                if problem:
                    raise SpaceError(problem)
            self.study_id, self.kernel_id, self.workload_id, self._env_id = row.id, kernel.id, wrow.id, env.id
            return set(queries.done_keys(s, row.id))

    def env_id(self) -> int:
        return self._env_id

    def _settle_running_trials(self) -> list:
        """The running trials of the study that another process runs, after failing (and re-queueing, as a stale
        heartbeat would) those whose process on this machine has ended; this process's own are left out.

        A running trial's owner says which process asked it (:mod:`tuner.heartbeat`). One whose process is gone
        is failed at once and its retry queued, so a resumed search continues with it instead of leaving it
        running for ever. One of another machine, or with no owner yet, gets one heartbeat from this process: Optuna
        fails only a trial whose heartbeat went silent, and a process killed between ``ask`` and its trial's first
        beat would otherwise hold that config as running for ever."""
        if not self._beats:
            return []
        me, others = owner(), []
        for t in self.study.get_trials(deepcopy=False, states=(RUNNING,)):
            tag = t.system_attrs.get(OWNER_ATTR)
            if tag and tag == me:
                continue
            alive = owner_alive(tag)
            trial_id = self._trial_id(t)
            if alive is False:
                try:
                    failed = self.storage.set_trial_state_values(trial_id, state=FAIL)
                except optuna.exceptions.UpdateFinishedTrialError:
                    failed = False  # another process settled it first
                if failed:
                    self.storage.get_heartbeat_stale_trial_callback()(self.study, self.storage.get_trial(trial_id))
                continue
            if trial_id not in self._beaten:
                self.storage.record_heartbeat(trial_id)
                self._beaten.add(trial_id)
            others.append(t)
        return others

    def _describe_study(self) -> None:
        """Metric name and attributes, so the study reads on its own in Optuna's tools (optuna-dashboard)."""
        plan, info = self.plan, self.processes[0].info
        shared_write(lambda: self.study.set_metric_names(["median_us"]))
        attrs = {
            "objective": "median_us: this study's baseline median x the candidate's paired ratio (lower is better)",
            "space": plan.space.name,
            "workload": plan.spec.name,
            "concurrency": plan.concurrency,
            "device": info["gpu_name"],
            "backend": self.opts.backend,
            "target_arch": plan.space.target,
            "baseline": str(plan.space.baseline),
            "kernel_hash": recorded_kernel(self.opts, self.plan.space.adapter),
            "strategy": self.strategy.name,
        }
        for k, v in attrs.items():
            shared_write(lambda k=k, v=v: self.study.set_user_attr(k, v))

    def _told_min(self) -> float | None:
        """The lowest ratio Optuna was told before (a resumed study), or None."""
        told = [t.user_attrs.get("ratio") for t in self.study.get_trials(deepcopy=False, states=(COMPLETE,))]
        return min((r for r in told if r is not None), default=None)

    def _record_finalist(self, proc, trial_id: int, cfg: KernelConfig, stat, band: float):
        """A screening result that beats everything told to Optuna so far is re-measured with the finalist
        rounds at once, and Optuna is told that estimate instead.

        So every value Optuna holds is either a finalist estimate or a screening estimate no lower than some
        finalist estimate, and Optuna's best trial is the tuner's best (the best finalist). Returns the
        finalist statistic, or None.
        """
        k, rounds = self.plan.space.measurement["finalists"], self.plan.space.measurement["finalist_rounds"]
        with self.progress.lock:
            first = self.progress.told_min is None
            record_low = first or stat.ratio < self.progress.told_min
        if not (k and rounds and record_low):
            return None
        if cfg == self.plan.space.baseline:  # the reference, not a contender
            self.bar.phase(f"baseline {cfg}: {rounds} more rounds")
        else:
            self.bar.phase(
                f"finalist: {cfg} {'is the first ok config' if first else 'beats all so far'}, {rounds} more rounds"
            )
        return self.recorder.finalist(proc, trial_id, cfg, band)
