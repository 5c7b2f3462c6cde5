"""Writes: every row the search records, as functions that take a session (Optuna ``_rdb`` style).

The caller owns the transaction (``with store.session() as s``); a function that may lose a race with
another worker on a unique constraint runs its insert in a savepoint and says so in its result.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sqlalchemy import delete
from sqlalchemy import insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from .models import CalibrationModel
from .models import NoiseModel
from .models import SampleModel
from .models import StatisticModel
from .models import StudyModel
from .models import TrialModel
from .verdicts import Effect
from .verdicts import Phase


@dataclass(frozen=True)
class Summary:
    """The statistic of one measurement, as the search computed it; one ``tuner_statistics`` row.

    Build it with keywords (``Summary(n=10, median_us=..., ...)``); the fields keep this order for callers
    that still pass them by position.
    """

    n: int  # paired rounds
    median_us: float  # the candidate's median, µs per call
    ci_low_us: float  # its 95 % interval, µs
    ci_high_us: float
    baseline_median_us: float  # the baseline's median in the same rounds, µs
    ratio: float  # the candidate's time relative to the baseline's (exp of the rounds' mean log ratio)
    ratio_ci_low: float  # its 95 % interval
    ratio_ci_high: float
    noise_band: float  # the band's half-width the verdict used, as a fraction (0.01 = 1 %)
    effect: Effect  # this trial's own call against that band (win, flat, regression), before the correction
    p_value: float | None = None  # the paired test's, against the band's nearer edge, before the study's BH


def add_trial(session: Session, **fields) -> TrialModel | None:
    """Insert one trial; None when another worker already recorded this config in this study."""
    try:
        with session.begin_nested():
            t = TrialModel(**fields)
            session.add(t)
            session.flush()
    except IntegrityError:
        return None
    return t


def insert_trial(session: Session, **fields) -> int | None:
    """:func:`add_trial` as one Core insert (no ORM object to flush): the new trial's id, or None when another worker
    already recorded this config in this study."""
    try:
        with session.begin_nested():
            return session.execute(insert(TrialModel.__table__), fields).inserted_primary_key[0]  # built once
    except IntegrityError:
        return None


def add_trials(session: Session, rows: list[dict]) -> list[int | None]:
    """Insert many trials in the caller's transaction (one flush); returns each one's id, None for a config
    another worker recorded first (then each is inserted in a savepoint of its own)."""
    try:
        with session.begin_nested():
            made = [TrialModel(**fields) for fields in rows]
            session.add_all(made)
            session.flush()
        return [t.id for t in made]
    except IntegrityError:
        out = []
        for fields in rows:
            t = add_trial(session, **fields)
            out.append(None if t is None else t.id)
        return out


def add_samples(
    session: Session,
    trial_id: int,
    phase: Phase,
    samples: list[tuple[float, float]],
    replays: int,
    gpu_index: int,
    summary: Summary,
) -> StatisticModel:
    """Every raw paired sample of one measurement and its statistic (returned); the samples in one Core insert
    (executemany: no ORM object per round)."""
    if samples:
        rows = [
            {
                "trial_id": trial_id,
                "phase": phase,
                "round": r,
                "candidate_us": c,
                "baseline_us": b,
                "replays": replays,
                "gpu_index": gpu_index,
            }
            for r, (c, b) in enumerate(samples)
        ]
        session.execute(insert(SampleModel), rows)
    stat = StatisticModel(
        trial_id=trial_id,
        phase=phase,
        n=summary.n,
        median_us=summary.median_us,
        ci_low_us=summary.ci_low_us,
        ci_high_us=summary.ci_high_us,
        baseline_median_us=summary.baseline_median_us,
        ratio=summary.ratio,
        ratio_ci_low=summary.ratio_ci_low,
        ratio_ci_high=summary.ratio_ci_high,
        noise_band=summary.noise_band,
        classification=summary.effect,
        p_value=summary.p_value,
    )
    session.add(stat)
    session.flush()
    return stat


def noise_band(session: Session, study_id: int, host: str, gpu_index: int) -> tuple[float, list] | None:
    """The band this study already uses on this GPU, with its A/A samples, if any."""
    row = session.query(NoiseModel).filter_by(study_id=study_id, host=host, gpu_index=gpu_index).one_or_none()
    return None if row is None else (row.band, json.loads(row.samples))


def add_noise(
    session: Session, study_id: int, host: str, gpu_index: int, band: float, samples: list[tuple[float, float]]
) -> None:
    """Record the band one GPU uses in a study (a concurrent duplicate is ignored)."""
    try:
        with session.begin_nested():
            session.add(
                NoiseModel(
                    study_id=study_id,
                    host=host,
                    gpu_index=gpu_index,
                    band=band,
                    n=len(samples),
                    samples=json.dumps(samples),
                )
            )
    except IntegrityError:
        pass


def add_calibration(session: Session, samples: list[tuple[float, float]], **fields) -> CalibrationModel:
    """Record one A/A calibration with its raw samples."""
    row = CalibrationModel(samples=json.dumps(samples), **fields)
    session.add(row)
    session.flush()
    return row


def set_study_noise(
    session: Session, study_id: int, band: float, spread: float, min_effect: float, multimodal: bool, n: int
) -> None:
    study = session.get(StudyModel, study_id)
    study.noise_band = max(band, study.noise_band or 0.0)  # the study reports its widest GPU
    study.spread = max(spread, study.spread or 0.0)
    study.min_effect = min_effect
    study.baseline_multimodal = bool(multimodal or study.baseline_multimodal)
    study.noise_n = n


def set_study_stopped(session: Session, study_id: int, stopped: str | None, n_trials: int | None) -> None:
    """A level finished (why, and the ``--n-trials`` cap it ran under), or reopened (``stopped`` None)."""
    study = session.get(StudyModel, study_id)
    study.stopped = stopped
    study.stopped_n_trials = n_trials if stopped else None


def set_effects(session: Session, effects: dict[int, Effect]) -> None:
    """The study-wide calls (after the false-discovery correction), by statistic id."""
    for stat_id, effect in effects.items():
        session.get(StatisticModel, stat_id).classification = effect


def drop_samples(session: Session, trial_ids: list[int]) -> int:
    """Delete the raw samples of these trials (their statistics stay); returns how many rows went."""
    dropped = 0
    for i in range(0, len(trial_ids), 500):
        q = delete(SampleModel).where(SampleModel.trial_id.in_(trial_ids[i : i + 500]))
        dropped += session.execute(q).rowcount
    return dropped
