"""Optuna's rows written and read the cheap way (``tuner/optuna_rows.py``) hold what Optuna's own API would hold."""

import math

import optuna
import pytest

from sparse_mla_tuner.tuner import optuna_rows
from sparse_mla_tuner.tuner.search import _storage

DISTS = {
    "BLOCK_T": optuna.distributions.CategoricalDistribution([16, 32, 64]),
    "num_warps": optuna.distributions.CategoricalDistribution([2, 4, 8]),
}
PRUNED, COMPLETE = optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.COMPLETE


def _study(tmp_path, name):
    storage = _storage(f"sqlite:///{tmp_path / 'o.db'}")
    return optuna.create_study(study_name=name, storage=storage, direction="minimize", load_if_exists=True)


def _view(study):
    """Every trial as Optuna reads it back from a fresh storage: what any other process sees."""
    url = study._storage._backend.url
    fresh = optuna.load_study(study_name=study.study_name, storage=optuna.storages.RDBStorage(url))
    return [
        (t.number, t.state, t.value, t.params, t.user_attrs, t.system_attrs, t.datetime_complete is not None)
        for t in fresh.get_trials()
    ]


def test_a_started_trial_is_the_trial_optuna_makes_of_its_row(tmp_path):
    study = _study(tmp_path, "s")
    trial = optuna_rows.start_trial(study, {"BLOCK_T": 32, "num_warps": 4}, DISTS, {"tuner_owner": "me"})
    theirs = optuna.Trial(study, trial._trial_id)  # Optuna's own constructor, reading the row back
    assert trial.params == theirs.params == {"BLOCK_T": 32, "num_warps": 4}
    assert trial.number == theirs.number == 0
    assert set(vars(trial)) == set(vars(theirs))
    for key in ("_trial_id", "relative_search_space", "_relative_params", "_fixed_params"):
        assert getattr(trial, key) == getattr(theirs, key), key
    mine, stored = trial._cached_frozen_trial, theirs._cached_frozen_trial
    for key in ("number", "state", "params", "distributions", "user_attrs", "system_attrs", "datetime_start"):
        assert getattr(mine, key) == getattr(stored, key), key


@pytest.mark.parametrize("value", [1.25, None])
def test_finish_writes_what_optunas_public_api_writes(tmp_path, value):
    attrs = {"tuner_trial_id": 7, "verdict": "ok", "ratio_ci": [0.9, 1.1]}
    views = []
    for name in ("ours", "optunas"):
        study = _study(tmp_path, name)
        trial = optuna_rows.start_trial(study, {"BLOCK_T": 16, "num_warps": 8}, DISTS, {})
        trial.set_user_attr("verdict", "stale")  # an attribute set before is overwritten, as Optuna does
        if name == "ours":
            optuna_rows.finish(trial, attrs, value, state=None if value is not None else PRUNED)
        else:
            for k, v in attrs.items():
                trial.set_user_attr(k, v)
            study.tell(trial, value, state=None if value is not None else PRUNED)
        views.append(_view(study))
    assert views[0] == views[1]
    assert views[0][0][1] == (COMPLETE if value is not None else PRUNED) and views[0][0][6]


def test_finish_refuses_a_trial_another_host_finished(tmp_path):
    study = _study(tmp_path, "s")
    trial = optuna_rows.start_trial(study, {"BLOCK_T": 16, "num_warps": 8}, DISTS, {})
    study._storage.set_trial_state_values(trial._trial_id, state=optuna.trial.TrialState.FAIL)
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        optuna_rows.finish(trial, {"verdict": "ok"}, 1.0)


def test_a_value_optuna_would_refuse_fails_the_trial_as_tell_does(tmp_path):
    study = _study(tmp_path, "s")
    trial = optuna_rows.start_trial(study, {"BLOCK_T": 16, "num_warps": 8}, DISTS, {})
    with pytest.warns(UserWarning, match="nan is not acceptable"):  # Optuna's own tell, and its warning
        optuna_rows.finish(trial, {"verdict": "ok"}, math.nan)
    assert study.get_trials()[0].state == optuna.trial.TrialState.FAIL


