"""Optuna trials written the cheap way: many finished trials in one transaction, and a finished trial's value
and attributes revised in place (a finalist's rounds update its config's one trial instead of adding another).

Optuna's public API adds finished trials one transaction each (``Study.add_trial``) and refuses to change a
finished trial. For an :class:`optuna.storages.RDBStorage` this module writes Optuna's own rows through its
models in one session, and keeps this process's cached copy of a revised trial in step; an
:class:`optuna.storages.InMemoryStorage` (the replay backend's queue) is updated through its own methods.
"""

from __future__ import annotations

import datetime
import json

import optuna
from optuna.distributions import distribution_to_json
from optuna.storages._rdb import models as om
from optuna.storages._rdb.storage import _create_scoped_session
from optuna.trial import FrozenTrial


def _backend(storage):
    return getattr(storage, "_backend", storage)  # a _CachedStorage wraps the RDBStorage


def add_finished(study: optuna.Study, trials: list[FrozenTrial]) -> None:
    """Add finished trials (``optuna.trial.create_trial``'s) to ``study``: one transaction for them all."""
    if not trials:
        return
    storage, study_id = study._storage, study._study_id
    rdb = _backend(storage)
    if not isinstance(rdb, optuna.storages.RDBStorage):
        for t in trials:
            study.add_trial(t)
        return
    with _create_scoped_session(rdb.scoped_session) as session:
        om.StudyModel.find_or_raise_by_id(study_id, session, for_update=True)  # numbers are counted under it
        rows = [
            om.TrialModel(
                study_id=study_id,
                number=None,
                state=t.state,
                datetime_start=t.datetime_start,
                datetime_complete=t.datetime_complete,
            )
            for t in trials
        ]
        session.add_all(rows)
        session.flush()
        order = sorted(range(len(rows)), key=lambda i: rows[i].trial_id)
        first = rows[order[0]].count_past_trials(session)
        extra = []
        for k, i in enumerate(order):
            row, t = rows[i], trials[i]
            row.number = first + k
            if t.value is not None:
                stored, kind = om.TrialValueModel.value_to_stored_repr(t.value)
                extra.append(om.TrialValueModel(trial_id=row.trial_id, objective=0, value=stored, value_type=kind))
            for name, value in t.params.items():
                dist = t.distributions[name]
                extra.append(
                    om.TrialParamModel(
                        trial_id=row.trial_id,
                        param_name=name,
                        param_value=dist.to_internal_repr(value),
                        distribution_json=distribution_to_json(dist),
                    )
                )
            extra += [
                om.TrialUserAttributeModel(trial_id=row.trial_id, key=k_, value_json=json.dumps(v))
                for k_, v in t.user_attrs.items()
            ]
        session.add_all(extra)


def start_trial(study: optuna.Study, params: dict, distributions: dict, system_attrs: dict) -> optuna.Trial:
    """A RUNNING trial of ``params`` with its heartbeat, created in one transaction: an ``enqueue_trial`` and
    ``ask`` write the queued trial, take it and set each parameter (about ten transactions), and even Optuna's
    ``create_new_trial`` looks the trial up again for each parameter. Its ``fixed_params`` system attribute is
    an enqueued trial's, so a stale one's retry is queued the same way."""
    system_attrs = {"fixed_params": dict(params), **system_attrs}
    storage, study_id = study._storage, study._study_id
    rdb = _backend(storage)
    if not isinstance(rdb, optuna.storages.RDBStorage):
        frozen = FrozenTrial(
            number=-1,
            state=optuna.trial.TrialState.RUNNING,
            value=None,
            datetime_start=datetime.datetime.now(),
            datetime_complete=None,
            params=dict(params),
            distributions=dict(distributions),
            user_attrs={},
            system_attrs=system_attrs,
            intermediate_values={},
            trial_id=-1,
        )
        return optuna.Trial(study, storage.create_new_trial(study_id, template_trial=frozen))
    with _create_scoped_session(rdb.scoped_session) as session:
        om.StudyModel.find_or_raise_by_id(study_id, session, for_update=True)  # numbers are counted under it
        row = om.TrialModel(
            study_id=study_id,
            number=None,
            state=optuna.trial.TrialState.RUNNING,
            datetime_start=datetime.datetime.now(),
        )
        session.add(row)
        session.flush()
        row.number = row.count_past_trials(session)
        trial_id = row.trial_id
        session.add_all(
            [
                *(
                    om.TrialParamModel(
                        trial_id=trial_id,
                        param_name=name,
                        param_value=distributions[name].to_internal_repr(value),
                        distribution_json=distribution_to_json(distributions[name]),
                    )
                    for name, value in params.items()
                ),
                *(
                    om.TrialSystemAttributeModel(trial_id=trial_id, key=k, value_json=json.dumps(v))
                    for k, v in system_attrs.items()
                ),
                om.TrialHeartbeatModel(trial_id=trial_id),  # at once: a trial with no heartbeat never goes stale
            ]
        )
    return optuna.Trial(study, trial_id)


