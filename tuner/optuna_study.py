"""What Optuna is told of a study: its trials, their values and attributes, and the study's reference.

:class:`OptunaStudy` is half of the recording part of a study (:mod:`tuner.study`; the tuner's own rows are
:class:`tuner.recorder.StudyRecorder`'s). Two rules keep Optuna's view equal to the tuner's. Every value Optuna
holds is the tuner's own median of the trial's config (µs) from its final statistic: the finalist rounds' when it
has them, else the screening rounds' (what `tuner best` and the summary show, and ``median_us_measured``); and a
screening result that beats every ratio told so far gets its finalist rounds before Optuna is told
(:meth:`tuner.study.StudyRun._record_finalist`). One config has one Optuna trial: a finalist revises it. The
study's ``reference_us`` (its own baseline median) stays an attribute: the scale its ratios read in.
"""

from __future__ import annotations

import math
import threading
import time

import optuna

from ..db.verdicts import Verdict
from . import optuna_rows
from .heartbeat import HEARTBEAT_S
from .heartbeat import OWNER_ATTR
from .heartbeat import owner
from .heartbeat import owner_alive
from .recorder import ok_attrs
from .recorder import shared_write

KernelConfig = object  # annotations: the adapter's config type
WAITING, RUNNING, COMPLETE, PRUNED, FAIL = (
    optuna.trial.TrialState.WAITING,
    optuna.trial.TrialState.RUNNING,
    optuna.trial.TrialState.COMPLETE,
    optuna.trial.TrialState.PRUNED,
    optuna.trial.TrialState.FAIL,
)


def optuna_distributions(space) -> dict[str, optuna.distributions.CategoricalDistribution]:
    """Every declared parameter as the categorical distribution of its values in ``space`` (how a trial asks)."""
    return {p: optuna.distributions.CategoricalDistribution(space.parameters[p]) for p in space.adapter.param_names}


