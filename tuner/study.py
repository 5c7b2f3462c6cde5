"""One study: one (space, workload, concurrency, device, backend), measured by one or more processes.

:class:`StudyRun` opens (or resumes, or joins) the Optuna study and its database rows, runs one
measurement thread per measurement process, and re-measures the finalists at the end. Each thread
first measures its GPU's A/A noise band, then takes queued trials until the queue is empty: the
grid is enqueued (baseline first), so resuming and several hosts share one queue; TPE suggests
instead when the space is large.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass
from dataclasses import field

import numpy as np
import optuna

from db import queries
from db import record
from db.errors import DatabaseError
from db.models import StudyModel
from db.models import get_or_create
from db.verdicts import Effect
from db.verdicts import Phase
from db.verdicts import Verdict
from kernels.config import PARAM_NAMES
from kernels.config import KernelConfig
from kernels.config import kernel_source_hash
from kernels.config import launch_identity
from kernels.workload import Workload
from tuner import calibrate
from tuner import stats
from tuner.feasibility import Feasibility
from tuner.heartbeat import Heartbeat
from tuner.measure import MeasurementProcess
from tuner.progress import Progress
from tuner.protocol import MeasureReply
from tuner.protocol import MeasureRequest
from tuner.space import SearchSpace
from tuner.space import WorkloadSpec
from tuner.summary import postfix
from tuner.summary import summary_row

WAITING, RUNNING, COMPLETE = (
    optuna.trial.TrialState.WAITING,
    optuna.trial.TrialState.RUNNING,
    optuna.trial.TrialState.COMPLETE,
)


def slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", s).strip("_")


def study_name(space: str, workload: str, concurrency: int, device: str, backend: str, kernel: str) -> str:
    return f"{space}/{workload}/C{concurrency}/{slug(device)}/{backend}/k{kernel}"


@dataclass(frozen=True)
class StudyPlan:
    """What one study measures: one workload at one concurrency, with the feasibility verdicts."""

    space: SearchSpace
    spec: WorkloadSpec
    workload: Workload
    concurrency: int
    verdicts: dict[KernelConfig, Feasibility]
    sampler: str  # grid | tpe

    def order(self) -> list[KernelConfig]:
        """Every config, the baseline first."""
        base = self.space.baseline
        return [base] + [c for c in self.verdicts if c != base]

    def launches(self) -> dict[str, list[KernelConfig]]:
        """Feasible configs grouped by launch identity, in :meth:`order`; the first of a group is measured,
        the others launch exactly the same kernels on the same grid and are recorded as its duplicates."""
        groups: dict[str, list[KernelConfig]] = {}
        for cfg in self.order():
            if self.verdicts[cfg].feasible:
                groups.setdefault(launch_key(cfg, self.workload, self.concurrency), []).append(cfg)
        return groups

    def to_measure(self) -> list[KernelConfig]:
        """One config per distinct launch (the baseline's group is represented by the baseline)."""
        return [group[0] for group in self.launches().values()]

    def request(self, cfg: KernelConfig, seed: int, rounds: int, check: bool) -> MeasureRequest:
        return MeasureRequest(self.workload, self.concurrency, cfg, self.space.baseline, rounds, seed, check)


@dataclass
class _Progress:
    """What the measurement threads of one study share (under ``lock``)."""

    done: set[str]
    total: int
    budget: int
    bar: object  # tuner.progress's task of this study
    lock: threading.Lock = field(default_factory=threading.Lock)
    n_new: int = 0
    error: BaseException | None = None
    targets: set[str] = field(default_factory=set)  # grid: the configs to measure (one per launch)
    best: tuple[str, float, float] | None = None  # (config, ratio, median µs) of this run's screening
    told_min: float | None = None  # the lowest ratio told to Optuna so far (always a finalist's, see _run_trial)


class StudyRun:
    def __init__(
        self, plan: StudyPlan, store, storage, processes: list[MeasurementProcess], opts, stop, t_start, ui=None
    ):
        self.plan, self.store, self.storage, self.processes = plan, store, storage, processes
        self.ui = ui or Progress(quiet=True, total_studies=1)  # tuner.progress: what the user sees
        self.reference_us: float | None = None  # the study's A/A baseline median; Optuna's value = ratio x this
        self._beats = hasattr(storage, "record_heartbeat")  # the replay backend's in-memory queue has none
        self.opts, self.stop, self.t_start = opts, stop, t_start
        self.dists = optuna_distributions(plan.space)

    # --- opening -------------------------------------------------------------------------------

    def _open_rows(self) -> set[str]:
        """The study's database rows (created if new); returns the configs it has already measured."""
        plan, info = self.plan, self.processes[0].info
        base = study_name(
            plan.space.name,
            plan.spec.name,
            plan.concurrency,
            info["gpu_name"],
            self.opts.backend,
            kernel_source_hash(),
        )
        with self.store.session() as s:
            env = queries.ensure_environment(s, info)
            kernel = queries.ensure_kernel(s, kernel_source_hash())
            wrow = queries.ensure_workload(s, **plan.spec.fields())
            srow = queries.ensure_space(s, plan.space.name, plan.space.text_hash, plan.space.text, plan.space.path)
            self.name = base
            if self.opts.remeasure:  # a fresh study beside the old ones: nothing measured before is lost
                n_old = s.query(StudyModel).filter(StudyModel.name.like(base + "%")).count()
                self.name = f"{base}#r{n_old + 1}" if n_old else base
            row = get_or_create(
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
            self.study_id, self.kernel_id, self.workload_id = row.id, kernel.id, wrow.id
            return set(queries.done_configs(s, row.id))

    def _open_study(self, done: set[str]) -> int:
        """The Optuna study, with every missing config queued (grid) or the baseline (TPE); returns the total."""
        plan = self.plan
        sampler = optuna.samplers.TPESampler(seed=plan.space.sampler["seed"]) if plan.sampler == "tpe" else None
        self.study = optuna.create_study(
            study_name=self.name, storage=self.storage, direction="minimize", load_if_exists=True, sampler=sampler
        )
        self.optuna_study_id = self.storage.get_study_id_from_name(self.name)
        self._describe_study()
        optuna.storages.fail_stale_trials(self.study)
        self._beat_running_trials()
        prior = self.prior = self._prior_picks(done)
        self.queue_order = self._queue_order(prior)
        if plan.sampler == "grid":
            self._enqueue_missing(done)
            return len(plan.to_measure())
        for cfg in [plan.space.baseline, *prior]:
            if str(cfg) not in done:
                self.study.enqueue_trial(cfg.as_dict(), skip_if_exists=True)
        return self.opts.n_trials or plan.space.sampler.get("n_trials") or 100

    def _beat_running_trials(self) -> None:
        """One heartbeat for every running trial. Optuna fails only a trial whose heartbeat went silent, so a
        process killed between ``ask`` and its trial's first beat would hold that config as running forever,
        and a resumed grid would wait for it. With one beat it goes stale after the grace period, and is
        failed and re-queued; a trial that a live process runs beats every 2 s anyway."""
        if self._beats:
            for t in self.study.get_trials(deepcopy=False, states=(RUNNING,)):
                self.storage.record_heartbeat(self._trial_id(t))

    def _prior_picks(self, done: set[str]) -> list[KernelConfig]:
        """What is measured first: the user's ``--first`` configs, then the previous kernel's five best configs
        here, then those five with each parameter value the previous kernel never ran (see
        :func:`new_value_variants`); each only if this space holds it, it fits and it is not measured yet."""
        plan, info = self.plan, self.processes[0].info
        with self.store.session() as s:
            ranked = queries.prior_picks(
                s,
                self.kernel_id,
                plan.concurrency,
                n=None,
                space=plan.space.name,
                workload=plan.spec.name,
                device=info["gpu_name"],
                backend=self.opts.backend,
            )
        best = [KernelConfig.parse(k) for k in ranked[:5]]
        variants = new_value_variants(best, [KernelConfig.parse(k) for k in ranked], plan.space.parameters)
        return [
            c
            for c in dict.fromkeys([*self.opts.first, *best, *variants])
            if c in plan.verdicts and plan.verdicts[c].feasible and str(c) not in done
        ]

    def _queue_order(self, prior: list[KernelConfig]) -> list[KernelConfig]:
        """The grid's measuring order: the baseline, the launches of ``prior``, then the rest in space order."""
        groups = self.plan.launches()
        rep = {str(c): g[0] for g in groups.values() for c in g}  # a config -> the one measured for its launch
        order, seen = [], set()
        for cfg in [self.plan.space.baseline, *(rep[str(p)] for p in prior), *self.plan.to_measure()]:
            if str(cfg) in rep and str(cfg) not in seen:
                seen.add(str(cfg))
                order.append(cfg)
        return order

    def _describe_study(self) -> None:
        """Metric name and attributes, so the study reads on its own in Optuna's tools (optuna-dashboard)."""
        plan, info = self.plan, self.processes[0].info
        _shared_write(lambda: self.study.set_metric_names(["median_us"]))
        attrs = {
            "objective": "median_us: the baseline's A/A median x the candidate's paired ratio (lower is better)",
            "space": plan.space.name,
            "workload": plan.spec.name,
            "concurrency": plan.concurrency,
            "device": info["gpu_name"],
            "backend": self.opts.backend,
            "target_arch": plan.space.target,
            "baseline": str(plan.space.baseline),
            "kernel_hash": kernel_source_hash(),
        }
        for k, v in attrs.items():
            _shared_write(lambda k=k, v=v: self.study.set_user_attr(k, v))

    def _enqueue_missing(self, done: set[str]) -> None:
        """Queue every config that is neither measured, nor queued, nor running (by any process or host)."""
        pending = {_key(t.params) for t in self.study.get_trials(deepcopy=False, states=(WAITING, RUNNING))}
        for cfg in self.queue_order:
            if str(cfg) not in done and str(cfg) not in pending:
                self.study.enqueue_trial(cfg.as_dict(), skip_if_exists=False)

    def _record_infeasible(self, done: set[str]) -> None:
        """Configs that do not fit the target are recorded at once, with their numbers; nothing launches."""
        with self.store.session() as s:
            env_id = queries.ensure_environment(s, self.processes[0].info).id
        for cfg, feas in self.plan.verdicts.items():
            if not feas.feasible and str(cfg) not in done:
                reply = MeasureReply(Verdict.INFEASIBLE, feas.reason)
                self._record_unlaunched(env_id, cfg, reply)
                done.add(str(cfg))

    def _record_duplicates(self) -> None:
        """Every config whose launch was measured by another trial of the study, recorded as its duplicate."""
        with self.store.session() as s:
            done = queries.done_configs(s, self.study_id)
            env_id = queries.ensure_environment(s, self.processes[0].info).id
        for key, (first, *twins) in self.plan.launches().items():
            original = done.get(str(first))
            for cfg in twins:
                if original is None or str(cfg) in done:
                    continue
                reply = MeasureReply(Verdict.DUPLICATE, f"launches exactly what trial {original.id} ({first}) measured")
                self._record_unlaunched(env_id, cfg, reply, key, original.id)

    def _record_unlaunched(self, env_id: int, cfg: KernelConfig, reply: MeasureReply, key=None, original=None):
        """A config decided without a launch, in the tuner's tables and as a pruned Optuna trial with the reason."""
        recorded = self._record(None, env_id, cfg, reply, 0.0, None, 0.0, key, original)
        if recorded is False:
            return
        attrs = {"tuner_trial_id": recorded[0], "verdict": reply.verdict.value, "reason": reply.reason[:500]}
        if original is not None:
            attrs["duplicate_of"] = original
        self._add_optuna_trial(cfg, optuna.trial.TrialState.PRUNED, attrs)

    # --- running -------------------------------------------------------------------------------

    def run(self) -> dict:
        """Measure what is missing, then the finalists; returns the study's summary row."""
        done = self._open_rows()
        total = self._open_study(done)
        budget = self.opts.n_trials or total
        targets = {str(c) for c in self.plan.to_measure()} if self.plan.sampler == "grid" else set()
        initial = min(len(done & targets) if targets else len(done), total)
        name = f"{self.plan.spec.name} C={self.plan.concurrency}"
        with self.ui.study(name, total=total, initial=initial) as bar:
            self.bar = bar
            self.progress = _Progress(done, total, budget, bar, targets=targets, told_min=self._told_min())
            if initial < total:
                bar.phase(f"screening {total - initial} launches")
            if self.prior:
                given = "the configs given with --first, then " if self.opts.first else ""
                bar.phase(
                    f"first {given}the previous kernel's best (and with values it never ran): "
                    + " ".join(map(str, self.prior))
                )
            threads = [
                threading.Thread(target=self._measurement_thread, args=(p,), daemon=True) for p in self.processes
            ]
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():
                    t.join(timeout=0.5)  # keeps the main thread responsive to Ctrl-C
            if self.progress.error is not None:
                raise self.progress.error
            if not self.stop.requested and self._finished():
                if self.plan.sampler == "grid":  # recorded without launching anything
                    self._record_infeasible(set(self._done_keys()))
                    self._record_duplicates()
                self._finalists(self.processes[0])
            self._decide()
            with self.store.session() as s:
                row = summary_row(s, self.study_id, self.plan.spec.name, self.plan.concurrency)
            bar.close(f"best {row['best']} {row['median_us']} µs" if row["best"] != "-" else "no ok config")
            return row

    def _told_min(self) -> float | None:
        """The lowest ratio Optuna was told before (a resumed study), or None."""
        told = [t.user_attrs.get("ratio") for t in self.study.get_trials(deepcopy=False, states=(COMPLETE,))]
        return min((r for r in told if r is not None), default=None)

    def _finished(self) -> bool:
        pg = self.progress
        return pg.targets <= pg.done if pg.targets else len(pg.done) >= pg.total

    def _out_of_time(self) -> bool:
        return bool(self.opts.timeout_s and time.monotonic() - self.t_start > self.opts.timeout_s)

    def _measurement_thread(self, proc: MeasurementProcess) -> None:
        """One measurement process's loop: its noise band, then trials until the queue is empty."""
        pg = self.progress
        try:
            env_id, band = self._noise_band(proc)
            while True:
                with pg.lock:
                    if self.stop.requested or pg.n_new >= pg.budget or self._finished():
                        return
                    if self._out_of_time():
                        return
                    trial = self._next_trial()
                if trial is None:
                    time.sleep(1.0)  # others run the last trials; a dead host's come back after its grace period
                    continue
                self._run_trial(proc, trial, env_id, band)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            pg.error = pg.error or e
            self.stop.requested = True

    def _trial_id(self, trial: optuna.Trial) -> int:
        return self.storage.get_trial_id_from_study_id_trial_number(self.optuna_study_id, trial.number)

    def _next_trial(self) -> optuna.Trial | None:
        """The next queued trial, or None to wait. Called under the progress lock."""
        study, pg = self.study, self.progress
        optuna.storages.fail_stale_trials(study)  # a dead host's trial is failed and re-queued (heartbeat)
        if self.plan.sampler == "grid" and not study.get_trials(deepcopy=False, states=(WAITING,)):
            if study.get_trials(deepcopy=False, states=(RUNNING,)):
                return None
            pg.done |= self._done_keys()
            self._enqueue_missing(pg.done)
            if not study.get_trials(deepcopy=False, states=(WAITING,)):
                pg.done |= pg.targets  # nothing left anywhere
                return None
        trial = study.ask(fixed_distributions=self.dists)
        trial_id = self._trial_id(trial)
        if self._beats:  # at once: a trial without any heartbeat is never failed as stale
            self.storage.record_heartbeat(trial_id)
        queued = "fixed_params" in self.storage.get_trial(trial_id).system_attrs
        if self.plan.sampler == "grid" and not queued:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)  # another host emptied the queue first
            return None
        return trial

    def _done_keys(self) -> set[str]:
        with self.store.session() as s:
            return queries.done_keys(s, self.study_id)

    def _run_trial(self, proc: MeasurementProcess, trial: optuna.Trial, env_id: int, band: float) -> None:
        cfg = KernelConfig.from_dict(trial.params)
        pg = self.progress
        with pg.lock:
            seen = str(cfg) in pg.done or str(cfg) in self._done_keys()
        if seen or not self.plan.space.satisfies(cfg):
            self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            return
        key, original = self._duplicate_of(cfg) if self.plan.verdicts[cfg].feasible else (None, None)
        # the heartbeat runs until Optuna is told: a finalist re-measurement can take longer than the grace
        beat = Heartbeat(self.storage, self._trial_id(trial)) if self._beats else None
        t0 = time.monotonic()
        try:
            if original is not None:  # one measurement per distinct launch
                reply = MeasureReply(Verdict.DUPLICATE, f"launches exactly what trial {original} measured")
            else:
                reply = self._measure(proc, cfg, trial.number, self.plan.space.measurement["rounds"], check=True)
            recorded = self._record(proc, env_id, cfg, reply, band, trial.number, time.monotonic() - t0, key, original)
            self._tell(proc, trial, cfg, reply, recorded, band)
        except optuna.exceptions.UpdateFinishedTrialError:
            # this host's beats stalled past the grace and another host failed and re-queued the trial;
            # the tuner's tables hold the result, and the re-queued copy finds it recorded
            self.ui.warn(f"{cfg}: Optuna trial {trial.number} was failed by another host while measured here")
        finally:
            if beat is not None:
                beat.stop()

    def _tell(self, proc, trial: optuna.Trial, cfg: KernelConfig, reply: MeasureReply, recorded, band: float) -> None:
        """What Optuna learns of a trial the tuner has recorded (or that another process recorded first)."""
        pg = self.progress
        with pg.lock:
            pg.done.add(str(cfg))
            if recorded is False:  # another process or host recorded this config first
                trial.set_user_attr("reason", "recorded by another process first")
                self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                return
            trial_id, stat = recorded
            pg.n_new += 1
            if stat and (pg.best is None or stat.ratio < pg.best[1]):
                pg.best = (str(cfg), stat.ratio, stat.median_us)
            pg.bar.advance(1, postfix=postfix(pg.best, band))
        trial.set_user_attr("tuner_trial_id", trial_id)
        trial.set_user_attr("verdict", reply.verdict.value)
        if reply.verdict != Verdict.OK:
            trial.set_user_attr("reason", reply.reason[:500])
            self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            return
        final = self._record_finalist(proc, trial_id, cfg, stat, band)
        for k, v in _ok_attrs(stat, final).items():
            trial.set_user_attr(k, v)
        told = final or stat
        with pg.lock:
            pg.told_min = told.ratio if pg.told_min is None else min(pg.told_min, told.ratio)
        self.study.tell(trial, told.ratio * self.reference_us)

    def _record_finalist(self, proc: MeasurementProcess, trial_id: int, cfg: KernelConfig, stat, band: float):
        """A screening result that beats everything told to Optuna so far is re-measured with the finalist
        rounds at once, and Optuna is told that estimate instead.

        So every value Optuna holds is either a finalist estimate or a screening estimate no lower than some
        finalist estimate, and Optuna's best trial is the tuner's best (the best finalist). Returns the
        finalist statistic, or None.
        """
        k, rounds = self.plan.space.measurement["finalists"], self.plan.space.measurement["finalist_rounds"]
        with self.progress.lock:
            record_low = self.progress.told_min is None or stat.ratio < self.progress.told_min
        if not (k and rounds and record_low):
            return None
        self.bar.phase(f"finalist: {cfg} beats all so far, {rounds} more rounds")
        return self._add_finalist(proc, trial_id, cfg, band)

    def _add_finalist(self, proc: MeasurementProcess, trial_id: int, cfg: KernelConfig, band: float):
        """Measure one finalist and store its statistic; None when it failed or another host stored it first."""
        rounds = self.plan.space.measurement["finalist_rounds"]
        reply = self._measure(proc, cfg, trial_id, rounds, check=False)
        if reply.verdict != Verdict.OK:
            return None
        try:
            with self.store.session() as s, s.begin_nested():
                return _add_samples(s, trial_id, Phase.FINALIST, reply, proc.gpu_index, band, seed=trial_id)
        except DatabaseError:
            return None  # another host re-measured this finalist first

    def _measure(self, proc: MeasurementProcess, cfg: KernelConfig, seed: int, rounds: int, check: bool):
        feas = self.plan.verdicts[cfg]
        if not feas.feasible:
            return MeasureReply(Verdict.INFEASIBLE, feas.reason)
        req = self.plan.request(cfg, seed, rounds, check)
        return proc.measure(req, timeout_s=self.plan.space.measurement["trial_timeout_s"])

    # --- noise, recording, finalists -------------------------------------------------------------

    def _noise_band(self, proc: MeasurementProcess) -> tuple[int, float]:
        """The band this GPU's verdicts use in the study: ``max(spread, min_effect)``, the spread from the
        latest calibration of this environment, workload and concurrency, else from a short A/A now."""
        plan, host, gpu = self.plan, proc.info["host"], proc.gpu_index
        min_effect = plan.space.measurement.get("min_effect", stats.DEFAULT_MIN_EFFECT)
        with self.store.session() as s:
            env_id = queries.ensure_environment(s, proc.info).id
            known = record.noise_band(s, self.study_id, host, gpu)
            cal = queries.latest_calibration(s, env_id, self.workload_id, plan.concurrency, self.opts.backend)
            if known is None and cal is not None:
                spread, multimodal, samples = cal.spread, cal.multimodal, json.loads(cal.samples)
        if known is not None:
            band, samples = known
            self._set_reference(samples)
            return env_id, band
        if cal is None:
            base = plan.space.baseline
            pairs = calibrate.study_pairs(plan.space.measurement["rounds"])
            self.bar.phase(f"A/A of the baseline, {pairs} independent capture pairs")
            c = calibrate.measure(proc, plan.space, plan.workload, plan.concurrency, base, pairs)
            with self.store.session() as s:
                calibrate.store_calibration(s, c, proc.info, plan.spec, plan.concurrency, self.opts.backend, base)
            spread, multimodal, samples = c.spread, c.multimodal, c.samples
        self._set_reference(samples)
        band = stats.band(spread, min_effect)
        _shared_write(lambda: self.study.set_user_attr("noise_band", band))
        with self.store.session() as s:
            record.add_noise(s, self.study_id, host, gpu, band, samples)
            record.set_study_noise(s, self.study_id, band, spread, min_effect, multimodal, len(samples))
        if multimodal:
            self.ui.warn(
                f"warning: the baseline's A/A samples look multimodal (two speeds) at C={plan.concurrency}; "
                "treat close calls with care"
            )
        return env_id, band

    def _set_reference(self, samples) -> None:
        """The one scale of Optuna's values in this study, kept across resumes and GPUs (so the order of
        Optuna's values is the order of the ratios): the first A/A baseline median it saw."""
        with self.progress.lock:
            if self.reference_us is None:
                ref = self.study.user_attrs.get("reference_us") or float(np.median([a for a, _ in samples]))
                _shared_write(lambda: self.study.set_user_attr("reference_us", ref))
                self.reference_us = ref

    def _duplicate_of(self, cfg: KernelConfig) -> tuple[str, int | None]:
        """The config's launch key, and the trial of this study that already measured that launch."""
        key = launch_key(cfg, self.plan.workload, self.plan.concurrency)
        with self.store.session() as s:
            return key, queries.measured_launch(s, self.study_id, key)

    def _record(
        self,
        proc,
        env_id: int,
        cfg: KernelConfig,
        reply: MeasureReply,
        band: float,
        number: int,
        wall_s: float,
        key: str | None = None,
        original: int | None = None,
    ):
        """Write the trial, its raw samples and its statistic in one transaction.

        Returns ``(trial id, statistic or None)``, or False when another process already recorded this config.
        """
        feas = self.plan.verdicts[cfg]
        with self.store.session() as s:
            t = record.add_trial(
                s,
                study_id=self.study_id,
                workload_id=self.workload_id,
                environment_id=env_id,
                kernel_id=self.kernel_id,
                concurrency=self.plan.concurrency,
                backend=self.opts.backend,
                config_key=str(cfg),
                **cfg.as_dict(),
                num_splits=reply.num_splits,
                launch_key=key,
                duplicate_of=original,
                is_baseline=cfg == self.plan.space.baseline,
                verdict=reply.verdict,
                reason=reply.reason or (feas.reason if feas.feasible else ""),
                shared_bytes=feas.shared_bytes,
                limit_bytes=feas.limit_bytes,
                registers=feas.registers,
                spill_bytes=feas.spill_bytes,
                estimate_bytes=feas.estimate_bytes,
                out_rel_err=reply.out_rel_err,
                lse_abs_err=reply.lse_abs_err,
                optuna_study=self.name,
                optuna_trial_number=number,
                wall_s=wall_s,
            )
            if t is None:
                return False
            if not reply.samples:  # only an ok measurement has samples
                return t.id, None
            return t.id, _add_samples(s, t.id, Phase.SCREEN, reply, proc.gpu_index, band, seed=number)

    def _decide(self) -> None:
        """The study-wide calls: Benjamini-Hochberg over the per-trial p-values of each phase."""
        with self.store.session() as s:
            trials = [t for t in queries.done_configs(s, self.study_id).values() if t.verdict == Verdict.OK]
            for phase in Phase:
                rows = [st for t in trials if (st := t.statistic(phase)) is not None and st.p_value is not None]
                effects = stats.decide([(st.p_value, _direction(st)) for st in rows])
                record.set_effects(s, {st.id: e for st, e in zip(rows, effects, strict=True)})

    def _finalists(self, proc: MeasurementProcess) -> None:
        """Re-measure the top ``finalists`` by screening ratio that have no finalist statistic yet (see
        :meth:`_record_finalist`) with ``finalist_rounds``, on one GPU, against its own band."""
        k, rounds = self.plan.space.measurement["finalists"], self.plan.space.measurement["finalist_rounds"]
        with self.store.session() as s:
            ok = [
                t
                for t in queries.done_configs(s, self.study_id).values()
                if t.verdict == Verdict.OK and t.statistic(Phase.SCREEN)
            ]
            ok.sort(key=lambda t: t.statistic(Phase.SCREEN).ratio)  # the estimator that ranks and judges
            todo = [(t.id, t.config(), t.statistic(Phase.SCREEN)) for t in ok[:k] if not t.statistic(Phase.FINALIST)]
            known = record.noise_band(s, self.study_id, proc.info["host"], proc.gpu_index)
            band = known[0] if known else (s.get(StudyModel, self.study_id).noise_band or 0.0)
        if todo:
            self.bar.phase(f"finalists: {len(todo)} x {rounds} rounds")
        for trial_id, cfg, screen in todo:
            final = self._add_finalist(proc, trial_id, cfg, band)
            if final is not None:  # Optuna sees the re-measurement as a trial of its own
                attrs = {"tuner_trial_id": trial_id, "verdict": Verdict.OK.value, **_ok_attrs(screen, final)}
                self._add_optuna_trial(cfg, optuna.trial.TrialState.COMPLETE, attrs, final.ratio)

    def _add_optuna_trial(self, cfg: KernelConfig, state, attrs: dict, ratio: float | None = None) -> None:
        """A finished trial added to the Optuna study without launching anything through it."""
        value = None if ratio is None else ratio * self.reference_us
        trial = optuna.trial.create_trial(
            state=state, params=cfg.as_dict(), distributions=self.dists, value=value, user_attrs=attrs
        )
        self.study.add_trial(trial)


def optuna_distributions(space: SearchSpace) -> dict[str, optuna.distributions.CategoricalDistribution]:
    """Every declared parameter as the categorical distribution of its values in ``space`` (how a trial asks)."""
    return {p: optuna.distributions.CategoricalDistribution(space.parameters[p]) for p in PARAM_NAMES}


def new_value_variants(
    best: list[KernelConfig], measured: list[KernelConfig], parameters: dict[str, list]
) -> list[KernelConfig]:
    """``best`` with each parameter value that no config in ``measured`` has, best config first.

    A changed kernel often brings a new lever or a new value of one (kernel v5's ``PREFETCH=2``). The
    previous kernel's best configs are where the new value is most likely to win, and a bounded sampler
    may not try it there: on the H200, 20 TPE trials per level missed ``PREFETCH=2`` variants worth 10 %
    at V3.2 C=64..96. The caller keeps only what the space holds and what fits.
    """
    if not measured:  # no previous kernel: nothing is new
        return []
    new = {
        name: [v for v in values if v not in {getattr(c, name) for c in measured}]
        for name, values in parameters.items()
    }
    return list(dict.fromkeys(cfg.replace(**{name: v}) for cfg in best for name, vs in new.items() for v in vs))


def launch_key(cfg: KernelConfig, workload: Workload, concurrency: int) -> str:
    """The launch identity (compiled binary + split geometry) as a string the database can index."""
    rows = concurrency * workload.q_tokens  # every query token is a row of the grid
    ids = [launch_identity(cfg, workload.heads, c.topk, rows) for c in workload.caches()]
    return json.dumps(ids[0] if len(ids) == 1 else ids)


def _add_samples(s, trial_id: int, phase: Phase, reply: MeasureReply, gpu_index: int, band: float, seed: int):
    c, b = zip(*reply.samples, strict=True)
    ps = stats.paired(c, b, seed=seed)
    p, _ = ps.p_value(band)
    summary = record.Summary(
        ps.n,
        ps.median_us,
        ps.ci_low_us,
        ps.ci_high_us,
        ps.baseline_median_us,
        ps.ratio,
        ps.ratio_ci_low,
        ps.ratio_ci_high,
        band,
        ps.classify(band),
        p,
    )
    return record.add_samples(s, trial_id, phase, reply.samples, reply.replays, gpu_index, summary)


def _shared_write(write, attempts: int = 5) -> None:
    """A study attribute that several processes (or hosts) may write at the same moment: Optuna inserts
    it if missing, so two first writers can collide on the unique key; the loser retries (then updates)."""
    for i in range(attempts):
        try:
            return write()
        except optuna.exceptions.StorageInternalError:
            if i == attempts - 1:
                raise
            time.sleep(0.05 * (i + 1))


def _ok_attrs(screen, final=None) -> dict:
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


def _direction(st) -> Effect:
    return Effect.WIN if st.ratio < 1.0 else Effect.REGRESSION


def _key(params: dict) -> str:
    try:
        return str(KernelConfig.from_dict(params))
    except (ValueError, TypeError):
        return ""
