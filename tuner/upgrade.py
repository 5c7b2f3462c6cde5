"""``tuner db upgrade``'s last step: every Optuna study of the tuner carries its metric name and the
attributes a search writes, so Optuna's own tools (optuna-dashboard) show every study alike. Searches before
the tuner described its studies wrote neither; their attributes come from the tuner's own rows (space,
workload, concurrency, device, backend, kernel, noise band, baseline), and ``labelled`` says they were added
later. A study already described is left as it is; running it twice changes nothing.
"""

from __future__ import annotations

import warnings

import yaml
from sqlalchemy import select

from ..db.models import StudyModel
from ..db.models import TrialModel
from ..db.store import Store

METRIC = "median_us"
OBJECTIVE = "median_us: this study's baseline median x the candidate's paired ratio (lower is better)"


def _attrs(s, st: StudyModel) -> dict:
    try:
        target = (yaml.safe_load(st.space.text) or {}).get("target")
    except yaml.YAMLError:
        target = None
    baseline = s.scalars(
        select(TrialModel.config_key).where(TrialModel.study_id == st.id, TrialModel.is_baseline).limit(1)
    ).first()
    attrs = {
        "objective": OBJECTIVE,
        "space": st.space.name,
        "workload": st.workload.name,
        "concurrency": st.concurrency,
        "device": st.environment.gpu_name,
        "backend": st.backend,
        "target_arch": target,
        "baseline": baseline,
        "kernel_hash": st.kernel.source_hash[:12],
        "noise_band": st.noise_band,
        "labelled": "by `tuner db upgrade`: the search that recorded this study predates study labels",
    }
    return {k: v for k, v in attrs.items() if v is not None}


def label_studies(store: Store) -> int:
    """Give every Optuna study of a tuner study that has no metric name its metric name and attributes;
    returns how many were labelled."""
    import optuna

    from ..db.store import check_optuna_schema

    check_optuna_schema(store.engine, store.shown_url)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(store.url)
    done = 0
    try:
        with store.session() as s:
            ours = {st.name: st for st in s.scalars(select(StudyModel))}
            for frozen in storage.get_all_studies():
                st = ours.get(frozen.study_name)
                if st is None:
                    continue  # not a tuner study: not ours to label
                study = optuna.load_study(study_name=frozen.study_name, storage=storage)
                if study.metric_names is not None:
                    continue
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                    study.set_metric_names([METRIC])
                have = study.user_attrs
                for k, v in _attrs(s, st).items():
                    if k not in have:
                        study.set_user_attr(k, v)
                done += 1
    finally:
        storage.remove_session()
        storage.engine.dispose()
    return done


def unlabelled_studies(store: Store) -> int:
    """How many Optuna studies :func:`label_studies` would label, read without writing anything (a read-only
    database at the current schema upgrades as a no-op when this is 0)."""
    from optuna.storages._rdb import models as om
    from sqlalchemy import inspect

    with store.session() as s:
        if not inspect(s.connection()).has_table(om.StudyModel.__tablename__):
            return 0
        ours = set(s.scalars(select(StudyModel.name)))
        attrs = om.StudySystemAttributeModel
        named = select(attrs.study_id).where(attrs.key == "study:metric_names")
        names = s.scalars(select(om.StudyModel.study_name).where(om.StudyModel.study_id.not_in(named)))
        return sum(n in ours for n in names)