class OptunaStudy:
    """One study's Optuna study: created or loaded, described, its queue, its running trials' owners and
    heartbeats, and every value and attribute it is told."""

    def __init__(self, space, storage) -> None:
        self.space, self.storage = space, storage
        self.name = ""  # set by load()
        self.dists = optuna_distributions(space)
        self.study: optuna.Study | None = None  # set by load()
        self.study_id = 0  # Optuna's id of the study
        self.reference_us: float | None = None  # this study's baseline median (the scale its ratios read in)
        self.baseline_us: float | None = None  # the baseline trial's own median, once measured here
        self.told_min: float | None = None  # the lowest ratio told so far (always a finalist's, see StudyRun._tell)
        self._lock = threading.Lock()  # told_min, shared by the study's measurement threads
        self._beats = hasattr(storage, "record_heartbeat")  # the replay backend's in-memory queue has none
        self._beaten: set[int] = set()  # running trials of other processes given one heartbeat here
        self._owner = owner()  # this process, as the owner of the trials it asks
        self._stale_checked = -math.inf  # when this run last failed stale trials (at most every HEARTBEAT_S)
        self._unfinished: list | None = None  # (state, params) of the trials queued or running at the last look

    # --- opening -------------------------------------------------------------------------------------------------

    def load(self, name: str, sampler) -> None:
        """The Optuna study ``name`` (created if new), with the strategy's sampler."""
        self.name = name
        self.study = optuna.create_study(
            study_name=self.name, storage=self.storage, direction="minimize", load_if_exists=True, sampler=sampler
        )
        self.study_id = self.storage.get_study_id_from_name(self.name)

    @property
    def attrs(self) -> dict:
        return self.study.user_attrs

    def set_attr(self, key: str, value) -> None:
        shared_write(lambda: self.study.set_user_attr(key, value))

    def describe(self, attrs: dict) -> None:
        """Metric name and attributes, so the study reads on its own in Optuna's tools (optuna-dashboard)."""
        shared_write(lambda: self.study.set_metric_names(["median_us"]))
        for k, v in attrs.items():
            self.set_attr(k, v)

    @property
    def beats(self) -> bool:
        """Whether the storage keeps heartbeats (the replay backend's in-memory queue does not)."""
        return self._beats

    def open(self) -> None:
        """Fail stale trials, settle the running ones, and take the stored reference and the lowest ratio told."""
        optuna.storages.fail_stale_trials(self.study)
        self.settle_running()  # a trial of a process that ended is failed and queued again
        self.reference_us = self.attrs.get("reference_us")
        told = [t.user_attrs.get("ratio") for t in self.study.get_trials(deepcopy=False, states=(COMPLETE,))]
        self.told_min = min((r for r in told if r is not None), default=None)

    def enqueue(self, configs: list[KernelConfig]) -> None:
        for cfg in configs:
            self.study.enqueue_trial(cfg.as_dict(), skip_if_exists=False)

    def settle_running(self) -> list:
        """The running trials of the study that another process runs, after failing (and re-queueing, as a stale
        heartbeat would) those whose process on this machine has ended; this process's own are left out.

        A running trial's owner says which process asked it (:mod:`tuner.heartbeat`). One whose process is gone
        is failed at once and its retry queued, so a resumed search continues with it instead of leaving it
        running for ever. One of another machine, or with no owner yet, gets one heartbeat from this process:
        Optuna fails only a trial whose heartbeat went silent, and a process killed between ``ask`` and its
        trial's first beat would otherwise hold that config as running for ever."""
        if not self._beats:
            return []
        others = []
        for t in self.study.get_trials(deepcopy=False, states=(RUNNING,)):
            tag = t.system_attrs.get(OWNER_ATTR)
            if tag and tag == self._owner:
                continue
            trial_id = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, t.number)
            if owner_alive(tag) is False:
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

    # --- the queue -----------------------------------------------------------------------------------------------

    def pending_params(self, read: bool = True) -> list[dict]:
        """The parameters of every trial queued or running; ``read=False``: as :meth:`waiting` has just read them
        (Optuna reads a study's unfinished trials anew at every look, whichever states are asked)."""
        if read or self._unfinished is None:
            self._unfinished = optuna_rows.unfinished(self.study)
        return [params for _, params in self._unfinished]

    def waiting(self) -> bool:
        """Whether a trial is queued; first fails a dead host's trials (at most every HEARTBEAT_S), which
        re-queues them. The trials queued or running are kept for :meth:`pending_params`."""
        now = time.monotonic()
        if now - self._stale_checked >= HEARTBEAT_S:
            optuna.storages.fail_stale_trials(self.study)
            self._stale_checked = now
        self._unfinished = optuna_rows.unfinished(self.study)
        return any(state == WAITING for state, _ in self._unfinished)

    def start(self, cfg: KernelConfig) -> optuna.Trial:
        """A proposal that runs here and now: created running, with its owner and first heartbeat (a trial
        without any is never failed as stale), in one transaction."""
        owned = {OWNER_ATTR: self._owner} if self._beats and self._owner else {}
        return optuna_rows.start_trial(self.study, cfg.as_dict(), self.dists, owned)

    def take(self) -> optuna.Trial | None:
        """The next queued trial, now running here (with its first heartbeat and owner); None when another
        process took the last queued one first (Optuna then made a new trial, pruned here)."""
        trial = self.study.ask(fixed_distributions=self.dists)
        trial_id = trial._trial_id
        if self._beats:  # at once: a trial without any heartbeat is never failed as stale
            self.storage.record_heartbeat(trial_id)
            if self._owner:  # and who runs it: a resumed search fails it at once if this process has ended
                self.storage.set_trial_system_attr(trial_id, OWNER_ATTR, self._owner)
        if "fixed_params" not in trial.storage.get_trial(trial_id).system_attrs:
            self.prune(trial, {"reason": "another process took the last queued trial first"})
            return None
        return trial

    # --- telling -------------------------------------------------------------------------------------------------

    def prune(self, trial, attrs: dict) -> None:
        optuna_rows.finish(trial, attrs, state=PRUNED)

    def record_low(self, ratio: float) -> tuple[bool, bool]:
        """(whether nothing was told a value yet, whether ``ratio`` is below every value told so far)."""
        with self._lock:
            first = self.told_min is None
            return first, first or ratio < self.told_min

    def set_baseline(self, median_us: float) -> None:
        """The baseline trial's own median, measured here: the reference unless one is stored already."""
        self.baseline_us = median_us

    def tell_ok(self, trial, attrs: dict, screen, final) -> None:
        """An ok trial's value (the tuner's median of its finalist rounds if it has them, else of its screening
        rounds), with ``attrs`` and what :func:`ok_attrs` shows (one transaction for the attributes)."""
        told = final or screen
        with self._lock:
            self.told_min = told.ratio if self.told_min is None else min(self.told_min, told.ratio)
        optuna_rows.finish(trial, {**attrs, **ok_attrs(screen, final)}, told.median_us)

    def told_trial_ids(self) -> dict[int, int]:
        """The tuner trial id -> Optuna trial number of every trial told a value."""
        return optuna_rows.told(self.study, "tuner_trial_id")

    def finalist(self, trial_id: int, cfg: KernelConfig, screen, final, number: int | None) -> None:
        """A finalist's estimate: its config's one trial (Optuna's ``number``, from :meth:`told_trial_ids`) revised
        to the finalist rounds' median, or a trial added when there is none (its process ended before Optuna was
        told)."""
        attrs = {"tuner_trial_id": trial_id, "verdict": Verdict.OK.value, **ok_attrs(screen, final)}
        if number is not None:
            optuna_rows.revise(self.study, number, final.median_us, attrs)
            return
        trial = optuna.trial.create_trial(
            state=COMPLETE,
            params=cfg.as_dict(),
            distributions=self.dists,
            value=final.median_us,
            user_attrs=attrs,
        )
        self.study.add_trial(trial)

    def unlaunched(self, items: list[tuple], ids: list[int | None]) -> None:
        """One pruned trial, with its reason, per config recorded without a launch (``items`` as
        :meth:`tuner.recorder.StudyRecorder.unlaunched` takes them), in one transaction."""
        made = []
        for (cfg, reply, _, original), trial_id in zip(items, ids, strict=True):
            if trial_id is None:
                continue  # another process recorded it first
            attrs = {"tuner_trial_id": trial_id, "verdict": reply.verdict.value, "reason": reply.reason[:500]}
            if original is not None:
                attrs["duplicate_of"] = original
            made.append(
                optuna.trial.create_trial(
                    state=PRUNED, params=cfg.as_dict(), distributions=self.dists, user_attrs=attrs
                )
            )
        optuna_rows.add_finished(self.study, made)

    def reference(self, recorded_baseline, wait_s: float, aa_us: float | None) -> float:
        """The one scale of Optuna's values in this study, fixed when the first value is told and kept across
        resumes, GPUs and processes (so Optuna orders trials as the ratios do): the baseline's median in this
        study's own baseline trial, which is queued first.

        Every process that shares the study must use the same number, or Optuna's best is not the tuner's
        (two processes each holding the scale they computed gave two scales in one study). So the number is
        read where all of them see it: the value already stored with the study, else the baseline trial as the
        database recorded it (``recorded_baseline()``: whether it is recorded, and its median if ok). A process
        that has a value to tell before the baseline is recorded waits for it, at most ``wait_s``; only when
        the baseline cannot give it (not feasible, not ok, never recorded) does the A/A median ``aa_us`` stand
        in."""
        if self.reference_us is not None:
            return self.reference_us
        deadline = time.monotonic() + wait_s
        while True:
            stored = self.storage.get_study_user_attrs(self.study_id).get("reference_us")
            if stored:
                self.reference_us = float(stored)
                return self.reference_us
            recorded, ref = recorded_baseline()
            if ref is None and (recorded or self.baseline_us or time.monotonic() >= deadline):
                ref = self.baseline_us or aa_us  # the baseline cannot give it: the A/A stands in
            if ref is not None:
                break
            time.sleep(0.1)
        self.set_attr("reference_us", ref)
        self.reference_us = ref
        return ref
