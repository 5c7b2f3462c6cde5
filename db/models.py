"""SQLAlchemy models of the results database.

Every table is prefixed ``tuner_`` because Optuna's own tables (``studies``, ``trials``, ...) live
in the same database. One class per table, uniqueness in ``__table_args__`` (Optuna's
``_rdb/models.py`` style); reads are in :mod:`db.queries` and writes in :mod:`db.record`, as
functions that take a session. The config columns are the kernel's declared parameters (``kernels.config.PARAMS``),
named here with their defaults, as the migrations made them (tests/test_architecture.py checks that they agree), so
that reading the database imports no kernel module: what they mean, a row read back as the kernel's config and
workload, is the kernel's adapter's (``tuner/adapters/sparse_mla/records.py``).

Those columns (and the workload's shape columns) are the built-in kernel's, :data:`COLUMNS_ADAPTER`. A kernel of
another adapter records its trial's parameters in ``tuner_trials.params`` and its workload's description in
``tuner_workloads.fields``, as JSON, and names its adapter in ``adapter`` (kernels, spaces and workloads).
"""

from __future__ import annotations

import datetime as dt
import json

from sqlalchemy import Boolean
from sqlalchemy import DateTime
from sqlalchemy import Float
from sqlalchemy import ForeignKey
from sqlalchemy import Index
from sqlalchemy import Integer
from sqlalchemy import MetaData
from sqlalchemy import String
from sqlalchemy import Text
from sqlalchemy import UniqueConstraint
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.orm import Mapped
from sqlalchemy.orm import Session
from sqlalchemy.orm import mapped_column
from sqlalchemy.orm import relationship

from .verdicts import Phase

# the adapter whose parameters and workload shape are this schema's columns (tuner/adapter.py: DEFAULT)
COLUMNS_ADAPTER = "sparse_mla"
# its parameters' columns and their server defaults: kernels.config.PARAMS, in its order (a new parameter is a
# migration and a line here)
CONFIG_COLUMNS: dict[str, int] = {
    "BLOCK_T": 16,
    "num_warps": 4,
    "num_stages": 2,
    "TARGET_CTAS": 256,
    "maxnreg": 0,
    "PREFETCH": 0,
    "BALANCED": 0,
    "MERGE": 0,
}
PARAM_COLUMNS = tuple(CONFIG_COLUMNS)

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


def get_or_create(session: Session, model, **fields):
    """The row with exactly these fields, inserted if missing. Safe against a concurrent writer: the
    insert runs in a savepoint, and losing the race on a unique constraint means reading the winner."""
    row = session.scalar(select(model).filter_by(**fields))
    if row is not None:
        return row
    try:
        with session.begin_nested():
            row = model(**fields)
            session.add(row)
    except IntegrityError:
        row = session.scalar(select(model).filter_by(**fields))
    return row


class EnvironmentModel(Base):
    """Where a number was measured: GPU (or CPU for the interpreter), software versions, host."""

    __tablename__ = "tuner_environments"
    __table_args__ = (UniqueConstraint("fingerprint"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64))
    backend: Mapped[str] = mapped_column(String(16))  # cuda | interpreter
    gpu_name: Mapped[str] = mapped_column(String(128))
    compute_capability: Mapped[str] = mapped_column(String(16))
    sm_count: Mapped[int] = mapped_column(Integer)
    driver: Mapped[str] = mapped_column(String(64))
    cuda: Mapped[str] = mapped_column(String(32))
    torch: Mapped[str] = mapped_column(String(64))
    triton: Mapped[str] = mapped_column(String(32))
    host: Mapped[str] = mapped_column(String(128))
    copy_gbps: Mapped[float | None] = mapped_column(Float, nullable=True)  # measured roofline, if any


