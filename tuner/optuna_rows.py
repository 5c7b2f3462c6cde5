"""Optuna trials written the cheap way: many finished trials in one transaction, and a finished trial's value
and attributes revised in place (a finalist's rounds update its config's one trial instead of adding another).

Optuna's public API adds finished trials one transaction each (``Study.add_trial``) and refuses to change a
finished trial. For an :class:`optuna.storages.RDBStorage` this module writes Optuna's own rows through its
models in one session, and keeps this process's cached copy of a revised trial in step; an
:class:`optuna.storages.InMemoryStorage` (the replay backend's queue) is updated through its own methods.

Where the public API does the same at the same cost it is used (any storage but an RDB one, a sampler other than
Optuna's default, a value Optuna would refuse). The rest writes and reads Optuna's private tables
(``optuna.storages._rdb.models``) and helpers, each for a cost the public API cannot avoid: revising a finished
trial (no public way), a level's finished trials in one transaction, a started or ended trial in one, the queue and
the told trials as columns. ``tests/test_optuna_rows.py`` pins what is used to the Optuna storage schema it was
written for (:data:`OPTUNA_SCHEMA`: the columns and the Alembic head), so an Optuna upgrade that changes them fails
there, loudly, before any database is written.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import math
import sqlite3

import optuna
import sqlalchemy
from optuna.distributions import distribution_to_json
from optuna.distributions import json_to_distribution
from optuna.storages._rdb import models as om
from optuna.storages._rdb.storage import _create_scoped_session
from optuna.trial import FrozenTrial
from sqlalchemy import func
from sqlalchemy import insert
from sqlalchemy import select

OPTUNA_SCHEMA = "v3.2.0.a"  # the Alembic head of Optuna's storage whose tables this module writes (Optuna 4.x-5.x)


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
    # Core inserts of plain rows (executemany): the ORM's unit of work over some 5,000 objects (a level's
    # infeasible and duplicate configs, their parameters and attributes) took most of a level's closing
    with _create_scoped_session(rdb.scoped_session) as session:
        om.StudyModel.find_or_raise_by_id(study_id, session, for_update=True)  # numbers are counted under it
        first = session.scalar(select(func.count(om.TrialModel.trial_id)).where(om.TrialModel.study_id == study_id))
        session.execute(
            insert(om.TrialModel.__table__),
            [
                _trial_row(
                    study_id=study_id,
                    number=first + k,
                    state=t.state,
                    datetime_start=t.datetime_start,
                    datetime_complete=t.datetime_complete,
                )
                for k, t in enumerate(trials)
            ],
        )
        numbered = select(om.TrialModel.number, om.TrialModel.trial_id).where(
            om.TrialModel.study_id == study_id, om.TrialModel.number >= first
        )
        ids = dict(session.execute(numbered).all())
        values, params, attrs = [], [], []
        for k, t in enumerate(trials):
            trial_id = ids[first + k]
            if t.value is not None:
                stored, kind = om.TrialValueModel.value_to_stored_repr(t.value)
                values.append({"trial_id": trial_id, "objective": 0, "value": stored, "value_type": kind})
            for name, value in t.params.items():
                dist = t.distributions[name]
                params.append(
                    {
                        "trial_id": trial_id,
                        "param_name": name,
                        "param_value": dist.to_internal_repr(value),
                        "distribution_json": distribution_to_json(dist),
                    }
                )
            attrs += [{"trial_id": trial_id, "key": k_, "value_json": json.dumps(v)} for k_, v in t.user_attrs.items()]
        for model, rows in (
            (om.TrialValueModel, values),
            (om.TrialParamModel, params),
            (om.TrialUserAttributeModel, attrs),
        ):
            if rows:
                session.execute(insert(model), rows)


def _trial_row(**fields) -> dict:
    """A ``trials`` row by column name, as Optuna's model writes it: through its own attributes, so that what they
    convert is converted (Optuna 5 keeps the times in UTC behind local-time properties)."""
    made = om.TrialModel(**fields)  # transient: never added to a session
    return {name: getattr(made, key) for name, key in _trial_columns()}


@functools.cache
def _trial_columns() -> tuple[tuple[str, str], ...]:
    mapper = sqlalchemy.inspect(om.TrialModel)
    columns = om.TrialModel.__table__.columns
    return tuple((c.name, mapper.get_property_by_column(c).key) for c in columns if not c.primary_key)


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
    now = datetime.datetime.now()
    with _create_scoped_session(rdb.scoped_session) as session:  # plain inserts: no ORM object, no re-read
        om.StudyModel.find_or_raise_by_id(study_id, session, for_update=True)  # numbers are counted under it
        number = session.scalar(select(func.count(om.TrialModel.trial_id)).where(om.TrialModel.study_id == study_id))
        row = _trial_row(study_id=study_id, number=number, state=optuna.trial.TrialState.RUNNING, datetime_start=now)
        trial_id = session.execute(insert(om.TrialModel.__table__).values(row)).inserted_primary_key[0]
        session.execute(
            insert(om.TrialParamModel),
            [
                {
                    "trial_id": trial_id,
                    "param_name": name,
                    "param_value": distributions[name].to_internal_repr(value),
                    "distribution_json": distribution_to_json(distributions[name]),
                }
                for name, value in params.items()
            ],
        )
        session.execute(
            insert(om.TrialSystemAttributeModel),
            [{"trial_id": trial_id, "key": k, "value_json": json.dumps(v)} for k, v in system_attrs.items()],
        )
        session.execute(insert(om.TrialHeartbeatModel).values(trial_id=trial_id))  # no heartbeat: never stale
    frozen = FrozenTrial(
        number=number,
        state=optuna.trial.TrialState.RUNNING,
        value=None,
        datetime_start=now,
        datetime_complete=None,
        params=dict(params),
        distributions=dict(distributions),
        user_attrs={},
        system_attrs=json.loads(json.dumps(system_attrs)),  # as the storage returns them
        intermediate_values={},
        trial_id=trial_id,
    )
    return _running(study, frozen)


def _running(study: optuna.Study, frozen: FrozenTrial) -> optuna.Trial:
    """The :class:`optuna.Trial` of a trial this process has just written, as ``optuna.Trial(study, trial_id)`` makes
    it (its ``__init__``, step by step) without reading the trial back from the storage (a query per parameter and
    attribute table; checked against Optuna's own in the tests)."""
    trial = optuna.Trial.__new__(optuna.Trial)
    trial.study, trial._trial_id, trial.storage = study, frozen._trial_id, study._storage
    trial._cached_frozen_trial = frozen
    study.sampler.before_trial(optuna.pruners._filter_study(study, frozen), frozen)
    trial.relative_search_space = None
    trial._relative_params = None
    trial._fixed_params = frozen.system_attrs.get("fixed_params", {})
    return trial


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


def finish(trial: optuna.Trial, attrs: dict, value: float | None = None, state=None) -> None:
    """Tell a running trial its user attributes and its end, ``value`` (complete) or ``state`` (pruned, failed), in
    one transaction: ``Trial.set_user_attr`` then ``Study.tell`` take one per attribute and one more, and ``tell``
    first reads the whole trial back. What it writes is what they write: the attributes, the value, the state and
    the time it ended (a trial another host finished first raises :class:`optuna.exceptions.UpdateFinishedTrialError`,
    as they do). Optuna's default sampler does nothing after a trial, so nothing is skipped; any other sampler, a
    storage that is not an :class:`optuna.storages.RDBStorage` or a value Optuna would refuse goes through ``tell``
    itself."""
    storage, study = trial.study._storage, trial.study
    rdb = _backend(storage)
    state = optuna.trial.TrialState.COMPLETE if value is not None else state
    sampler = study.sampler  # Optuna's default: its after_trial only processes constraints, and it has none
    plain = (
        type(sampler) is optuna.samplers.TPESampler
        and getattr(sampler, "_constraints_func", None) is None
        and type(sampler._random_sampler).after_trial is optuna.samplers.BaseSampler.after_trial
    )
    if not isinstance(rdb, optuna.storages.RDBStorage) or not plain or (value is not None and not math.isfinite(value)):
        for k, v in attrs.items():  # Optuna's public API: a transaction per attribute
            trial.set_user_attr(k, v)
        study.tell(trial, value, state=None if value is not None else state)
        return
    with _attributed(rdb, trial._trial_id, attrs) as (session, row):
        if value is not None:
            rdb._set_trial_value_without_commit(session, row, 0, float(value))
        row.state = state
        row.datetime_complete = datetime.datetime.now()


@contextlib.contextmanager
def _attributed(rdb, trial_id: int, attrs: dict):
    """A transaction on a running trial's row (locked; a finished trial raises
    :class:`optuna.exceptions.UpdateFinishedTrialError`) with its user attributes ``attrs`` set."""
    with _create_scoped_session(rdb.scoped_session) as session:
        row = om.TrialModel.find_or_raise_by_id(trial_id, session, for_update=True)
        rdb.check_trial_is_updatable(trial_id, row.state)
        _upsert_attrs(session, rdb, om.TrialUserAttributeModel, trial_id, attrs)
        yield session, row


def _upsert_attrs(session, rdb, model, trial_id: int, attrs: dict) -> None:
    """Set a running trial's attributes (``model``: user or system) in one statement where the database has an
    upsert (SQLite 3.24+, PostgreSQL), else one by one as Optuna does; the caller has checked the trial."""
    if not attrs:
        return
    rows = [{"trial_id": trial_id, "key": k, "value_json": json.dumps(v)} for k, v in attrs.items()]
    if rdb.engine.name == "sqlite" and sqlite3.sqlite_version_info >= (3, 24, 0):
        from sqlalchemy.dialects.sqlite import insert as upsert
    elif rdb.engine.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as upsert
    else:
        for k, v in attrs.items():
            rdb._set_trial_attr_without_commit(session, model, trial_id, k, v)
        return
    stmt = upsert(model).values(rows)
    session.execute(
        stmt.on_conflict_do_update(
            index_elements=[model.trial_id, model.key], set_={"value_json": stmt.excluded.value_json}
        )
    )


def unfinished(study: optuna.Study) -> list[tuple[optuna.trial.TrialState, dict]]:
    """``(state, params)`` of every trial queued or running, by number, read as columns: Optuna's ``get_trials``
    first reads whole every trial finished since its last look (the loop looks once per launch)."""
    states = (optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING)
    rdb = _backend(study._storage)
    if not isinstance(rdb, optuna.storages.RDBStorage):
        return [(t.state, t.params) for t in study.get_trials(deepcopy=False, states=states)]
    q = (
        select(
            om.TrialModel.trial_id,
            om.TrialModel.state,
            om.TrialParamModel.param_name,
            om.TrialParamModel.param_value,
            om.TrialParamModel.distribution_json,
        )
        .outerjoin(om.TrialParamModel, om.TrialParamModel.trial_id == om.TrialModel.trial_id)
        .where(om.TrialModel.study_id == study._study_id, om.TrialModel.state.in_(states))
        .order_by(om.TrialModel.number, om.TrialParamModel.param_id)
    )
    out: dict[int, tuple] = {}
    with _create_scoped_session(rdb.scoped_session) as session:
        for trial_id, state, name, value, dist in session.execute(q):
            params = out.setdefault(trial_id, (state, {}))[1]
            if name is not None:
                params[name] = _distribution(dist).to_external_repr(value)
    return list(out.values())


@functools.lru_cache(maxsize=256)
def _distribution(text: str):
    return json_to_distribution(text)


def told(study: optuna.Study, key: str) -> dict:
    """The user attribute ``key`` of every complete trial -> that trial's number (by number: a later trial's wins), read
    as two columns: Optuna's ``get_trials`` reads every trial whole (at a level's end several hundred pruned ones
    new to this process's cache, half a second for nothing)."""
    rdb = _backend(study._storage)
    if not isinstance(rdb, optuna.storages.RDBStorage):
        states = (optuna.trial.TrialState.COMPLETE,)
        return {t.user_attrs.get(key): t.number for t in study.get_trials(deepcopy=False, states=states)}
    q = (
        select(om.TrialModel.number, om.TrialUserAttributeModel.value_json)
        .join(om.TrialUserAttributeModel, om.TrialUserAttributeModel.trial_id == om.TrialModel.trial_id)
        .where(om.TrialModel.study_id == study._study_id, om.TrialModel.state == optuna.trial.TrialState.COMPLETE)
        .where(om.TrialUserAttributeModel.key == key)
        .order_by(om.TrialModel.number)
    )
    with _create_scoped_session(rdb.scoped_session) as session:
        return {json.loads(v): number for number, v in session.execute(q)}
