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

import dataclasses
import functools
import json
import math
import threading
import time
from dataclasses import dataclass
from dataclasses import field

import optuna

from sparse_mla_tuner.db import queries
from sparse_mla_tuner.db.verdicts import Phase
from sparse_mla_tuner.db.verdicts import Verdict
from sparse_mla_tuner.tuner import optuna_rows
from sparse_mla_tuner.tuner import stats
from sparse_mla_tuner.tuner import strategies
from sparse_mla_tuner.tuner.adapter import KernelAdapter
from sparse_mla_tuner.tuner.adapter import default_adapter
from sparse_mla_tuner.tuner.candidates import LAUNCHED
from sparse_mla_tuner.tuner.candidates import LevelView
from sparse_mla_tuner.tuner.candidates import new_value_variants  # noqa: F401 - part of this module's interface
from sparse_mla_tuner.tuner.clock import Clock
from sparse_mla_tuner.tuner.clock import TimedStore
from sparse_mla_tuner.tuner.feasibility import Feasibility
from sparse_mla_tuner.tuner.heartbeat import HEARTBEAT_S
from sparse_mla_tuner.tuner.heartbeat import OWNER_ATTR
from sparse_mla_tuner.tuner.heartbeat import Heartbeat
from sparse_mla_tuner.tuner.heartbeat import owner
from sparse_mla_tuner.tuner.measure import MeasurementProcess
from sparse_mla_tuner.tuner.noise import StudyNoise
from sparse_mla_tuner.tuner.output import us
from sparse_mla_tuner.tuner.progress import Progress
from sparse_mla_tuner.tuner.protocol import MeasureReply
from sparse_mla_tuner.tuner.protocol import MeasureRequest
from sparse_mla_tuner.tuner.recorder import StudyRecorder
from sparse_mla_tuner.tuner.recorder import StudyRecords
from sparse_mla_tuner.tuner.recorder import baseline_median
from sparse_mla_tuner.tuner.recorder import measurement_seed
from sparse_mla_tuner.tuner.recorder import ok_attrs
from sparse_mla_tuner.tuner.recorder import shared_write
from sparse_mla_tuner.tuner.recorder import slug  # noqa: F401 - part of this module's interface
from sparse_mla_tuner.tuner.recorder import study_name  # noqa: F401
from sparse_mla_tuner.tuner.space import SearchSpace
from sparse_mla_tuner.tuner.summary import postfix
from sparse_mla_tuner.tuner.summary import summary_row

KernelConfig = Workload = object  # annotations: the adapter's config and workload types

EXPECTED_SHARE = 0.2  # a model strategy's share of a level's launches before any level finished (bench_search)
PROMOTE = 1 / 3  # successive halving's share of screened launches that get the rest of the screening rounds
WAITING, RUNNING, COMPLETE, PRUNED = (
    optuna.trial.TrialState.WAITING,
    optuna.trial.TrialState.RUNNING,
    optuna.trial.TrialState.COMPLETE,
    optuna.trial.TrialState.PRUNED,
)


@dataclass(frozen=True)
class StudyPlan:
    """What one study measures: one workload at one concurrency, with the feasibility verdicts."""

    space: SearchSpace
    spec: object  # the adapter's parsed workload entry (name, workload(), fields())
    workload: Workload
    concurrency: int
    verdicts: dict[KernelConfig, Feasibility]
    sampler: str  # the strategy's name (tuner.strategies.NAMES)

    def order(self) -> list[KernelConfig]:
        """Every config, the baseline first."""
        base = self.space.baseline
        return [base] + [c for c in self.verdicts if c != base]

    @functools.cached_property  # a plan is immutable; its launch keys take ~40 ms to compute
    def _launches(self) -> dict[str, list[KernelConfig]]:
        groups: dict[str, list[KernelConfig]] = {}
        for cfg in self.order():
            if self.verdicts[cfg].feasible:
                groups.setdefault(launch_key(cfg, self.workload, self.concurrency, self.space.adapter), []).append(cfg)
        return groups

    @functools.cached_property
    def _representatives(self) -> dict[str, KernelConfig]:
        return {str(c): group[0] for group in self._launches.values() for c in group}

    def launches(self) -> dict[str, list[KernelConfig]]:
        """Feasible configs grouped by launch identity, in :meth:`order`; the first of a group is measured,
        the others launch exactly the same kernels on the same grid and are recorded as its duplicates."""
        return {k: list(v) for k, v in self._launches.items()}

    def to_measure(self) -> list[KernelConfig]:
        """One config per distinct launch (the baseline's group is represented by the baseline)."""
        return [group[0] for group in self.launches().values()]

    def representatives(self) -> dict[str, KernelConfig]:
        """Every feasible config's key -> the config that stands for its launch."""
        return self._representatives

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