class KernelModel(Base):
    __tablename__ = "tuner_kernels"
    __table_args__ = (UniqueConstraint("source_hash"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    source_hash: Mapped[str] = mapped_column(String(64))
    adapter: Mapped[str] = mapped_column(String(200), default=COLUMNS_ADAPTER, server_default=COLUMNS_ADAPTER)


class WorkloadModel(Base):
    """One attention shape on one GPU (``heads`` = local heads after TP); another adapter's workload is its
    ``name`` and ``fields`` (the JSON of its ``fields()``), the shape columns left empty."""

    __tablename__ = "tuner_workloads"
    __table_args__ = (
        UniqueConstraint("name", "kv_format", "heads", "tp", "topk", "page_size", "context", "adapter", "fields"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    kv_format: Mapped[str] = mapped_column(String(32))
    heads: Mapped[int] = mapped_column(Integer)
    tp: Mapped[int] = mapped_column(Integer)
    topk: Mapped[int] = mapped_column(Integer)
    page_size: Mapped[int] = mapped_column(Integer)
    context: Mapped[int] = mapped_column(Integer)
    d_qk: Mapped[int] = mapped_column(Integer)
    d_v: Mapped[int] = mapped_column(Integer)
    call: Mapped[str | None] = mapped_column(Text, nullable=True)  # JSON: extra cache, sink, q_tokens (whole call)
    adapter: Mapped[str] = mapped_column(String(200), default=COLUMNS_ADAPTER, server_default=COLUMNS_ADAPTER)
    fields: Mapped[str] = mapped_column(Text, default="", server_default="")  # another adapter's: JSON

    def description(self) -> dict:
        """What the workload's ``fields()`` gave when it was recorded: the columns, or another adapter's JSON."""
        if self.adapter != COLUMNS_ADAPTER:
            return {"name": self.name, **json.loads(self.fields or "{}")}
        return {c.name: getattr(self, c.name) for c in self.__table__.columns if c.name not in ("adapter", "fields")}


class SpaceModel(Base):
    __tablename__ = "tuner_spaces"
    __table_args__ = (UniqueConstraint("name", "text_hash"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    text_hash: Mapped[str] = mapped_column(String(64))
    text: Mapped[str] = mapped_column(Text)
    path: Mapped[str] = mapped_column(Text)
    adapter: Mapped[str] = mapped_column(String(200), default=COLUMNS_ADAPTER, server_default=COLUMNS_ADAPTER)


class StudyModel(Base):
    """One Optuna study: (space, workload, concurrency, device, backend); holds the A/A noise band."""

    __tablename__ = "tuner_studies"
    __table_args__ = (UniqueConstraint("name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(256))  # the Optuna study name
    space_id: Mapped[int] = mapped_column(ForeignKey("tuner_spaces.id"))
    workload_id: Mapped[int] = mapped_column(ForeignKey("tuner_workloads.id"))
    environment_id: Mapped[int] = mapped_column(ForeignKey("tuner_environments.id"))
    kernel_id: Mapped[int] = mapped_column(ForeignKey("tuner_kernels.id"))
    concurrency: Mapped[int] = mapped_column(Integer)
    backend: Mapped[str] = mapped_column(String(16))
    noise_band: Mapped[float | None] = mapped_column(Float, nullable=True)  # relative, e.g. 0.012
    noise_n: Mapped[int | None] = mapped_column(Integer, nullable=True)
    min_effect: Mapped[float | None] = mapped_column(Float, nullable=True)  # the space's floor under the band
    spread: Mapped[float | None] = mapped_column(Float, nullable=True)  # capture-to-capture spread (A/A)
    baseline_multimodal: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    stopped: Mapped[str | None] = mapped_column(Text, nullable=True)  # why the level finished (None: not finished)
    stopped_n_trials: Mapped[int | None] = mapped_column(Integer, nullable=True)  # the --n-trials it finished under

    space: Mapped[SpaceModel] = relationship()
    workload: Mapped[WorkloadModel] = relationship()
    environment: Mapped[EnvironmentModel] = relationship()
    kernel: Mapped[KernelModel] = relationship()


class _ConfigColumns:
    """One integer column per declared kernel parameter (:data:`CONFIG_COLUMNS`, :data:`kernels.config.PARAMS`)."""


for _name, _default in CONFIG_COLUMNS.items():
    setattr(
        _ConfigColumns,
        _name,
        mapped_column(_name, Integer, nullable=False, default=_default, server_default=str(_default)),
    )


class TrialModel(_ConfigColumns, Base):
    """One config at one concurrency in one study: its verdict, feasibility numbers and statistics."""

    __tablename__ = "tuner_trials"
    __table_args__ = (
        Index("ix_tuner_trials_best", "workload_id", "concurrency", "environment_id", "backend", "verdict"),
        Index("ix_tuner_trials_verdict", "verdict"),
        UniqueConstraint("study_id", "config_key"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("tuner_studies.id"))
    workload_id: Mapped[int] = mapped_column(ForeignKey("tuner_workloads.id"))
    environment_id: Mapped[int] = mapped_column(ForeignKey("tuner_environments.id"))
    kernel_id: Mapped[int] = mapped_column(ForeignKey("tuner_kernels.id"))
    concurrency: Mapped[int] = mapped_column(Integer)
    backend: Mapped[str] = mapped_column(String(16))
    config_key: Mapped[str] = mapped_column(String(64))  # str(KernelConfig), e.g. T16-w4-s2-c256
    num_splits: Mapped[int] = mapped_column(Integer)
    launch_key: Mapped[str | None] = mapped_column(String(128), nullable=True)  # kernels.config.launch_identity
    duplicate_of: Mapped[int | None] = mapped_column(Integer, nullable=True)  # the trial that measured this launch
    is_baseline: Mapped[bool] = mapped_column(Boolean, default=False)
    verdict: Mapped[str] = mapped_column(String(16))  # a db.verdicts.Verdict
    reason: Mapped[str] = mapped_column(Text, default="")
    shared_bytes: Mapped[int | None] = mapped_column(Integer, nullable=True)
    limit_bytes: Mapped[int | None] = mapped_column(Integer, nullable=True)
    registers: Mapped[int | None] = mapped_column(Integer, nullable=True)
    spill_bytes: Mapped[int | None] = mapped_column(Integer, nullable=True)
    estimate_bytes: Mapped[int | None] = mapped_column(Integer, nullable=True)
    out_rel_err: Mapped[float | None] = mapped_column(Float, nullable=True)
    lse_abs_err: Mapped[float | None] = mapped_column(Float, nullable=True)
    optuna_study: Mapped[str] = mapped_column(String(256))
    optuna_trial_number: Mapped[int | None] = mapped_column(Integer, nullable=True)
    wall_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    params: Mapped[str | None] = mapped_column(Text, nullable=True)  # another adapter's parameters: JSON

    study: Mapped[StudyModel] = relationship()
    workload: Mapped[WorkloadModel] = relationship()
    environment: Mapped[EnvironmentModel] = relationship()
    samples: Mapped[list[SampleModel]] = relationship(back_populates="trial", order_by="SampleModel.id")
    statistics: Mapped[list[StatisticModel]] = relationship(back_populates="trial")
    original: Mapped[TrialModel | None] = relationship(
        primaryjoin="foreign(TrialModel.duplicate_of) == TrialModel.id", remote_side="TrialModel.id", viewonly=True
    )

    def param_values(self) -> dict:
        """The config's parameters by name: another adapter's ``params``, else the built-in kernel's columns (its
        adapter's :meth:`~tuner.adapter.KernelAdapter.recorded_config` reads them back as a config)."""
        if self.params is not None:
            return json.loads(self.params)
        return {name: getattr(self, name) for name in PARAM_COLUMNS}

    def evidence(self) -> TrialModel:
        """The trial whose measurement stands for this one: its original when it is a duplicate."""
        return self.original if self.duplicate_of is not None and self.original is not None else self

    def statistic(self, phase: str | None = None) -> StatisticModel | None:
        """The finalist statistic when there is one (more rounds), else the screening one."""
        by = {s.phase: s for s in self.statistics}
        return by.get(phase) if phase else by.get(Phase.FINALIST) or by.get(Phase.SCREEN)


def config_fields(adapter: str, params: dict) -> dict:
    """A config's parameters as a ``tuner_trials`` row holds them: the built-in kernel's in their columns,
    another adapter's as the JSON ``params``."""
    if adapter == COLUMNS_ADAPTER:
        return dict(params)
    return {"params": json.dumps(params, sort_keys=True)}


class SampleModel(Base):
    """One round of the paired A/B protocol: candidate and baseline µs per call, measured back to back."""

    __tablename__ = "tuner_samples"
    __table_args__ = (UniqueConstraint("trial_id", "phase", "round"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("tuner_trials.id"), index=True)
    phase: Mapped[str] = mapped_column(String(16))  # screen | finalist | noise
    round: Mapped[int] = mapped_column(Integer)
    candidate_us: Mapped[float] = mapped_column(Float)
    baseline_us: Mapped[float] = mapped_column(Float)
    replays: Mapped[int] = mapped_column(Integer)  # calls averaged into one number
    gpu_index: Mapped[int | None] = mapped_column(Integer, nullable=True)

    trial: Mapped[TrialModel] = relationship(back_populates="samples")


class StatisticModel(Base):
    __tablename__ = "tuner_statistics"
    __table_args__ = (UniqueConstraint("trial_id", "phase"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("tuner_trials.id"), index=True)
    phase: Mapped[str] = mapped_column(String(16))
    n: Mapped[int] = mapped_column(Integer)
    median_us: Mapped[float] = mapped_column(Float)
    ci_low_us: Mapped[float] = mapped_column(Float)
    ci_high_us: Mapped[float] = mapped_column(Float)
    baseline_median_us: Mapped[float] = mapped_column(Float)
    ratio: Mapped[float] = mapped_column(Float)  # exp(mean log(candidate / baseline)) over the rounds (stats.paired)
    ratio_ci_low: Mapped[float] = mapped_column(Float)
    ratio_ci_high: Mapped[float] = mapped_column(Float)
    noise_band: Mapped[float] = mapped_column(Float)
    classification: Mapped[str] = mapped_column(String(16))  # a db.verdicts.Effect
    p_value: Mapped[float | None] = mapped_column(Float, nullable=True)  # of the paired test, before BH

    trial: Mapped[TrialModel] = relationship(back_populates="statistics")


class NoiseModel(Base):
    """The A/A noise band of one GPU (one worker) in one study, with its raw samples."""

    __tablename__ = "tuner_noise"
    __table_args__ = (UniqueConstraint("study_id", "host", "gpu_index"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("tuner_studies.id"), index=True)
    host: Mapped[str] = mapped_column(String(128))
    gpu_index: Mapped[int] = mapped_column(Integer)
    band: Mapped[float] = mapped_column(Float)
    n: Mapped[int] = mapped_column(Integer)
    samples: Mapped[str] = mapped_column(Text)  # JSON [[a_us, a2_us], ...], one pair per round
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)


class CalibrationModel(Base):
    """One ``tuner calibrate`` (or a study's own A/A): independent captures of one config against itself."""

    __tablename__ = "tuner_calibrations"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    environment_id: Mapped[int] = mapped_column(ForeignKey("tuner_environments.id"))
    workload_id: Mapped[int] = mapped_column(ForeignKey("tuner_workloads.id"))
    kernel_id: Mapped[int] = mapped_column(ForeignKey("tuner_kernels.id"))
    concurrency: Mapped[int] = mapped_column(Integer)
    backend: Mapped[str] = mapped_column(String(16))
    config_key: Mapped[str] = mapped_column(String(64))
    pairs: Mapped[int] = mapped_column(Integer)  # independent capture pairs
    rounds: Mapped[int] = mapped_column(Integer)  # the search's rounds the false rate was computed for
    spread: Mapped[float] = mapped_column(Float)  # sd of log(A/A') over pairs
    min_effect: Mapped[float] = mapped_column(Float)
    band: Mapped[float] = mapped_column(Float)  # max(spread, min_effect)
    mde: Mapped[float] = mapped_column(Float)  # smallest effect the configured rounds detect
    false_rate: Mapped[float] = mapped_column(Float)  # non-flat calls of the policy on A/A trials
    multimodal: Mapped[bool] = mapped_column(Boolean)
    samples: Mapped[str] = mapped_column(Text)  # JSON [[[a_us, a2_us], ...] per pair]
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)

    environment: Mapped[EnvironmentModel] = relationship()
    workload: Mapped[WorkloadModel] = relationship()


class FeasibilityModel(Base):
    """Cached compile-only verdicts (tuner.feasibility), keyed by kernel hash, triton, target, config, shape."""

    __tablename__ = "tuner_feasibility"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)  # JSON {shared, registers, stack} or {error}
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)


class ExportModel(Base):
    __tablename__ = "tuner_exports"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    path: Mapped[str] = mapped_column(Text)
    device: Mapped[str] = mapped_column(String(128))
    workload_id: Mapped[int] = mapped_column(ForeignKey("tuner_workloads.id"))
    content: Mapped[str] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