def test_bulk_finished_trials_unfinished_and_told_read_as_optuna_reads_them(tmp_path):
    study = _study(tmp_path, "s")
    study.enqueue_trial({"BLOCK_T": 64, "num_warps": 2})  # waiting: no parameters yet, as Optuna shows it
    running = optuna_rows.start_trial(study, {"BLOCK_T": 16, "num_warps": 4}, DISTS, {})
    made = [
        optuna.trial.create_trial(
            state=PRUNED, params={"BLOCK_T": b, "num_warps": 2}, distributions=DISTS, user_attrs={"reason": f"r{b}"}
        )
        for b in (16, 32)
    ] + [
        optuna.trial.create_trial(
            state=COMPLETE, params={"BLOCK_T": 64, "num_warps": 8}, distributions=DISTS, value=0.5,
            user_attrs={"tuner_trial_id": 11},
        )
    ]  # fmt: skip
    optuna_rows.add_finished(study, made)
    other = _study(tmp_path, "other")  # another study's trials are none of these
    optuna_rows.add_finished(other, made[:1])

    reference = _study(tmp_path, "reference")  # the same through Optuna's public API
    reference.enqueue_trial({"BLOCK_T": 64, "num_warps": 2})
    optuna_rows.start_trial(reference, {"BLOCK_T": 16, "num_warps": 4}, DISTS, {})
    for t in made:
        reference.add_trial(t)
    assert _view(study) == _view(reference)
    assert [t.number for t in study.get_trials()] == [0, 1, 2, 3, 4]

    states = (optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING)
    assert optuna_rows.unfinished(study) == [(t.state, t.params) for t in study.get_trials(states=states)]
    assert optuna_rows.unfinished(study)[1] == (optuna.trial.TrialState.RUNNING, running.params)
    assert optuna_rows.told(study, "tuner_trial_id") == {11: 4}


# What tuner/optuna_rows.py (and tuner/compact.py, tuner/upgrade.py) take of Optuna's private storage: the tables and
# columns they write or read, and the helpers they call. An Optuna release that changes any of them fails here.
PINNED_COLUMNS = {
    "studies": {"study_id": "INTEGER", "study_name": "VARCHAR(512)"},
    "trials": {
        "trial_id": "INTEGER",
        "number": "INTEGER",
        "study_id": "INTEGER",
        "state": "VARCHAR(8)",
        "datetime_start": "DATETIME",
        "datetime_complete": "DATETIME",
    },
    "trial_params": {
        "param_id": "INTEGER",
        "trial_id": "INTEGER",
        "param_name": "VARCHAR(512)",
        "param_value": "FLOAT",
        "distribution_json": "TEXT",
    },
    "trial_values": {
        "trial_value_id": "INTEGER",
        "trial_id": "INTEGER",
        "objective": "INTEGER",
        "value": "FLOAT",
        "value_type": "VARCHAR(7)",
    },
    "trial_user_attributes": {
        "trial_user_attribute_id": "INTEGER",
        "trial_id": "INTEGER",
        "key": "VARCHAR(512)",
        "value_json": "TEXT",
    },
    "trial_system_attributes": {
        "trial_system_attribute_id": "INTEGER",
        "trial_id": "INTEGER",
        "key": "VARCHAR(512)",
        "value_json": "TEXT",
    },
    "trial_heartbeats": {"trial_heartbeat_id": "INTEGER", "trial_id": "INTEGER", "heartbeat": "DATETIME"},
}
PINNED_HELPERS = [
    ("optuna.storages._rdb.storage", "_create_scoped_session"),
    ("optuna.storages._rdb.storage", "RDBStorage._set_trial_value_without_commit"),
    ("optuna.storages._rdb.storage", "RDBStorage._set_trial_attr_without_commit"),
    ("optuna.storages._rdb.storage", "RDBStorage.check_trial_is_updatable"),
    ("optuna.storages._rdb.models", "StudyModel.find_or_raise_by_id"),
    ("optuna.storages._rdb.models", "TrialModel.find_or_raise_by_id"),
    ("optuna.storages._rdb.models", "TrialValueModel.value_to_stored_repr"),
    ("optuna.storages._rdb.models", "TrialValueModel.find_by_trial_and_objective"),
    ("optuna.storages._rdb.models", "TrialUserAttributeModel.find_by_trial_and_key"),
    ("optuna.pruners", "_filter_study"),
]


def test_the_private_tables_written_are_those_of_the_pinned_optuna_schema():
    """The Alembic head of Optuna's storage is the one optuna_rows was written for, and every private table,
    column and helper it uses is still there as it was: an Optuna upgrade that changes them fails here."""
    import importlib
    from pathlib import Path

    from alembic.script import ScriptDirectory
    from optuna.storages._rdb import models as om

    head = ScriptDirectory(str(Path(om.__file__).parent / "alembic")).get_heads()
    assert head == [optuna_rows.OPTUNA_SCHEMA], (
        f"Optuna {optuna.__version__}'s storage schema is {head}, not {optuna_rows.OPTUNA_SCHEMA}: check "
        "tuner/optuna_rows.py's private writes against its tables, then move the pin"
    )
    tables = {m.__tablename__: m.__table__ for m in vars(om).values() if hasattr(m, "__tablename__")}
    for name, columns in PINNED_COLUMNS.items():
        assert {c.name: str(c.type) for c in tables[name].columns} == columns, name
    for module, path in PINNED_HELPERS:
        obj = importlib.import_module(module)
        for part in path.split("."):
            obj = getattr(obj, part, None)
        assert callable(obj), f"{module}.{path} is gone"
