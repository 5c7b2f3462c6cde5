"""Reads: the query API the CLI, the search, export and report use (sessions from :class:`db.store.Store`)."""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass

from sqlalchemy import func
from sqlalchemy import select
from sqlalchemy.orm import Session
from sqlalchemy.orm import selectinload

from .errors import DatabaseError
from .models import COLUMNS_ADAPTER
from .models import PARAM_COLUMNS
from .models import CalibrationModel
from .models import EnvironmentModel
from .models import FeasibilityModel
from .models import KernelModel
from .models import SampleModel
from .models import SpaceModel
from .models import StatisticModel
from .models import StudyModel
from .models import TrialModel
from .models import WorkloadModel
from .models import get_or_create
from .models import utcnow
from .verdicts import Phase
from .verdicts import Verdict

ENV_FIELDS = ("backend", "gpu_name", "compute_capability", "sm_count", "driver", "cuda", "torch", "triton", "host")


def ensure_environment(session: Session, info: dict) -> EnvironmentModel:
    fields = {k: info[k] for k in ENV_FIELDS}
    fp = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:32]
    row = get_or_create(session, EnvironmentModel, fingerprint=fp, **fields)
    if row.copy_gbps is None and info.get("copy_gbps"):
        row.copy_gbps = info["copy_gbps"]
    return row


def ensure_kernel(session: Session, source_hash: str, adapter: str = COLUMNS_ADAPTER) -> KernelModel:
    """The kernel row of a source hash, made with its ``adapter`` (the name a space gives it) if new."""
    row = session.scalar(select(KernelModel).filter_by(source_hash=source_hash))
    if row is None:
        row = get_or_create(session, KernelModel, source_hash=source_hash, adapter=adapter)
    if row is None or row.adapter != adapter:
        held = "another process's row" if row is None else f"the adapter {row.adapter!r}"
        raise DatabaseError(
            f"the kernel hash {source_hash!r} is recorded for {held}, not for {adapter!r}; give the adapter its own "
            "source_hash()"
        )
    return row


def ensure_workload(session: Session, adapter: str = COLUMNS_ADAPTER, **fields) -> WorkloadModel:
    """The built-in kernel's ``name, kv_format, heads, tp, topk, page_size, context, d_qk, d_v, call``; another
    adapter's ``name`` and its other fields, kept as JSON (``fields``) with the shape columns empty."""
    if adapter == COLUMNS_ADAPTER:
        return get_or_create(session, WorkloadModel, **fields)
    rest = json.dumps({k: v for k, v in fields.items() if k != "name"}, sort_keys=True)
    empty = dict(kv_format="", heads=0, tp=0, topk=0, page_size=0, context=0, d_qk=0, d_v=0, call=None)
    return get_or_create(session, WorkloadModel, adapter=adapter, name=str(fields["name"]), fields=rest, **empty)


def ensure_space(
    session: Session, name: str, text_hash: str, text: str, path: str, adapter: str = COLUMNS_ADAPTER
) -> SpaceModel:
    row = session.scalar(select(SpaceModel).filter_by(name=name, text_hash=text_hash))
    return row or get_or_create(
        session, SpaceModel, name=name, text_hash=text_hash, text=text, path=path, adapter=adapter
    )


def done_configs(session: Session, study_id: int) -> dict[str, TrialModel]:
    """Every recorded trial of a study by config key, statistics loaded."""
    rows = session.scalars(
        select(TrialModel).where(TrialModel.study_id == study_id).options(selectinload(TrialModel.statistics))
    )
    return {t.config_key: t for t in rows}


def done_launches(session: Session, study_id: int) -> list[tuple[str, int, int | None]]:
    """``(config key, trial id, duplicate_of)`` of every recorded trial of a study (three columns, no ORM objects)."""
    q = select(TrialModel.config_key, TrialModel.id, TrialModel.duplicate_of).where(TrialModel.study_id == study_id)
    return [tuple(r) for r in session.execute(q.order_by(TrialModel.id))]


def done_keys(session: Session, study_id: int) -> set[str]:
    """The config keys a study has recorded (cheap: one column)."""
    return set(session.scalars(select(TrialModel.config_key).where(TrialModel.study_id == study_id)))


def is_recorded(session: Session, study_id: int, config_key: str) -> bool:
    """Whether a study has recorded this config (one indexed row)."""
    q = select(TrialModel.id).where(TrialModel.study_id == study_id, TrialModel.config_key == config_key).limit(1)
    return session.scalar(q) is not None


