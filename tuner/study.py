"""One study: one (space, workload, concurrency, device, backend), measured by one or more processes.

The study is an Optuna study in the results database. What it measures next comes from its strategy
(:mod:`tuner.strategies`): whenever Optuna's queue is empty, the strategy proposes open candidates (feasible
launches not yet measured at this level) and the study enqueues them, so resuming, several GPUs and several
hosts share one queue. The level stops when its strategy
says why (the reason is shown in the summary and kept as the study's ``stopped`` attribute), or at
``--n-trials`` measurements; then its finalists are re-measured.

A study has three parts, each owning its state, and :class:`StudyRun` is the loop that joins them (one
measurement thread per measurement process), passing values: what to measure next
(:class:`tuner.candidates.Candidates`), how to measure (:class:`tuner.noise.Measurer`) and what is recorded
(:class:`tuner.recorder.StudyRecorder` for the tuner's rows, :class:`tuner.optuna_study.OptunaStudy` for
Optuna's).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Hashable
from dataclasses import dataclass
from dataclasses import field

import optuna

from ..db.verdicts import Verdict
from . import stats
from . import strategies
from .adapter import KernelAdapter
from .adapter import default_adapter
from .adapter import stored_launch
from .candidates import LAUNCHED
from .candidates import Candidates
from .candidates import new_value_variants  # noqa: F401 - part of this module's interface
from .clock import Clock
from .clock import TimedStore
from .feasibility import Feasibility
from .heartbeat import Heartbeat
from .measure import MeasurementProcess
from .noise import Measurer
from .optuna_study import OptunaStudy
from .optuna_study import optuna_distributions  # noqa: F401 - part of this module's interface
from .output import us
from .progress import Progress
from .protocol import MeasureReply
from .protocol import MeasureRequest
from .recorder import NoiseRecords
from .recorder import SpaceHistory
from .recorder import StudyRecorder
from .recorder import baseline_median
from .recorder import slug  # noqa: F401 - part of this module's interface
from .recorder import study_name  # noqa: F401
from .space import SearchSpace
from .summary import postfix

KernelConfig = Workload = object  # annotations: the adapter's config and workload types


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

    @functools.cached_property  # a plan is immutable; its launch identities take ~40 ms to compute
    def _launches(self) -> dict[Hashable, list[KernelConfig]]:
        groups: dict[Hashable, list[KernelConfig]] = {}
        adapter = self.space.adapter
        for cfg in self.order():
            if self.verdicts[cfg].feasible:
                groups.setdefault(adapter.launch_identity(cfg, self.workload, self.concurrency), []).append(cfg)
        return groups

    @functools.cached_property
    def _representatives(self) -> dict[KernelConfig, KernelConfig]:
        return {c: group[0] for group in self._launches.values() for c in group}

    def launches(self) -> dict[Hashable, list[KernelConfig]]:
        """Feasible configs grouped by launch identity (:meth:`KernelAdapter.launch_identity`), in :meth:`order`;
        the first of a group is measured, the others launch exactly the same kernels on the same grid and are
        recorded as its duplicates (:func:`launch_key` is an identity as the database stores it)."""
        return {k: list(v) for k, v in self._launches.items()}

    def to_measure(self) -> list[KernelConfig]:
        """One config per distinct launch (the baseline's group is represented by the baseline)."""
        return [group[0] for group in self.launches().values()]

    def representatives(self) -> dict[KernelConfig, KernelConfig]:
        """Every feasible config -> the config that stands for its launch."""
        return self._representatives

    def request(self, cfg: KernelConfig, seed: int, rounds: int, check: bool) -> MeasureRequest:
        adapter = self.space.adapter.spec
        return MeasureRequest(self.workload, self.concurrency, cfg, self.space.baseline, rounds, seed, check, adapter)


@dataclass
class _Progress:
    """What the measurement threads of one study share (under ``lock``)."""

    bar: object = None  # tuner.progress's task of this study (set when the level opens)
    lock: threading.Lock = field(default_factory=threading.Lock)
    n_new: int = 0  # launches measured by this run
    error: BaseException | None = None
    stopped: str | None = None  # why the level is done
    best: tuple[str, float, float] | None = None  # (config, ratio, median µs) of this run's screening


class StudyRun:
    """One study, run: the loop that joins its three parts, passing values between them.

    - what to measure next: :class:`tuner.candidates.Candidates` (the level's candidates, the strategy, the
      stop and promotion rules);
    - how to measure: :class:`tuner.noise.Measurer` (screens, finalists, A/A and band);
    - what is recorded: :class:`tuner.recorder.StudyRecorder` (the tuner's rows) and
      :class:`tuner.optuna_study.OptunaStudy` (what Optuna is told).
    """

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
        history: SpaceHistory | None = None,
    ):
        self.clock = Clock()  # where this level's time goes (compile, GPU, model, database, other)
        self.plan, self.processes, self.opts, self.stop, self.t_start = plan, processes, opts, stop, t_start
        self.ui = ui or Progress(quiet=True, total_studies=1)  # tuner.progress: what the user sees
        self.strategy = strategy or strategies.make(plan.sampler, opts.seed)
        n_trials = opts.n_trials or plan.space.sampler.get("n_trials")
        min_effect = plan.space.measurement.get("min_effect", stats.DEFAULT_MIN_EFFECT)
        self.candidates = Candidates(plan, self.strategy, n_trials, min_effect)
        self.measurer = Measurer(plan, opts.seed, self.clock)
        self.records = StudyRecorder(plan, TimedStore(store, self.clock), opts, processes[0].info)
        self.noise_records = NoiseRecords(self.records)
        self.optuna = OptunaStudy(plan.space, storage)
        self.progress = _Progress()
        self.history = history or SpaceHistory()  # the workload's recorded trials, shared by a search's levels

    # --- opening -------------------------------------------------------------------------------------------------

    def _finished(self) -> str | None:
        """Why the level stopped, when an earlier run finished it and this run does not ask for more: not
        ``--redo``, and no ``--n-trials`` above both the launches it measured and the cap it finished under.
        A level asked for more is reopened (its ``stopped`` attribute cleared, so an interrupted continuation
        resumes as any interrupted level does); with a larger ``--n-trials`` it measures up to that many
        launches, the strategy's stop rule set aside."""
        attrs = self.optuna.attrs
        mine = self.records.finished()  # the tuner's own record; Optuna's attributes for a level finished before it
        stopped, cap = mine if mine is not None else (attrs.get("stopped"), attrs.get("n_trials"))
        if not stopped:
            return None
        n = self.opts.n_trials
        more = bool(n and n > self.records.n_launched() and (cap is None or n > cap))
        if not (self.opts.redo or more):
            return stopped
        self.candidates.more = more and not self.opts.redo
        self.optuna.set_attr("stopped", None)
        self.records.set_finished(None, None)
        return None

    def _open(self, done: set) -> None:
        """The Optuna study described and settled, the candidates opened, and the baseline and the configs
        measured first queued (once per launch)."""
        plan, rec, cand = self.plan, self.records, self.candidates
        device = rec.info["gpu_name"]
        self.optuna.describe(
            {
                "objective": "median_us: this study's baseline median x the candidate's paired ratio (lower is better)",
                "space": plan.space.name,
                "workload": plan.spec.name,
                "concurrency": plan.concurrency,
                "device": device,
                "backend": self.opts.backend,
                "target_arch": plan.space.target,
                "baseline": str(plan.space.baseline),
                "kernel_hash": rec.kernel_hash,
                "strategy": self.strategy.name,
            }
        )
        self.optuna.open()
        history = cand.history_of(rec.history(self.history), rec.study_id, rec.kernel_id, device)
        cand.open(self.opts.first, rec.prior_ranked(), done, history)
        level = self.level()
        first = {plan.space.baseline, *cand.prior}
        self.optuna.enqueue(
            [c for c in cand.queue_order if c in first and c not in level.measured and c not in level.pending]
        )

    def level(self, read: bool = True) -> strategies.Level:
        """The level as the strategy sees it, brought up to date with what was recorded since the last look (the
        trials queued or running read anew, or with ``read=False`` as :meth:`OptunaStudy.waiting` just read them)."""
        self.candidates.update(self.records.measured_since())
        return self.candidates.level(self.optuna.pending_params(read))

    # --- running -------------------------------------------------------------------------------------------------

    def run(self) -> dict:
        """Measure until the strategy stops the level, then the finalists; returns the study's summary row."""
        t0 = time.perf_counter()
        row = self._run()
        row.update(self.clock.split(time.perf_counter() - t0))
        return row

    def _run(self) -> dict:
        plan, rec, opt, pg = self.plan, self.records, self.optuna, self.progress
        with self.clock.section("database"):
            done = rec.open()
            opt.load(rec.name, self.strategy.sampler(plan.space.sampler.get("seed", 0) + self.opts.seed))
            finished = self._finished()
        name = f"{plan.spec.name} C={plan.concurrency}"
        if finished is not None:
            return self._finished_row(name, finished)
        with self.clock.section("database"):
            self._open(done)
        total = self.candidates.expected()
        with self.ui.study(name, total=total, initial=min(self.candidates.n_measured, total)) as bar:
            pg.bar = bar
            if self.candidates.prior:
                given = "the configs given with --first, then " if self.opts.first else ""
                prior = " ".join(map(str, self.candidates.prior))
                bar.phase(f"first {given}the previous kernel's best (and untried values): {prior}")
            threads = [threading.Thread(target=_measuring(self, p), daemon=True) for p in self.processes]
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():
                    t.join(timeout=0.5)  # keeps the main thread responsive to Ctrl-C
            if pg.error is not None:
                raise pg.error
            with self.clock.section("database"):
                if pg.stopped and not self.stop.requested:  # recorded without launching anything
                    self._unlaunched(rec.infeasible())
                    self._unlaunched(rec.duplicates())
                    self._finalists(self.processes[0])
                    opt.set_attr("n_trials", self.opts.n_trials)
                    opt.set_attr("stopped", pg.stopped)
                    rec.set_finished(pg.stopped, self.opts.n_trials)
                rec.decide()
                row = rec.summary_row()
            row["strategy"] = self.strategy.name
            row["stopped"] = pg.stopped or opt.attrs.get("stopped") or "interrupted"
            bar.close(f"best {row['best']} {us(float(row['median_us']))}" if row["best"] != "-" else "no ok config")
            return row

    def _finished_row(self, name: str, stopped: str) -> dict:
        """A level an earlier run finished: its stored summary row; nothing is measured."""
        with self.ui.study(name, total=0) as bar:
            bar.phase(f"finished earlier ({stopped}); --redo searches it again")
            row = self.records.summary_row()
            row["strategy"] = self.optuna.attrs.get("strategy", self.strategy.name)
            row["stopped"] = stopped
            bar.close(f"best {row['best']} {row['median_us']} µs" if row["best"] != "-" else "no ok config")
        return row

    # --- telling -------------------------------------------------------------------------------------------------

    def tell(self, proc, trial, cfg: KernelConfig, reply: MeasureReply, recorded, band: float) -> None:
        """What Optuna learns of a trial the tuner has recorded (or that another process recorded first)."""
        pg = self.progress
        if recorded is False:  # another process or host recorded this config first
            self.optuna.prune(trial, {"reason": "recorded by another process first"})
            return
        trial_id, stat = recorded
        with pg.lock:
            if reply.verdict in LAUNCHED:
                pg.n_new += 1
                if stat and (pg.best is None or stat.ratio < pg.best[1]):
                    pg.best = (str(cfg), stat.ratio, stat.median_us)
                pg.bar.advance(1, postfix=postfix(pg.best, band), total=self.candidates.expected(pg.bar.done + 1))
        attrs = {"tuner_trial_id": trial_id, "verdict": reply.verdict.value}
        if reply.verdict != Verdict.OK:
            self.optuna.prune(trial, {**attrs, "reason": reply.reason[:500] or reply.verdict.value})
            return
        if cfg == self.plan.space.baseline:
            self.optuna.set_baseline(baseline_median(reply.samples))
        self._tell_ok(trial, stat, self._record_finalist(proc, trial_id, cfg, stat, band), attrs)

    def _tell_ok(self, trial, stat, final, attrs: dict) -> None:
        """Optuna is told an ok trial's value: its finalist estimate if it has one, else its screening one."""
        self._reference()  # the study's reference_us, fixed by the first value told
        self.optuna.tell_ok(trial, attrs, stat, final)

    def tell_recorded(self, proc, trial, cfg: KernelConfig, band: float) -> bool:
        """A retried trial whose config its first process recorded ok, and ended before Optuna was told (killed
        in the finalist rounds, say): this one tells Optuna what that process would have told, with the
        finalist rounds that process would have measured, so a resumed study holds what an uninterrupted one
        holds. False when the result is not ok or Optuna was told it already."""
        found = self.records.recorded_ok(cfg)
        if found is None:
            return False
        trial_id, stat, final = found
        if trial_id in self.optuna.told_trial_ids():
            return False
        attrs = {"tuner_trial_id": trial_id, "verdict": Verdict.OK.value}
        if cfg == self.plan.space.baseline:
            self.optuna.set_baseline(stat.baseline_median_us)
        self._tell_ok(trial, stat, final or self._record_finalist(proc, trial_id, cfg, stat, band), attrs)
        return True

    def _record_finalist(self, proc, trial_id: int, cfg: KernelConfig, stat, band: float):
        """A screening result that beats everything told to Optuna so far is re-measured with the finalist
        rounds at once, and Optuna is told that estimate instead.

        So every value Optuna holds is either a finalist estimate or a screening estimate no lower than some
        finalist estimate, and Optuna's best trial is the tuner's best (the best finalist). Returns the
        finalist statistic, or None.
        """
        k, rounds = self.plan.space.measurement["finalists"], self.plan.space.measurement["finalist_rounds"]
        first, record_low = self.optuna.record_low(stat.ratio)
        if not (k and rounds and record_low):
            return None
        if cfg == self.plan.space.baseline:  # the reference, not a contender
            self.progress.bar.phase(f"baseline {cfg}: {rounds} more rounds")
        else:
            why = "is the first ok config" if first else "beats all so far"
            self.progress.bar.phase(f"finalist: {cfg} {why}, {rounds} more rounds")
        return self.records.finalist(proc, trial_id, self.measurer.finalist(proc, cfg), band)

    def _finalists(self, proc) -> None:
        """Re-measure the top ``finalists`` by screening ratio that have no finalist statistic yet with
        ``finalist_rounds``, on one GPU, against its own band; each revises its config's Optuna trial."""
        todo, band = self.records.finalists_todo(proc)
        rounds = self.plan.space.measurement["finalist_rounds"]
        if todo and rounds:
            self.progress.bar.phase(f"finalists: {len(todo)} x {rounds} rounds")
        told = self.optuna.told_trial_ids()  # once: a finalist revises its own trial, never another's
        for trial_id, cfg, screen in todo if rounds else []:
            final = self.records.finalist(proc, trial_id, self.measurer.finalist(proc, cfg), band)
            if final is not None:
                self.optuna.finalist(trial_id, cfg, screen, final, told.get(trial_id))

    def _unlaunched(self, items: list[tuple]) -> None:
        """Configs decided without a launch: the tuner's rows in one transaction, their Optuna trials in another."""
        if items:
            self.optuna.unlaunched(items, self.records.unlaunched(items))

    def _reference(self) -> float:
        """The study's one scale of Optuna's values (:meth:`OptunaStudy.reference`)."""
        verdict = self.plan.verdicts.get(self.plan.space.baseline)
        wait_s = self.plan.space.measurement["trial_timeout_s"] if verdict is not None and verdict.feasible else 0
        return self.optuna.reference(self.records.recorded_baseline_us, wait_s, self.measurer.aa_us)