def revise(study: optuna.Study, number: int, value: float, attrs: dict) -> None:
    """Set a finished trial's value and user attributes (by trial number), in the storage and in this
    process's view of it."""
    storage, study_id = study._storage, study._study_id
    trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, number)
    rdb = _backend(storage)
    if isinstance(rdb, optuna.storages.RDBStorage):
        with _create_scoped_session(rdb.scoped_session) as session:
            row = om.TrialModel.find_or_raise_by_id(trial_id, session, for_update=True)
            stored, kind = om.TrialValueModel.value_to_stored_repr(value)
            tv = om.TrialValueModel.find_by_trial_and_objective(row, 0, session)
            if tv is None:
                session.add(om.TrialValueModel(trial_id=trial_id, objective=0, value=stored, value_type=kind))
            else:
                tv.value, tv.value_type = stored, kind
            for key, v in attrs.items():
                a = om.TrialUserAttributeModel.find_by_trial_and_key(row, key, session)
                if a is None:
                    session.add(om.TrialUserAttributeModel(trial_id=trial_id, key=key, value_json=json.dumps(v)))
                else:
                    a.value_json = json.dumps(v)
    cached = _cached(storage, study_id, trial_id, number)
    if cached is not None:  # the same object this process's reads return (deepcopy=False)
        cached.value = value
        cached.user_attrs = {**cached.user_attrs, **attrs}
    if isinstance(storage, optuna.storages.InMemoryStorage):
        with storage._lock:
            done = [t for t in storage._studies[study_id].trials if t.state == optuna.trial.TrialState.COMPLETE]
            best = min(done, key=lambda t: t.value, default=None)
            storage._studies[study_id].best_trial_id = None if best is None else best._trial_id


def _cached(storage, study_id: int, trial_id: int, number: int) -> FrozenTrial | None:
    if isinstance(storage, optuna.storages.InMemoryStorage):
        return storage._get_trial(trial_id)
    info = getattr(storage, "_studies", {}).get(study_id)
    trials = getattr(info, "trials", None)
    return trials.get(number) if isinstance(trials, dict) else None


def set_attrs(trial: optuna.Trial, attrs: dict) -> None:
    """A running trial's user attributes, all in one transaction (``Trial.set_user_attr`` commits each)."""
    storage = trial.study._storage
    rdb = _backend(storage)
    if not isinstance(rdb, optuna.storages.RDBStorage) or len(attrs) < 2:
        for k, v in attrs.items():
            trial.set_user_attr(k, v)
        return
    trial_id = trial._trial_id
    with _create_scoped_session(rdb.scoped_session) as session:
        row = om.TrialModel.find_or_raise_by_id(trial_id, session, for_update=True)
        rdb.check_trial_is_updatable(trial_id, row.state)
        for k, v in attrs.items():
            rdb._set_trial_attr_without_commit(session, om.TrialUserAttributeModel, trial_id, k, v)
    cached = _cached(storage, trial.study._study_id, trial_id, trial.number)
    if cached is not None:
        cached.user_attrs = {**cached.user_attrs, **attrs}
