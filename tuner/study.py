"""One study: one (space, workload, concurrency, device, backend), measured by one or more processes.

The study is an Optuna study in the results database. What it measures next comes from its strategy
(:mod:`tuner.strategies`): whenever Optuna's queue is empty, the strategy proposes open candidates (feasible
launches not yet measured at this level) and the study enqueues them, so resuming, several GPUs and several
hosts share one queue; TPE proposes through Optuna's own sampler instead. How it measures is one
measurement thread per measurement process (:class:`StudyRun`); how it records is
:class:`tuner.recorder.StudyRecorder`. The level stops when its strategy says why (the reason is shown in
the summary and kept as the study's ``stopped`` attribute), or at ``--n-trials`` measurements; then its
finalists are re-measured.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from dataclasses import dataclass
from dataclasses import field

import numpy as np
import optuna

from db import queries
from db import record
from db.models import StudyModel
from db.models import get_or_create
from db.verdicts import Phase
from db.verdicts import Verdict
from kernels.config import BY_NAME
from kernels.config import PARAM_NAMES
from kernels.config import KernelConfig
from kernels.config import Role
from kernels.config import kernel_source_hash
from kernels.config import launch_identity
from kernels.workload import Workload
from tuner import calibrate
from tuner import stats
from tuner import strategies
from tuner.feasibility import Feasibility
from tuner.heartbeat import Heartbeat
from tuner.measure import MeasurementProcess
from tuner.progress import Progress
from tuner.protocol import MeasureReply
from tuner.protocol import MeasureRequest
from tuner.recorder import StudyRecorder
from tuner.recorder import baseline_median
from tuner.recorder import measurement_seed
from tuner.recorder import ok_attrs
from tuner.recorder import shared_write
from tuner.space import SearchSpace
from tuner.space import WorkloadSpec
from tuner.summary import postfix
from tuner.summary import summary_row

WAITING, RUNNING, COMPLETE, PRUNED = (
    optuna.trial.TrialState.WAITING,
    optuna.trial.TrialState.RUNNING,
    optuna.trial.TrialState.COMPLETE,
    optuna.trial.TrialState.PRUNED,
)
LAUNCHED = {Verdict.OK, Verdict.WRONG, Verdict.CRASHED, Verdict.TIMEOUT, Verdict.MISSING}  # measured, for the budget


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
    sampler: str  # the strategy's name (tuner.strategies.NAMES)

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

    def representatives(self) -> dict[str, KernelConfig]:
        """Every feasible config's key -> the config that stands for its launch."""
        return {str(c): group[0] for group in self.launches().values() for c in group}

    def request(self, cfg: KernelConfig, seed: int, rounds: int, check: bool) -> MeasureRequest:
        return MeasureRequest(self.workload, self.concurrency, cfg, self.space.baseline, rounds, seed, check)


@dataclass
class _Progress:
    """What the measurement threads of one study share (under ``lock``)."""

    bar: object  # tuner.progress's task of this study
    lock: threading.Lock = field(default_factory=threading.Lock)
    n_new: int = 0  # launches measured by this run
    error: BaseException | None = None
    stopped: str | None = None  # why the level is done
    best: tuple[str, float, float] | None = None  # (config, ratio, median µs) of this run's screening
    told_min: float | None = None  # the lowest ratio told to Optuna so far (always a finalist's, see _tell)