def done_since(session: Session, study_id: int, trial_id: int = 0, stat_id: int = 0) -> list[tuple]:
    """The trials of a study recorded after trial ``trial_id`` or given a statistic after ``stat_id`` (a study's
    state read incrementally: only what changed since the last look), in id order, as ``(trial id, config key,
    verdict, ratio or None, the newest of its statistics' ids or 0)``: the ratio is :meth:`TrialModel.statistic`'s
    (the finalist's when there is one). Columns, not ORM trials: the search reads this once or twice per launch,
    with one statement built once (building it took longer than running it)."""
    rows = session.execute(_done_since(), {"study_id": study_id, "trial_id": trial_id, "stat_id": stat_id})
    return [(i, key, verdict, ratio, newest or 0) for i, key, verdict, ratio, newest in rows]


@functools.cache
def _done_since():
    from sqlalchemy import bindparam
    from sqlalchemy.orm import aliased

    fin, scr = aliased(StatisticModel), aliased(StatisticModel)
    newest = select(func.max(StatisticModel.id)).where(StatisticModel.trial_id == TrialModel.id).scalar_subquery()
    newer_stat = select(StatisticModel.trial_id).where(StatisticModel.id > bindparam("stat_id"))
    return (
        select(TrialModel.id, TrialModel.config_key, TrialModel.verdict, func.coalesce(fin.ratio, scr.ratio), newest)
        .outerjoin(fin, (fin.trial_id == TrialModel.id) & (fin.phase == Phase.FINALIST.value))
        .outerjoin(scr, (scr.trial_id == TrialModel.id) & (scr.phase == Phase.SCREEN.value))
        .where(TrialModel.study_id == bindparam("study_id"))
        .where((TrialModel.id > bindparam("trial_id")) | TrialModel.id.in_(newer_stat))
        .order_by(TrialModel.id)
    )


def done_verdicts(session: Session, study_id: int) -> dict[str, Verdict]:
    """Every recorded config key of a study with its verdict (cheap: two columns)."""
    rows = session.execute(select(TrialModel.config_key, TrialModel.verdict).where(TrialModel.study_id == study_id))
    return {k: Verdict(v) for k, v in rows}