def launch_key(cfg: KernelConfig, workload: Workload, concurrency: int, adapter: KernelAdapter | None = None) -> str:
    """The launch identity (compiled binary + grid, :meth:`KernelAdapter.launch_identity`) as the string the
    database stores and indexes (``adapter``: the space's; by default the one a space that names none gets)."""
    return stored_launch((adapter or default_adapter()).launch_identity(cfg, workload, concurrency))


def _measuring(run: StudyRun, proc: MeasurementProcess) -> _Measuring:
    """The loop of one measurement process in ``run``, given the parts of the study it uses."""
    timeout_s = run.opts.timeout_s
    return _Measuring(
        proc,
        plan=run.plan,
        candidates=run.candidates,
        measurer=run.measurer,
        records=run.records,
        noise_records=run.noise_records,
        optuna_study=run.optuna,
        progress=run.progress,
        clock=run.clock,
        stop=run.stop,
        ui=run.ui,
        deadline=run.t_start + timeout_s if timeout_s else None,
        level=run.level,
        tell=run.tell,
        tell_recorded=run.tell_recorded,
    )


class _Measuring:
    """One measurement process's loop in a study (a thread): its band, then the next trial, measured and
    handed to the study to record, until the level stops. It is given the study's parts it uses: the plan, what to
    measure next (``candidates``, and ``level``: the level as the strategy sees it now), how to measure
    (``measurer``), what is recorded (``records``, ``noise_records``, ``optuna``), and what the study tells of a
    measured trial (``tell``; ``tell_recorded``: a retried trial another process recorded)."""

    def __init__(
        self,
        proc: MeasurementProcess,
        *,
        plan: StudyPlan,
        candidates: Candidates,
        measurer: Measurer,
        records: StudyRecorder,
        noise_records: NoiseRecords,
        optuna_study: OptunaStudy,
        progress: _Progress,
        clock: Clock,
        stop,
        ui,
        deadline: float | None,
        level,
        tell,
        tell_recorded,
    ) -> None:
        self.proc, self.plan, self.candidates, self.measurer = proc, plan, candidates, measurer
        self.records, self.noise_records, self.optuna = records, noise_records, optuna_study
        self.progress, self.clock, self.stop, self.ui, self.deadline = progress, clock, stop, ui, deadline
        self.level, self.tell, self.tell_recorded = level, tell, tell_recorded
        self.env_id, self.band = 0, 0.0  # this process's environment row and noise band (set when it starts)

    def __call__(self) -> None:
        """The loop: the process's noise band, then trials until the level stops."""
        pg = self.progress
        try:
            self.proc.begin()  # (simulated GPUs: this thread runs when its turn comes; a real process: at once)
            self.env_id, self.band = self._noise_band()
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
                    self.proc.idle()  # others run the last trials; a dead host's come back after its grace period
                    continue
                self._run_trial(trial)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            pg.error = pg.error or e
            self.stop.requested = True
        finally:
            self.proc.end()

    def _out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline

    def _noise_band(self) -> tuple[int, float]:
        """The band this GPU's verdicts use in the study (see :mod:`tuner.noise`) and its environment id."""
        proc, measurer, noise = self.proc, self.measurer, self.noise_records
        env_id, known, cal = noise.noise(proc)
        if known is not None:
            band = measurer.known_band(*known)
            self.candidates.set_band(band)
            return env_id, band
        if cal is None:
            c = measurer.aa(proc, self.progress.bar.phase)
            noise.calibration(proc, c)
            cal = (c.spread, c.multimodal, c.samples)
        spread, multimodal, samples = cal
        band = measurer.band(spread, samples)
        self.candidates.set_band(band)
        self.optuna.set_attr("noise_band", band)
        noise.band(proc, band, spread, measurer.min_effect, multimodal, samples)
        if multimodal:
            self.ui.warn(
                f"warning: the baseline's A/A samples look multimodal (two speeds) at C={self.plan.concurrency}; "
                "treat close calls with care"
            )
        return env_id, band

    def _next_trial(self) -> optuna.Trial | None:
        """The next trial to measure, or None to wait (or when the level stopped). Under the progress lock."""
        cand, opt = self.candidates, self.optuna
        if not opt.waiting():
            level = self.level(read=False)
            with self.clock.section("model"):
                why = cand.why_stop(level, self.stop.requested)
            if why is not None:
                # done when nothing of this level is still queued or running anywhere: a trial already recorded
                # may still be running its finalist rounds elsewhere, or be a dead process's, to be retried
                if not level.pending and not opt.settle_running():
                    self.progress.stopped = why
                return None
            with self.clock.section("model"):
                cfg = cand.propose(level)
            return None if cfg is None else opt.start(cfg)  # the rest may run elsewhere
        return opt.take()

    def _run_trial(self, trial: optuna.Trial) -> None:
        plan, proc, env_id, band, rec = self.plan, self.proc, self.env_id, self.band, self.records
        cfg = plan.space.adapter.config_type.from_dict(trial.params)
        why = self.candidates.not_a_candidate(cfg, rec.recorded)
        if why is not None and self.tell_recorded(proc, trial, cfg, band):
            return  # the retry of a trial whose process recorded it and ended before Optuna was told
        if why is not None:  # a sampler's suggestion that needs no launch
            try:
                self.optuna.prune(trial, {"reason": why})
            except optuna.exceptions.UpdateFinishedTrialError:
                pass  # another process finished it first
            return
        feas = plan.verdicts[cfg]
        key = launch_key(cfg, plan.workload, plan.concurrency, plan.space.adapter) if feas.feasible else None
        original = rec.measured_launch(key) if feas.feasible else None
        # the heartbeat runs until Optuna is told: a finalist re-measurement can take longer than the grace
        beat = Heartbeat(self.optuna.storage, trial._trial_id, beaten=True) if self.optuna.beats else None
        t0 = time.monotonic()
        try:
            if not feas.feasible:
                reply = MeasureReply(Verdict.INFEASIBLE, feas.reason)
            elif original is not None:  # one measurement per distinct launch
                reply = MeasureReply(Verdict.DUPLICATE, f"launches exactly what trial {original} measured")
            else:
                reply = self.measurer.screen(proc, cfg, self._promising)
            wall_s = time.monotonic() - t0
            recorded = rec.trial(proc, env_id, cfg, reply, band, trial.number, wall_s, key, original)
            with self.clock.section("database"):
                self.tell(proc, trial, cfg, reply, recorded, band)
        except optuna.exceptions.UpdateFinishedTrialError:
            # this host's beats stalled past the grace and another host failed and re-queued the trial;
            # the tuner's tables hold the result, and the re-queued copy finds it recorded
            self.ui.warn(f"{cfg}: Optuna trial {trial.number} was failed by another host while measured here")
        finally:
            if beat is not None:
                beat.stop()

    def _promising(self, samples: list[tuple[float, float]]) -> bool:
        """Whether a launch's first screening rounds earn it the rest (:meth:`Candidates.promising`), against
        the level as recorded now, by every process."""
        with self.progress.lock:
            self.candidates.update(self.records.measured_since())
            return self.candidates.promising(samples)