class StudyRun:
    def __init__(
        self,
        plan: StudyPlan,
        store,
        storage,
        processes: list[MeasurementProcess],
        opts,
        stop,
        t_start,
        ui=None,
        strategy: strategies.Strategy | None = None,
    ):
        self.plan, self.store, self.storage, self.processes = plan, store, storage, processes
        self.ui = ui or Progress(quiet=True, total_studies=1)  # tuner.progress: what the user sees
        self.strategy = strategy or strategies.make(plan.sampler, getattr(opts, "seed", 0))
        self.reference_us: float | None = None  # this study's baseline median; Optuna's value = ratio x this
        self._baseline_us: float | None = None  # the baseline trial's own median, once measured here
        self._aa_us: float | None = None  # the median of the A/A this study's band comes from
        self._beats = hasattr(storage, "record_heartbeat")  # the replay backend's in-memory queue has none
        self.opts, self.stop, self.t_start = opts, stop, t_start
        self.dists = optuna_distributions(plan.space)
        self.recorder = StudyRecorder(self)
        self.band = plan.space.measurement.get("min_effect", stats.DEFAULT_MIN_EFFECT)

    # --- opening -------------------------------------------------------------------------------

    def _open_rows(self) -> set[str]:
        """The study's database rows (created if new); returns the configs it has already recorded."""
        plan, info = self.plan, self.processes[0].info
        base = study_name(
            plan.space.name, plan.spec.name, plan.concurrency, info["gpu_name"], self.opts.backend, kernel_source_hash()
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
            self.study_id, self.kernel_id, self.workload_id, self._env_id = row.id, kernel.id, wrow.id, env.id
            return set(queries.done_keys(s, row.id))

    def env_id(self) -> int:
        return self._env_id

    def _open_study(self, done: set[str]) -> None:
        """The Optuna study, with the baseline and the configs measured first queued (once per launch)."""
        sampler = self.strategy.sampler(self.plan.space.sampler.get("seed", 0) + getattr(self.opts, "seed", 0))
        self.study = optuna.create_study(
            study_name=self.name, storage=self.storage, direction="minimize", load_if_exists=True, sampler=sampler
        )
        self.optuna_study_id = self.storage.get_study_id_from_name(self.name)
        self._describe_study()
        optuna.storages.fail_stale_trials(self.study)
        self._beat_running_trials()
        self.reference_us = self.study.user_attrs.get("reference_us")
        self.prior = self._prior_picks(done)
        self.queue_order = self._queue_order(self.prior)
        self._neighbours = self._make_neighbours()
        self._resources = {str(c): (v.registers, v.shared_bytes) for c, v in self.plan.verdicts.items() if v.feasible}
        self.history = self._history()
        level = self._level()
        pending = {str(c) for c in level.pending}
        first = [self.plan.space.baseline, *self.prior]
        for cfg in [c for c in self.queue_order if c in first]:
            if cfg not in level.measured and str(cfg) not in pending:
                self.study.enqueue_trial(cfg.as_dict(), skip_if_exists=False)

    def _beat_running_trials(self) -> None:
        """One heartbeat for every running trial. Optuna fails only a trial whose heartbeat went silent, so a
        process killed between ``ask`` and its trial's first beat would hold that config as running forever.
        With one beat it goes stale after the grace period, and is failed and re-queued."""
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
        """The candidates in measuring order: the baseline, the launches of ``prior``, then the rest in space
        order (one config per distinct feasible launch)."""
        rep = self.plan.representatives()
        first = [self.plan.space.baseline, *(rep[str(p)] for p in prior if str(p) in rep)]
        return list(dict.fromkeys(c for c in [*first, *self.plan.to_measure()] if str(c) in rep))

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
            "kernel_hash": kernel_source_hash(),
            "strategy": self.strategy.name,
        }
        for k, v in attrs.items():
            shared_write(lambda k=k, v=v: self.study.set_user_attr(k, v))

    # --- what the strategy sees ------------------------------------------------------------------

    def _history(self) -> list[tuple]:
        """Every measurement of this space and workload at other levels: this kernel on this device (source
        None), and earlier records (source: kernel hash and device) as the strategy's priors."""
        device = self.processes[0].info["gpu_name"]
        rows = []
        with self.store.session() as s:
            for t in queries.trials(s, space=self.plan.space.name, workload=self.plan.spec.name):
                if t.study_id == self.study_id or t.verdict not in LAUNCHED or t.backend != self.opts.backend:
                    continue
                own = t.kernel_id == self.kernel_id and t.environment.gpu_name == device
                st = t.statistic()
                y = math.log(st.ratio) if t.verdict == Verdict.OK and st is not None else None
                if t.verdict == Verdict.MISSING or (not own and y is None):
                    continue
                try:
                    cfg = t.config()
                except ValueError:  # recorded under another version of the declaration
                    continue
                rows.append((t.concurrency, cfg, y, None if own else (t.kernel_id, t.environment.gpu_name)))
        return rows

    def _level(self) -> strategies.Level:
        """The level as the strategy sees it: candidates, what is measured (log ratios) and what is pending."""
        rep = self.plan.representatives()
        with self.store.session() as s:
            recorded = queries.done_configs(s, self.study_id)
            measured: dict[KernelConfig, float | None] = {}
            for key, t in recorded.items():
                if key not in rep or t.verdict not in LAUNCHED:
                    continue
                st = t.statistic()
                measured[rep[key]] = math.log(st.ratio) if t.verdict == Verdict.OK and st is not None else None
        pending = {
            rep[k]
            for t in self.study.get_trials(deepcopy=False, states=(WAITING, RUNNING))
            if (k := _key(t.params)) in rep
        }
        self.n_measured = len(measured)
        return strategies.Level(
            self.plan.concurrency,
            self.plan.workload,
            self.queue_order,
            measured,
            pending - set(measured),
            self.band,
            self.plan.space.baseline,
            self._neighbours,
            lambda cfg: rep.get(str(cfg)),
            self._resources,
            int(self.processes[0].info.get("sm_count") or 0),
        )

    def _make_neighbours(self) -> dict[KernelConfig, list[KernelConfig]]:
        """Each candidate's neighbours: the launches one step away in one parameter's values (a step that
        launches the same thing, such as a TARGET_CTAS that clamps alike, is walked past), and every value of
        a launch-only parameter (``TARGET_CTAS``: the split count whose best value moves with C)."""
        rep, params = self.plan.representatives(), self.plan.space.parameters
        out = {}
        for cand in self.queue_order:
            near = []
            for name, values in params.items():
                if getattr(cand, name) not in values:
                    continue
                if BY_NAME[name].role is Role.LAUNCH:
                    near += [o for v in values if (o := rep.get(str(cand.replace(**{name: v})))) not in (None, cand)]
                    continue
                i = values.index(getattr(cand, name))
                for step in (-1, 1):
                    j = i + step
                    while 0 <= j < len(values):
                        other = rep.get(str(cand.replace(**{name: values[j]})))
                        if other is not None and other != cand:
                            near.append(other)
                            break
                        if other is None:
                            break
                        j += step
            out[cand] = list(dict.fromkeys(near))
        return out

    def _why_stop(self, level: strategies.Level) -> str | None:
        n = self.opts.n_trials or self.plan.space.sampler.get("n_trials")
        if n and len(level.measured) >= n:
            return f"--n-trials {n} reached, {len(level.measured)} of {len(level.candidates)} launches measured"
        if self.stop.requested:
            return None
        own = [(c, cfg, y) for c, cfg, y in ((self.plan.concurrency, cfg, y) for cfg, y in level.measured.items())]
        self.strategy.history(self.history + [(c, cfg, y, None) for c, cfg, y in own])
        return self.strategy.stop_reason(level)

    # --- running -------------------------------------------------------------------------------

    def run(self) -> dict:
        """Measure until the strategy stops the level, then the finalists; returns the study's summary row."""
        done = self._open_rows()
        self._open_study(done)
        total = len(self.queue_order)
        name = f"{self.plan.spec.name} C={self.plan.concurrency}"
        with self.ui.study(name, total=total, initial=min(self.n_measured, total)) as bar:
            self.bar = bar
            self.progress = _Progress(bar, told_min=self._told_min())
            self.recorder.infeasible(done)  # known before any launch
            if self.prior:
                given = "the configs given with --first, then " if self.opts.first else ""
                bar.phase(
                    f"first {given}the previous kernel's best (and untried values): " + " ".join(map(str, self.prior))
                )
            threads = [threading.Thread(target=self._thread, args=(p,), daemon=True) for p in self.processes]
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():
                    t.join(timeout=0.5)  # keeps the main thread responsive to Ctrl-C
            if self.progress.error is not None:
                raise self.progress.error
            stopped = self.progress.stopped
            if stopped and not self.stop.requested:
                self.recorder.duplicates()
                self.recorder.finalists(self.processes[0])
                shared_write(lambda: self.study.set_user_attr("stopped", stopped))
            self.recorder.decide()
            with self.store.session() as s:
                row = summary_row(s, self.study_id, self.plan.spec.name, self.plan.concurrency)
            row["strategy"] = self.strategy.name
            row["stopped"] = stopped or self.study.user_attrs.get("stopped") or "interrupted"
            bar.close(f"best {row['best']} {row['median_us']} µs" if row["best"] != "-" else "no ok config")
            return row

    def _told_min(self) -> float | None:
        """The lowest ratio Optuna was told before (a resumed study), or None."""
        told = [t.user_attrs.get("ratio") for t in self.study.get_trials(deepcopy=False, states=(COMPLETE,))]
        return min((r for r in told if r is not None), default=None)

    def _out_of_time(self) -> bool:
        return bool(self.opts.timeout_s and time.monotonic() - self.t_start > self.opts.timeout_s)

    def _thread(self, proc: MeasurementProcess) -> None:
        """One measurement process's loop: its noise band, then trials until the level stops."""
        pg = self.progress
        try:
            env_id, band = self._noise_band(proc)
            while True:
                with pg.lock:
                    if self.stop.requested or pg.stopped or self._out_of_time():
                        return
                    try:
                        trial = self._next_trial()
                    except optuna.exceptions.UpdateFinishedTrialError:
                        trial = None  # another process finished the trial this one was pruning: nothing lost
                if trial is None:
                    if pg.stopped:
                        return
                    time.sleep(0.2)  # others run the last trials; a dead host's come back after its grace period
                    continue
                self._run_trial(proc, trial, env_id, band)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            pg.error = pg.error or e
            self.stop.requested = True

    def _trial_id(self, trial) -> int:
        return self.storage.get_trial_id_from_study_id_trial_number(self.optuna_study_id, trial.number)

    def _next_trial(self) -> optuna.Trial | None:
        """The next trial to measure, or None to wait (or when the level stopped). Under the progress lock."""
        study, pg = self.study, self.progress
        optuna.storages.fail_stale_trials(study)  # a dead host's trial is failed and re-queued (heartbeat)
        if not study.get_trials(deepcopy=False, states=(WAITING,)):
            level = self._level()
            why = self._why_stop(level)
            if why is not None:
                if not level.pending:  # nothing of this level still running anywhere
                    pg.stopped = why
                return None
            if not self.strategy.asks:
                proposals = self.strategy.propose(level, 1)
                if not proposals:
                    return None  # the rest is running elsewhere
                for cfg in proposals:
                    study.enqueue_trial(cfg.as_dict(), skip_if_exists=False)
        trial = study.ask(fixed_distributions=self.dists)
        trial_id = self._trial_id(trial)
        if self._beats:  # at once: a trial without any heartbeat is never failed as stale
            self.storage.record_heartbeat(trial_id)
        queued = "fixed_params" in self.storage.get_trial(trial_id).system_attrs
        if not (queued or self.strategy.asks):
            trial.set_user_attr("reason", "another process took the last queued trial first")
            study.tell(trial, state=PRUNED)
            return None
        return trial

    def _run_trial(self, proc: MeasurementProcess, trial: optuna.Trial, env_id: int, band: float) -> None:
        cfg = KernelConfig.from_dict(trial.params)
        why = self._not_a_candidate(cfg)
        if why is not None:  # a sampler's suggestion that needs no launch
            try:
                trial.set_user_attr("reason", why)
                self.study.tell(trial, state=PRUNED)
            except optuna.exceptions.UpdateFinishedTrialError:
                pass  # another process finished it first
            return
        key, original = self._duplicate_of(cfg) if self.plan.verdicts[cfg].feasible else (None, None)
        # the heartbeat runs until Optuna is told: a finalist re-measurement can take longer than the grace
        beat = Heartbeat(self.storage, self._trial_id(trial)) if self._beats else None
        t0 = time.monotonic()
        try:
            if not self.plan.verdicts[cfg].feasible:
                reply = MeasureReply(Verdict.INFEASIBLE, self.plan.verdicts[cfg].reason)
            elif original is not None:  # one measurement per distinct launch
                reply = MeasureReply(Verdict.DUPLICATE, f"launches exactly what trial {original} measured")
            else:
                reply = self.measure(proc, cfg, Phase.SCREEN, self.plan.space.measurement["rounds"], check=True)
            recorded = self.recorder.trial(
                proc, env_id, cfg, reply, band, trial.number, time.monotonic() - t0, key, original
            )
            self._tell(proc, trial, cfg, reply, recorded, band)
        except optuna.exceptions.UpdateFinishedTrialError:
            # this host's beats stalled past the grace and another host failed and re-queued the trial;
            # the tuner's tables hold the result, and the re-queued copy finds it recorded
            self.ui.warn(f"{cfg}: Optuna trial {trial.number} was failed by another host while measured here")
        finally:
            if beat is not None:
                beat.stop()

    def _not_a_candidate(self, cfg: KernelConfig) -> str | None:
        if not self.plan.space.satisfies(cfg) or cfg not in self.plan.verdicts:
            return "not a config of the space (its values or constraints exclude it)"
        with self.store.session() as s:
            if str(cfg) in queries.done_keys(s, self.study_id):
                return "already recorded in this study"
        return None

    def _tell(self, proc, trial, cfg: KernelConfig, reply: MeasureReply, recorded, band: float) -> None:
        """What Optuna learns of a trial the tuner has recorded (or that another process recorded first)."""
        pg = self.progress
        if recorded is False:  # another process or host recorded this config first
            trial.set_user_attr("reason", "recorded by another process first")
            self.study.tell(trial, state=PRUNED)
            return
        trial_id, stat = recorded
        with pg.lock:
            if reply.verdict in LAUNCHED:
                pg.n_new += 1
                if stat and (pg.best is None or stat.ratio < pg.best[1]):
                    pg.best = (str(cfg), stat.ratio, stat.median_us)
                pg.bar.advance(1, postfix=postfix(pg.best, band))
        trial.set_user_attr("tuner_trial_id", trial_id)
        trial.set_user_attr("verdict", reply.verdict.value)
        if reply.verdict != Verdict.OK:
            trial.set_user_attr("reason", reply.reason[:500] or reply.verdict.value)
            self.study.tell(trial, state=PRUNED)
            return
        if cfg == self.plan.space.baseline:
            self._baseline_us = baseline_median(reply.samples)
        final = self._record_finalist(proc, trial_id, cfg, stat, band)
        for k, v in ok_attrs(stat, final).items():
            trial.set_user_attr(k, v)
        told = final or stat
        with pg.lock:
            pg.told_min = told.ratio if pg.told_min is None else min(pg.told_min, told.ratio)
        self.study.tell(trial, told.ratio * self.reference())

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
        return self.recorder.finalist(proc, trial_id, cfg, band)

    def measure(self, proc: MeasurementProcess, cfg: KernelConfig, phase: str, rounds: int, check: bool):
        feas = self.plan.verdicts[cfg]
        if not feas.feasible:
            return MeasureReply(Verdict.INFEASIBLE, feas.reason)
        seed = measurement_seed(getattr(self.opts, "seed", 0), cfg, f"{self.plan.concurrency}/{phase}")
        req = self.plan.request(cfg, seed, rounds, check)
        return proc.measure(req, timeout_s=self.plan.space.measurement["trial_timeout_s"])

    def _duplicate_of(self, cfg: KernelConfig) -> tuple[str, int | None]:
        """The config's launch key, and the trial of this study that already measured that launch."""
        key = launch_key(cfg, self.plan.workload, self.plan.concurrency)
        with self.store.session() as s:
            return key, queries.measured_launch(s, self.study_id, key)

    # --- noise and the reference ---------------------------------------------------------------

    def _noise_band(self, proc: MeasurementProcess) -> tuple[int, float]:
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
            seed = measurement_seed(getattr(self.opts, "seed", 0), base, f"{plan.concurrency}/aa")
            c = calibrate.measure(proc, plan.space, plan.workload, plan.concurrency, base, pairs, seed=seed)
            with self.store.session() as s:
                calibrate.store_calibration(s, c, proc.info, plan.spec, plan.concurrency, self.opts.backend, base)
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
        resumes and GPUs (so Optuna orders trials as the ratios do): the baseline's median in this study's own
        baseline trial, which is queued first; this kernel's A/A median if another trial is told before it."""
        if self.reference_us is None:
            ref = self._baseline_us or self._aa_us
            shared_write(lambda: self.study.set_user_attr("reference_us", ref))
            self.reference_us = ref
        return self.reference_us


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


def _key(params: dict) -> str:
    try:
        return str(KernelConfig.from_dict(params))
    except (ValueError, TypeError):
        return ""