def _trial_query(
    concurrency=None, space=None, workload=None, device=None, backend=None, verdict=None, adapter=None, kernel_id=None
):
    q = (
        select(TrialModel)
        .join(StudyModel, TrialModel.study_id == StudyModel.id)
        .join(SpaceModel, StudyModel.space_id == SpaceModel.id)
        .join(WorkloadModel, TrialModel.workload_id == WorkloadModel.id)
        .join(EnvironmentModel, TrialModel.environment_id == EnvironmentModel.id)
        .options(
            selectinload(TrialModel.statistics),
            selectinload(TrialModel.study).selectinload(StudyModel.space),
            selectinload(TrialModel.study).selectinload(StudyModel.kernel),
        )
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
    if adapter:
        q = q.where(WorkloadModel.adapter == adapter)
    if kernel_id is not None:
        q = q.where(TrialModel.kernel_id == kernel_id)
    return q


def trials(session: Session, **filters) -> list[TrialModel]:
    return list(session.scalars(_trial_query(**filters).order_by(TrialModel.id)))


@dataclass(frozen=True)
class HistoryRow:
    """One trial as a search's history reads it (:func:`history`)."""

    study_id: int
    concurrency: int
    kernel_id: int
    gpu_name: str
    verdict: str
    ratio: float | None  # the finalist statistic's when there is one, else the screening one's
    params: dict  # the config's parameters (the built-in kernel's columns, or another adapter's JSON)
    trial_id: int = 0
    stat_id: int = 0  # the newest of its statistics' ids (0: none)


def history(
    session: Session, space: str, workload: str, backend: str, trial_id: int = 0, stat_id: int = 0
) -> list[HistoryRow]:
    """Every trial of ``space``'s ``workload`` on ``backend``, oldest first, read lean: columns, not ORM objects (a
    level's opening read every kernel's trials with their statistics through the ORM, 1-2 s on a database of
    many kernels' grids); its ratio is :meth:`TrialModel.statistic`'s. With ``trial_id`` or ``stat_id``, only
    the trials recorded after trial ``trial_id`` or given a statistic after ``stat_id`` (what changed since a read
    that saw up to those ids, as :func:`done_since`)."""
    from sqlalchemy.orm import aliased

    fin, scr = aliased(StatisticModel), aliased(StatisticModel)
    names = list(PARAM_COLUMNS)
    q = (
        select(
            TrialModel.study_id,
            TrialModel.concurrency,
            TrialModel.kernel_id,
            EnvironmentModel.gpu_name,
            TrialModel.verdict,
            func.coalesce(fin.ratio, scr.ratio),
            TrialModel.id,
            fin.id,
            scr.id,
            TrialModel.params,
            *(getattr(TrialModel, n) for n in names),
        )
        .join(StudyModel, TrialModel.study_id == StudyModel.id)
        .join(SpaceModel, StudyModel.space_id == SpaceModel.id)
        .join(WorkloadModel, TrialModel.workload_id == WorkloadModel.id)
        .join(EnvironmentModel, TrialModel.environment_id == EnvironmentModel.id)
        .outerjoin(fin, (fin.trial_id == TrialModel.id) & (fin.phase == Phase.FINALIST.value))
        .outerjoin(scr, (scr.trial_id == TrialModel.id) & (scr.phase == Phase.SCREEN.value))
        .where(SpaceModel.name == space, WorkloadModel.name == workload, TrialModel.backend == backend)
        .order_by(TrialModel.id)
    )
    if trial_id or stat_id:
        newer_stat = select(StatisticModel.trial_id).where(StatisticModel.id > stat_id)
        q = q.where((TrialModel.id > trial_id) | TrialModel.id.in_(newer_stat))
    return [
        HistoryRow(
            *r[:6],
            dict(zip(names, r[10:], strict=True)) if r[9] is None else json.loads(r[9]),
            r[6],
            max(r[7] or 0, r[8] or 0),
        )
        for r in session.execute(q)
    ]


def other_adapters(session: Session, adapter: str = COLUMNS_ADAPTER) -> list[str]:
    """The adapters other than ``adapter`` (the built-in kernel's by default) with trials here, sorted."""
    q = (
        select(WorkloadModel.adapter)
        .join(TrialModel, TrialModel.workload_id == WorkloadModel.id)
        .where(WorkloadModel.adapter != adapter)
        .distinct()
    )
    return sorted(session.scalars(q))


def ok_levels(session: Session, **filters) -> list[int]:
    """The concurrency levels that hold ``ok`` trials under ``filters`` (as :func:`trials` takes them), sorted."""
    q = _trial_query(verdict=Verdict.OK, **filters).with_only_columns(TrialModel.concurrency).distinct()
    return sorted(session.scalars(q))


def rank_key(t: TrialModel) -> tuple:
    """The one ranking of ``ok`` trials, by the estimator that also judges them: a finalist statistic
    (more rounds) beats a screening one, then the lower ratio to the baseline (geometric mean of the
    paired rounds). Trials without a statistic rank last."""
    st = t.statistic()
    if t.verdict != Verdict.OK or st is None:
        return (2, float("inf"))
    return (0 if st.phase == Phase.FINALIST else 1, st.ratio)


def level_key(t: TrialModel) -> tuple:
    """The level a trial was measured at: (space, workload, device, backend, concurrency). Each kernel's study
    of a level is its own; the newest kernel's is the level's current one (:func:`newest_kernel`)."""
    return (t.study.space.name, t.workload.name, t.environment.gpu_name, t.backend, t.concurrency)


def newest_per_level(trials_: list[TrialModel]) -> list[TrialModel]:
    """The trials of each level's newest kernel, in the order given (what ``best`` ranks, ``trials`` lists)."""
    newest: dict[tuple, int] = {}
    for t in trials_:
        newest[level_key(t)] = max(newest.get(level_key(t), t.kernel_id), t.kernel_id)
    return [t for t in trials_ if t.kernel_id == newest[level_key(t)]]


def kernel_named(session: Session, prefix: str) -> KernelModel:
    """The one kernel whose source hash starts with ``prefix`` (``--kernel``), or a DatabaseError that lists them."""
    matching = select(KernelModel).where(KernelModel.source_hash.startswith(prefix, autoescape=True))
    found = list(session.scalars(matching))
    if len(found) == 1:
        return found[0]
    known = [k.source_hash[:12] for k in session.scalars(select(KernelModel).order_by(KernelModel.id))]
    what = "no kernel" if not found else f"{len(found)} kernels"
    raise DatabaseError(
        f"--kernel: {what} in the database has a source hash starting with {prefix[:64]!r}; its kernels, oldest "
        f"first: {', '.join(known) or 'none'} (or `newest`, each level's newest)"
    )


def newest_kernel(trials_: list[TrialModel]) -> list[TrialModel]:
    """The trials of the newest kernel among ``trials_`` (kernel rows are created in the order kernels appear;
    a kernel change makes older numbers history, not candidates)."""
    newest = max((t.kernel_id for t in trials_), default=None)
    return [t for t in trials_ if t.kernel_id == newest]


def prior_picks(session: Session, kernel_id: int, concurrency: int, n: int | None = 5, **filters) -> list[str]:
    """The best ``n`` config keys (all with ``n=None``; best first, by :func:`rank_key`) of the newest *other*
    kernel measured at this concurrency under ``filters`` (space, workload, device, backend). A search of
    a changed kernel measures them first: good configs usually stay good, so the best is found early."""
    ts = [
        t for t in trials(session, concurrency=concurrency, verdict=Verdict.OK, **filters) if t.kernel_id != kernel_id
    ]
    keys: list[str] = []
    for t in sorted(newest_kernel(ts), key=rank_key):
        if t.config_key not in keys:
            keys.append(t.config_key)
    return keys[:n]


def ties(trials_: list[TrialModel]) -> list[TrialModel]:
    """The best ``ok`` trial and every other whose ratio lies within the band of it (same phase), best first."""
    b = best_of(trials_)
    if b is None:
        return []
    st = b.statistic()
    limit = st.ratio * (1.0 + (st.noise_band or 0.0))
    tied = [t for t in trials_ if rank_key(t)[0] == rank_key(b)[0] and t.statistic().ratio <= limit]
    return sorted(tied, key=rank_key)


def pick(trials_: list[TrialModel]) -> TrialModel | None:
    """What export deploys: among the configs tied with the best, the baseline when it is one of them
    (a change must beat the noise to be deployed), else the best."""
    tied = ties(trials_)
    if not tied:
        return None
    return next((t for t in tied if t.is_baseline), tied[0])


def best_of(trials_: list[TrialModel]) -> TrialModel | None:
    """The best ``ok`` trial of a list by :func:`rank_key`, or None."""
    ok = [t for t in trials_ if t.verdict == Verdict.OK and t.statistic() is not None]
    return min(ok, key=rank_key) if ok else None


def best(session: Session, concurrency: int, **filters) -> list[TrialModel]:
    """The best ``ok`` trial per (space, workload, device, backend) at this concurrency, among the trials of
    the newest kernel measured there (a kernel change makes older numbers history, not candidates), or of the
    kernel ``kernel_id`` names.

    Trials that failed the correctness gate are ``wrong`` and never appear here.
    """
    groups: dict[tuple, list[TrialModel]] = {}
    for t in trials(session, concurrency=concurrency, verdict=Verdict.OK, **filters):
        key = (t.study.space.name, t.workload.name, t.environment.gpu_name, t.backend)
        groups.setdefault(key, []).append(t)
    out = []
    for ts in groups.values():
        b = best_of(newest_kernel(ts))
        if b is not None:
            out.append(b)
    return out


def tied(session: Session, t: TrialModel) -> list[TrialModel]:
    """The trials of ``t``'s study tied with the study's best (within its band), best first."""
    return ties(list(done_configs(session, t.study_id).values()))


def feasibility_get(session: Session, keys: list[str]) -> dict[str, dict]:
    """Cached compile-only numbers by key (``tuner.feasibility.cache_key``)."""
    out = {}
    for i in range(0, len(keys), 500):
        rows = session.scalars(select(FeasibilityModel).where(FeasibilityModel.key.in_(keys[i : i + 500])))
        out.update({r.key: json.loads(r.value) for r in rows})
    return out


def feasibility_put(session: Session, items: dict[str, dict]) -> None:
    """Cache verdicts. Processes that start on one database at once compile the same keys and write them
    together; a key's value is the same whoever computed it, so the first write stands and the others are
    skipped (a read-then-insert ``merge`` let two inserts of one key collide on a unique-key error)."""
    if not items:
        return
    now = utcnow()
    rows = [{"key": k, "value": json.dumps(v), "created_at": now} for k, v in items.items()]
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    elif dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    else:
        for row in rows:
            session.merge(FeasibilityModel(**row))
        return
    session.execute(insert(FeasibilityModel).values(rows).on_conflict_do_nothing(index_elements=["key"]))


def latest_calibration(
    session: Session, environment_id: int, workload_id: int, concurrency: int, backend: str, kernel_id: int | None
) -> CalibrationModel | None:
    """The newest calibration of this kernel in this environment, workload and concurrency. A calibration
    belongs to the kernel that measured it: another kernel's binaries have another speed and spread, so its
    samples are never a study's A/A (``kernel_id=None`` asks for any kernel's, for display only)."""
    q = select(CalibrationModel).filter_by(
        environment_id=environment_id, workload_id=workload_id, concurrency=concurrency, backend=backend
    )
    if kernel_id is not None:
        q = q.filter_by(kernel_id=kernel_id)
    return session.scalar(q.order_by(CalibrationModel.id.desc()).limit(1))


def measured_launch(session: Session, study_id: int, launch_key: str) -> int | None:
    """The trial of the study that measured this launch (not itself a duplicate), if any."""
    return session.scalar(
        select(TrialModel.id)
        .where(TrialModel.study_id == study_id, TrialModel.launch_key == launch_key)
        .where(TrialModel.verdict != Verdict.DUPLICATE)
        .order_by(TrialModel.id)
        .limit(1)
    )


@dataclass(frozen=True)
class KernelHoldings:
    """What the database holds of one kernel: its studies, trials and raw samples, and whether it is the newest
    kernel at some level (what ``best``, ``export``, ``report`` and a replay without ``--replay-kernel`` read)."""

    kernel_id: int
    source_hash: str
    studies: int
    trials: int
    samples: int
    newest: bool


def kernel_holdings(session: Session) -> list[KernelHoldings]:
    """Every kernel in the order kernels appeared. The newest at a level is, per (space, workload, environment,
    backend, concurrency), the highest kernel id and the kernel of the latest trial (the order a replay reads)."""
    newest: set[int] = set()
    groups = (SpaceModel.name, StudyModel.workload_id, StudyModel.environment_id, StudyModel.backend)
    by_level = (
        select(func.max(StudyModel.kernel_id), func.max(TrialModel.id))
        .join(SpaceModel, StudyModel.space_id == SpaceModel.id)
        .outerjoin(TrialModel, TrialModel.study_id == StudyModel.id)
        .group_by(*groups, StudyModel.concurrency)
    )
    for kernel_id, last_trial in session.execute(by_level):
        newest.add(kernel_id)
        if last_trial is not None:
            newest.add(session.get(TrialModel, last_trial).kernel_id)
    count = func.count
    studies = dict(session.execute(select(StudyModel.kernel_id, count()).group_by(StudyModel.kernel_id)).all())
    trials_ = dict(session.execute(select(TrialModel.kernel_id, count()).group_by(TrialModel.kernel_id)).all())
    samples = dict(
        session.execute(
            select(TrialModel.kernel_id, count())
            .select_from(SampleModel)
            .join(TrialModel, SampleModel.trial_id == TrialModel.id)
            .group_by(TrialModel.kernel_id)
        ).all()
    )
    return [
        KernelHoldings(
            k.id, k.source_hash, studies.get(k.id, 0), trials_.get(k.id, 0), samples.get(k.id, 0), k.id in newest
        )
        for k in session.scalars(select(KernelModel).order_by(KernelModel.id))
    ]


def unused_sample_trials(session: Session, kept_kernel_ids: set[int]) -> list[int]:
    """The trials with samples that belong to no kept kernel and stand as evidence for no kept trial (a
    duplicate of a kept kernel takes its original's samples, whichever kernel measured it)."""
    evidence = select(TrialModel.duplicate_of).where(
        TrialModel.kernel_id.in_(kept_kernel_ids), TrialModel.duplicate_of.is_not(None)
    )
    with_samples = select(SampleModel.trial_id).distinct()
    q = (
        select(TrialModel.id)
        .where(TrialModel.id.in_(with_samples), TrialModel.kernel_id.not_in(kept_kernel_ids))
        .where(TrialModel.id.not_in(evidence))
        .order_by(TrialModel.id)
    )
    return list(session.scalars(q))


def study_names(session: Session, kernel_ids: set[int]) -> dict[int, list[str]]:
    """The (Optuna) study names of these kernels' studies, by kernel id."""
    q = select(StudyModel.kernel_id, StudyModel.name).where(StudyModel.kernel_id.in_(kernel_ids))
    out: dict[int, list[str]] = {}
    for kernel_id, name in session.execute(q.order_by(StudyModel.id)):
        out.setdefault(kernel_id, []).append(name)
    return out