class StudyRun(LevelView, StudyNoise, StudyRecords):
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
        self.clock = Clock()  # where this level's time goes (compile, GPU, model, database, other)
        self.plan, self.store, self.storage, self.processes = plan, TimedStore(store, self.clock), storage, processes
        self.ui = ui or Progress(quiet=True, total_studies=1)  # tuner.progress: what the user sees
        self.strategy = strategy or strategies.make(plan.sampler, opts.seed)
        self.reference_us: float | None = None  # this study's baseline median; Optuna's value = ratio x this
        self._baseline_us: float | None = None  # the baseline trial's own median, once measured here
        self._aa_us: float | None = None  # the median of the A/A this study's band comes from
        self._beats = hasattr(storage, "record_heartbeat")  # the replay backend's in-memory queue has none
        self._beaten: set[int] = set()  # running trials of other processes given one heartbeat here
        self._owner = owner()  # this process, as the owner of the trials it asks
        self._stale_checked = -math.inf  # when this run last failed stale trials (at most every HEARTBEAT_S)
        self.opts, self.stop, self.t_start = opts, stop, t_start
        self.dists = optuna_distributions(plan.space)
        self.recorder = StudyRecorder(self)
        self.band = plan.space.measurement.get("min_effect", stats.DEFAULT_MIN_EFFECT)
        self.expected_share: float | None = None  # the share of launches measured at this search's finished levels
        self.more = False  # a finished level reopened by a larger --n-trials: measured up to it, no stop rule

    # --- opening -------------------------------------------------------------------------------

    def _load_study(self) -> None:
        """The Optuna study (created if new)."""
        sampler = self.strategy.sampler(self.plan.space.sampler.get("seed", 0) + self.opts.seed)
        self.study = optuna.create_study(
            study_name=self.name, storage=self.storage, direction="minimize", load_if_exists=True, sampler=sampler
        )
        self.optuna_study_id = self.storage.get_study_id_from_name(self.name)

    def _finished(self) -> str | None:
        """Why the level stopped, when an earlier run finished it and this run does not ask for more: not
        ``--redo``, and no ``--n-trials`` above both the launches it measured and the cap it finished under.
        A level asked for more is reopened (its ``stopped`` attribute cleared, so an interrupted continuation
        resumes as any interrupted level does); with a larger ``--n-trials`` it measures up to that many
        launches, the strategy's stop rule set aside."""
        attrs = self.study.user_attrs
        stopped = attrs.get("stopped")
        if not stopped:
            return None
        n, cap = self.opts.n_trials, attrs.get("n_trials")
        more = bool(n and n > self._n_launched() and (cap is None or n > cap))
        if not (self.opts.redo or more):
            return stopped
        self.more = more and not self.opts.redo
        shared_write(lambda: self.study.set_user_attr("stopped", None))
        return None

    def _n_launched(self) -> int:
        """The distinct launches this study has measured (whatever came of them)."""
        rep = self.plan.representatives()
        with self.store.session() as s:
            rows = queries.done_verdicts(s, self.study_id)
        return len({rep[k] for k, v in rows.items() if k in rep and v in LAUNCHED})

    def _open_study(self, done: set[str]) -> None:
        """The Optuna study, with the baseline and the configs measured first queued (once per launch)."""
        self._describe_study()
        optuna.storages.fail_stale_trials(self.study)
        self._settle_running_trials()  # a trial of a process that ended is failed and queued again
        self.reference_us = self.study.user_attrs.get("reference_us")
        self.prior = self._prior_picks(done)
        self.queue_order = self._queue_order(self.prior)
        self._neighbours = self._make_neighbours()
        self.history = self._history()
        level = self._level()
        pending = {str(c) for c in level.pending}
        first = [self.plan.space.baseline, *self.prior]
        for cfg in [c for c in self.queue_order if c in first]:
            if cfg not in level.measured and str(cfg) not in pending:
                self.study.enqueue_trial(cfg.as_dict(), skip_if_exists=False)

    # --- running -------------------------------------------------------------------------------

    def run(self) -> dict:
        """Measure until the strategy stops the level, then the finalists; returns the study's summary row."""
        t0 = time.perf_counter()
        row = self._run()
        row.update(self.clock.split(time.perf_counter() - t0))
        return row

    def _run(self) -> dict:
        with self.clock.section("database"):
            done = self._open_rows()
            self._load_study()
        name = f"{self.plan.spec.name} C={self.plan.concurrency}"
        with self.clock.section("database"):
            finished = self._finished()
        if finished is not None:
            return self._finished_row(name, finished)
        with self.clock.section("database"):
            self._open_study(done)
        total = self._expected()
        with self.ui.study(name, total=total, initial=min(self.n_measured, total)) as bar:
            self.bar = bar
            self.progress = _Progress(bar, told_min=self._told_min())
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
            with self.clock.section("database"):
                if stopped and not self.stop.requested:  # recorded without launching anything
                    self.recorder.infeasible(self._done_keys())
                    self.recorder.duplicates()
                    self.recorder.finalists(self.processes[0])
                    shared_write(lambda: self.study.set_user_attr("n_trials", self.opts.n_trials))
                    shared_write(lambda: self.study.set_user_attr("stopped", stopped))
                self.recorder.decide()
                with self.store.session() as s:
                    row = summary_row(s, self.study_id, self.plan.spec.name, self.plan.concurrency)
            row["strategy"] = self.strategy.name
            row["stopped"] = stopped or self.study.user_attrs.get("stopped") or "interrupted"
            bar.close(f"best {row['best']} {us(float(row['median_us']))}" if row["best"] != "-" else "no ok config")
            return row

    def _finished_row(self, name: str, stopped: str) -> dict:
        """A level an earlier run finished: its stored summary row; nothing is measured."""
        with self.ui.study(name, total=0) as bar:
            bar.phase(f"finished earlier ({stopped}); --redo searches it again")
            with self.store.session() as s:
                row = summary_row(s, self.study_id, self.plan.spec.name, self.plan.concurrency)
            row["strategy"] = self.study.user_attrs.get("strategy", self.strategy.name)
            row["stopped"] = stopped
            bar.close(f"best {row['best']} {row['median_us']} µs" if row["best"] != "-" else "no ok config")
        return row

    def _expected(self, done: int | None = None) -> int:
        """The launches this level is expected to measure, for the progress line's count and time left: the
        strategy's share of the candidates (``expected_share``, or the share measured at the levels this search
        finished, or :data:`EXPECTED_SHARE`; all of them for the grid), within ``--n-trials``; always more
        than ``done``, while candidates are left."""
        n = len(self.queue_order)
        share = getattr(self.strategy, "expected_share", None) or self.expected_share
        if share is None:
            share = 1.0 if self.strategy.name == "grid" else EXPECTED_SHARE
        want = math.ceil(share * n)
        cap = self.opts.n_trials or self.plan.space.sampler.get("n_trials")
        if cap:
            want = min(want, cap)
        done = self.n_measured if done is None else done
        return min(n, max(want, done + 1))

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
                        with self.clock.section("database"):
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
        now = time.monotonic()
        if now - self._stale_checked >= HEARTBEAT_S:  # a dead host's trial is failed and re-queued (heartbeat)
            optuna.storages.fail_stale_trials(study)
            self._stale_checked = now
        if not study.get_trials(deepcopy=False, states=(WAITING,)):
            level = self._level()
            with self.clock.section("model"):
                why = self._why_stop(level)
            if why is not None:
                # done when nothing of this level is still queued or running anywhere: a trial already recorded
                # may still be running its finalist rounds elsewhere, or be a dead process's, to be retried
                if not level.pending and not self._settle_running_trials():
                    pg.stopped = why
                return None
            with self.clock.section("model"):
                proposals = self.strategy.propose(level, 1, self.history)
            if not proposals:
                return None  # the rest is running elsewhere
            # the proposal runs here and now: created running, with its owner, in one transaction
            # (and its first heartbeat: a trial without any is never failed as stale)
            owned = {OWNER_ATTR: self._owner} if self._beats and self._owner else {}
            return optuna_rows.start_trial(study, proposals[0].as_dict(), self.dists, owned)
        trial = study.ask(fixed_distributions=self.dists)
        trial_id = trial._trial_id
        if self._beats:  # at once: a trial without any heartbeat is never failed as stale
            self.storage.record_heartbeat(trial_id)
            if self._owner:  # and who runs it: a resumed search fails it at once if this process has ended
                self.storage.set_trial_system_attr(trial_id, OWNER_ATTR, self._owner)
        queued = "fixed_params" in trial.storage.get_trial(trial_id).system_attrs
        if not queued:
            trial.set_user_attr("reason", "another process took the last queued trial first")
            study.tell(trial, state=PRUNED)
            return None
        return trial

    def _run_trial(self, proc: MeasurementProcess, trial: optuna.Trial, env_id: int, band: float) -> None:
        cfg = self.plan.space.adapter.config_type.from_dict(trial.params)
        why = self._not_a_candidate(cfg)
        if why is not None and self._tell_recorded(proc, trial, cfg, band):
            return  # the retry of a trial whose process recorded it and ended before Optuna was told
        if why is not None:  # a sampler's suggestion that needs no launch
            try:
                trial.set_user_attr("reason", why)
                self.study.tell(trial, state=PRUNED)
            except optuna.exceptions.UpdateFinishedTrialError:
                pass  # another process finished it first
            return
        key, original = self._duplicate_of(cfg) if self.plan.verdicts[cfg].feasible else (None, None)
        # the heartbeat runs until Optuna is told: a finalist re-measurement can take longer than the grace
        beat = Heartbeat(self.storage, trial._trial_id, beaten=True) if self._beats else None
        t0 = time.monotonic()
        try:
            if not self.plan.verdicts[cfg].feasible:
                reply = MeasureReply(Verdict.INFEASIBLE, self.plan.verdicts[cfg].reason)
            elif original is not None:  # one measurement per distinct launch
                reply = MeasureReply(Verdict.DUPLICATE, f"launches exactly what trial {original} measured")
            else:
                reply = self._screen(proc, cfg)
            recorded = self.recorder.trial(
                proc, env_id, cfg, reply, band, trial.number, time.monotonic() - t0, key, original
            )
            with self.clock.section("database"):
                self._tell(proc, trial, cfg, reply, recorded, band)
        except optuna.exceptions.UpdateFinishedTrialError:
            # this host's beats stalled past the grace and another host failed and re-queued the trial;
            # the tuner's tables hold the result, and the re-queued copy finds it recorded
            self.ui.warn(f"{cfg}: Optuna trial {trial.number} was failed by another host while measured here")
        finally:
            if beat is not None:
                beat.stop()

    def _screen(self, proc: MeasurementProcess, cfg: KernelConfig) -> MeasureReply:
        """The screening rounds of one launch, by successive halving: ``screen_rounds`` first, then the rest of
        ``rounds`` only if the launch is promising (:meth:`_promising`); the baseline always gets all of them."""
        m = self.plan.space.measurement
        rounds, first = m["rounds"], m.get("screen_rounds", m["rounds"])
        if cfg == self.plan.space.baseline or first >= rounds:
            return self.measure(proc, cfg, Phase.SCREEN, rounds, check=True)
        reply = self.measure(proc, cfg, Phase.SCREEN, first, check=True)
        if reply.verdict != Verdict.OK or not reply.samples or not self._promising(reply.samples):
            return reply
        more = self.measure(proc, cfg, f"{Phase.SCREEN}/promoted", rounds - first, check=False)
        if more.verdict != Verdict.OK:
            return more
        return dataclasses.replace(reply, samples=[*reply.samples, *more.samples])

    def _promising(self, samples: list[tuple[float, float]]) -> bool:
        """Whether a launch's first screening rounds earn it the rest (asynchronous successive halving): its
        paired ratio ranks in the best :data:`PROMOTE` of the level's measured launches, itself included, or
        lies within twice the band of the best; every launch is promoted while fewer than 3 are measured."""
        ratio = math.exp(sum(math.log(a / b) for a, b in samples) / len(samples))
        with self.progress.lock:
            seen = sorted(math.exp(y) for y in self._level().measured.values() if y is not None)
        if len(seen) < 3:
            return True
        rank = sum(r < ratio for r in seen)  # launches measured better than this one
        return rank < math.ceil(PROMOTE * (len(seen) + 1)) or ratio <= seen[0] * (1 + 2 * self.band)

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
                pg.bar.advance(1, postfix=postfix(pg.best, band), total=self._expected(pg.bar.done + 1))
        attrs = {"tuner_trial_id": trial_id, "verdict": reply.verdict.value}
        if reply.verdict != Verdict.OK:
            optuna_rows.set_attrs(trial, {**attrs, "reason": reply.reason[:500] or reply.verdict.value})
            self.study.tell(trial, state=PRUNED)
            return
        if cfg == self.plan.space.baseline:
            self._baseline_us = baseline_median(reply.samples)
        self._tell_ok(proc, trial, cfg, stat, self._record_finalist(proc, trial_id, cfg, stat, band), attrs)

    def _tell_ok(self, proc, trial, cfg: KernelConfig, stat, final, attrs: dict) -> None:
        """Optuna is told an ok trial's value (its finalist estimate if it has one, else its screening one),
        with ``attrs`` and what :func:`ok_attrs` shows (one transaction for the attributes)."""
        pg = self.progress
        optuna_rows.set_attrs(trial, {**attrs, **ok_attrs(stat, final)})
        told = final or stat
        with pg.lock:
            pg.told_min = told.ratio if pg.told_min is None else min(pg.told_min, told.ratio)
        self.study.tell(trial, told.ratio * self.reference())

    def _tell_recorded(self, proc, trial, cfg: KernelConfig, band: float) -> bool:
        """A retried trial whose config its first process recorded ok, and ended before Optuna was told (killed
        in the finalist rounds, say): this one tells Optuna what that process would have told, with the
        finalist rounds that process would have measured, so a resumed study holds what an uninterrupted one
        holds. False when the result is not ok or Optuna was told it already."""
        with self.store.session() as s:
            t = queries.done_configs(s, self.study_id).get(str(cfg))
            if t is None or t.verdict != Verdict.OK or t.statistic(Phase.SCREEN) is None:
                return False
            trial_id, stat, final = t.id, t.statistic(Phase.SCREEN), t.statistic(Phase.FINALIST)
        told = (x.user_attrs.get("tuner_trial_id") for x in self.study.get_trials(deepcopy=False, states=(COMPLETE,)))
        if trial_id in set(told):
            return False
        attrs = {"tuner_trial_id": trial_id, "verdict": Verdict.OK.value}
        if cfg == self.plan.space.baseline:
            self._baseline_us = stat.baseline_median_us
        self._tell_ok(proc, trial, cfg, stat, final or self._record_finalist(proc, trial_id, cfg, stat, band), attrs)
        return True

    def _duplicate_of(self, cfg: KernelConfig) -> tuple[str, int | None]:
        """The config's launch key, and the trial of this study that already measured that launch."""
        key = launch_key(cfg, self.plan.workload, self.plan.concurrency, self.plan.space.adapter)
        with self.store.session() as s:
            return key, queries.measured_launch(s, self.study_id, key)

    def measure(self, proc: MeasurementProcess, cfg: KernelConfig, phase: str, rounds: int, check: bool):
        feas = self.plan.verdicts[cfg]
        if not feas.feasible:
            return MeasureReply(Verdict.INFEASIBLE, feas.reason)
        seed = measurement_seed(self.opts.seed, cfg, f"{self.plan.concurrency}/{phase}")
        req = self.plan.request(cfg, seed, rounds, check)
        with self.clock.section("gpu"):
            return proc.measure(req, timeout_s=self.plan.space.measurement["trial_timeout_s"])


def optuna_distributions(space: SearchSpace) -> dict[str, optuna.distributions.CategoricalDistribution]:
    """Every declared parameter as the categorical distribution of its values in ``space`` (how a trial asks)."""
    return {p: optuna.distributions.CategoricalDistribution(space.parameters[p]) for p in space.adapter.param_names}


def launch_key(cfg: KernelConfig, workload: Workload, concurrency: int, adapter: KernelAdapter | None = None) -> str:
    """The launch identity (compiled binary + grid, :meth:`KernelAdapter.launch_identity`) as a string the
    database can index (``adapter``: the space's; by default the one a space that names none gets)."""
    return json.dumps((adapter or default_adapter()).launch_identity(cfg, workload, concurrency))
