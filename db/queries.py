"""The query API the CLI and the search use (sessions come from :class:`db.store.Store`)."""

from __future__ import annotations

import hashlib
import json

from sqlalchemy import select
from sqlalchemy.orm import Session
from sqlalchemy.orm import selectinload

from db.models import EnvironmentModel
from db.models import KernelModel
from db.models import SampleModel
from db.models import SpaceModel
from db.models import StatisticModel
from db.models import StudyModel
from db.models import TrialModel
from db.models import WorkloadModel
from db.models import get_or_create

ENV_FIELDS = ("backend", "gpu_name", "compute_capability", "sm_count", "driver", "cuda", "torch", "triton", "host")


def ensure_environment(session: Session, info: dict) -> EnvironmentModel:
    fields = {k: info[k] for k in ENV_FIELDS}
    fp = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:32]
    row = get_or_create(session, EnvironmentModel, fingerprint=fp, **fields)
    if row.copy_gbps is None and info.get("copy_gbps"):
        row.copy_gbps = info["copy_gbps"]
    return row


def ensure_kernel(session: Session, source_hash: str) -> KernelModel:
    return get_or_create(session, KernelModel, source_hash=source_hash)


def ensure_workload(session: Session, spec) -> WorkloadModel:
    from kernels.kv_format import get_format

    fmt = get_format(spec.kv_format)
    return get_or_create(
        session,
        WorkloadModel,
        name=spec.name,
        kv_format=spec.kv_format,
        heads=spec.local_heads,
        tp=spec.tp,
        topk=spec.topk,
        page_size=spec.page_size,
        context=spec.context,
        d_qk=fmt.d_qk,
        d_v=fmt.d_v,
    )


def ensure_space(session: Session, space) -> SpaceModel:
    row = session.scalar(select(SpaceModel).filter_by(name=space.name, text_hash=space.text_hash))
    return row or get_or_create(
        session, SpaceModel, name=space.name, text_hash=space.text_hash, text=space.text, path=space.path
    )


def done_configs(session: Session, study_id: int) -> dict[str, TrialModel]:
    rows = session.scalars(select(TrialModel).where(TrialModel.study_id == study_id))
    return {t.config_key: t for t in rows}


def _trial_query(concurrency=None, space=None, workload=None, device=None, backend=None, verdict=None):
    q = (
        select(TrialModel)
        .join(StudyModel, TrialModel.study_id == StudyModel.id)
        .join(SpaceModel, StudyModel.space_id == SpaceModel.id)
        .join(WorkloadModel, TrialModel.workload_id == WorkloadModel.id)
        .join(EnvironmentModel, TrialModel.environment_id == EnvironmentModel.id)
        .options(selectinload(TrialModel.statistics), selectinload(TrialModel.study).selectinload(StudyModel.space))
    )
    if concurrency is not None:
        q = q.where(TrialModel.concurrency == concurrency)
    if space:
        q = q.where(SpaceModel.name == space)
    if workload:
        q = q.where(WorkloadModel.name == workload)
    if device:
        q = q.where(EnvironmentModel.gpu_name == device)
    if backend:
        q = q.where(TrialModel.backend == backend)
    if verdict and verdict != "all":
        q = q.where(TrialModel.verdict == verdict)
    return q


def trials(session: Session, **filters) -> list[TrialModel]:
    return list(session.scalars(_trial_query(**filters).order_by(TrialModel.id)))


def best(session: Session, concurrency: int, **filters) -> list[TrialModel]:
    """The fastest ``ok`` trial per (space, workload, device, backend) at this concurrency.

    Ranked by the finalist median when the trial has one (more rounds), else the screening median.
    Trials that failed the correctness gate are ``wrong`` and never appear here.
    """
    groups: dict[tuple, TrialModel] = {}
    for t in trials(session, concurrency=concurrency, verdict="ok", **filters):
        stat = t.statistic()
        if stat is None:
            continue
        key = (t.study.space.name, t.workload.name, t.environment.gpu_name, t.backend)
        cur = groups.get(key)
        if cur is None or _rank(t) < _rank(cur):
            groups[key] = t
    return list(groups.values())


def _rank(t: TrialModel) -> tuple:
    fin = t.statistic("finalist")
    return (0, fin.median_us) if fin else (1, t.statistic("screen").median_us)


def samples(session: Session, trial_id: int) -> list[SampleModel]:
    return list(session.scalars(select(SampleModel).where(SampleModel.trial_id == trial_id).order_by(SampleModel.id)))


def statistic_rows(session: Session, trial_id: int) -> list[StatisticModel]:
    return list(session.scalars(select(StatisticModel).where(StatisticModel.trial_id == trial_id)))
