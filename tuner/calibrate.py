"""The A/A calibration: how much independent captures of one config differ on this GPU (or CPU).

``tuner calibrate`` runs it on purpose with many pairs; a study that finds no calibration for its
environment, workload and concurrency runs a short one first. Either way the numbers are stored
(``tuner_calibrations``) and the study's band is ``max(spread, min_effect)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..db import queries
from ..db import record
from ..db.verdicts import Verdict
from . import stats
from .errors import TunerError
from .protocol import WARNING_AS_ERROR
from .protocol import CalibrateRequest

KernelConfig = object  # annotations: the adapter's config type


def study_pairs(rounds: int) -> int:
    """Pairs of a study's own A/A when no calibration exists: a few more than the rounds a trial gets
    (12 for the shipped spaces' 10 rounds); `tuner calibrate` takes 30 by default."""
    return max(rounds + 2, 6)


@dataclass(frozen=True)
class Calibration:
    pairs: int
    rounds: int
    spread: float
    min_effect: float
    band: float
    mde: float  # at the screening rounds
    mde_finalist: float
    false_rate: float
    multimodal: bool
    samples: list[tuple[float, float]]

    @classmethod
    def of(cls, samples, rounds: int, finalist_rounds: int, min_effect: float) -> Calibration:
        sp = stats.spread(samples)
        band = stats.band(sp, min_effect)
        return cls(
            pairs=len(samples),
            rounds=rounds,
            spread=sp,
            min_effect=min_effect,
            band=band,
            mde=stats.mde(sp, rounds, band),
            mde_finalist=stats.mde(sp, finalist_rounds, band),
            false_rate=stats.false_rate(samples, rounds, band),
            multimodal=stats.multimodal([a for a, _ in samples]),
            samples=[tuple(s) for s in samples],
        )


def where_measured(proc) -> str:
    """A measurement process as a message names it: ``host GPU 0`` on CUDA, ``host (interpreter worker 0)``
    elsewhere (no GPU is involved)."""
    host, index = proc.info.get("host"), proc.gpu_index
    backend = getattr(proc, "backend", "replay")
    return f"{host} GPU {index}" if backend == "cuda" else f"{host} ({backend} worker {index})"


def measure(proc, space, workload, concurrency: int, config: KernelConfig, pairs: int, seed: int = 0) -> Calibration:
    """Run an A/A of ``config`` on ``proc``; the baseline gets a longer timeout and one retry."""
    req = CalibrateRequest(workload, concurrency, config, pairs, seed, space.adapter.spec)
    timeout = max(3 * space.measurement["trial_timeout_s"], 120)
    reply = proc.measure(req, timeout_s=timeout)
    if reply.verdict in (Verdict.CRASHED, Verdict.TIMEOUT):
        reply = proc.measure(req, timeout_s=2 * timeout)
    if reply.verdict != Verdict.OK and reply.reason.startswith(WARNING_AS_ERROR):
        raise TunerError(
            f"the baseline {config} could not be measured on {where_measured(proc)}: {reply.reason}; this is the "
            "warnings filter, not the kernel: run without PYTHONWARNINGS=error / -W error for this warning"
        )
    if reply.verdict != Verdict.OK:
        where = where_measured(proc)
        raise TunerError(
            f"the baseline {config} is {reply.verdict} on {where}: {reply.reason}; candidates cannot be "
            "compared with it - pick another `baseline` in the search space"
        )
    m = space.measurement
    min_effect = m.get("min_effect", stats.DEFAULT_MIN_EFFECT)
    return Calibration.of(reply.samples, m["rounds"], m["finalist_rounds"], min_effect)


def store_calibration(
    session,
    cal: Calibration,
    info: dict,
    spec,
    concurrency: int,
    backend: str,
    config,
    kernel_hash: str | None = None,
    adapter=None,
) -> int:
    """Records ``cal`` under ``kernel_hash`` (default: ``adapter``'s source hash, the built-in kernel's when
    ``adapter`` is None)."""
    if adapter is None:
        from .adapter import default_adapter

        adapter = default_adapter()
    env = queries.ensure_environment(session, info)
    wrow = queries.ensure_workload(session, adapter.spec, **spec.fields())
    kernel = queries.ensure_kernel(session, kernel_hash or adapter.source_hash(), adapter.spec)
    row = record.add_calibration(
        session,
        cal.samples,
        environment_id=env.id,
        workload_id=wrow.id,
        kernel_id=kernel.id,
        concurrency=concurrency,
        backend=backend,
        config_key=str(config),
        pairs=cal.pairs,
        rounds=cal.rounds,
        spread=cal.spread,
        min_effect=cal.min_effect,
        band=cal.band,
        mde=cal.mde,
        false_rate=cal.false_rate,
        multimodal=cal.multimodal,
    )
    return row.id


def run(space, store, backend: str, workloads, levels: list[int], pairs: int, processes) -> list[dict]:
    """``tuner calibrate``: an A/A of the space's baseline at each (workload, concurrency); stored and returned."""
    proc = processes[0]
    rows = []
    for spec in workloads:
        for conc in levels:
            cal = measure(proc, space, spec.workload(), conc, space.baseline, pairs)
            with store.session() as s:
                store_calibration(s, cal, proc.info, spec, conc, backend, space.baseline, adapter=space.adapter)
            rows.append(
                {
                    "workload": spec.name,
                    "C": conc,
                    "device": proc.info["gpu_name"],
                    "backend": backend,
                    "pairs": cal.pairs,
                    "spread": round(cal.spread, 5),
                    "min_effect": cal.min_effect,
                    "band": round(cal.band, 5),
                    f"mde ({cal.rounds} rounds)": round(cal.mde, 5),
                    "mde (finalist rounds)": round(cal.mde_finalist, 5),
                    "false non-flat rate": round(cal.false_rate, 4),
                    "baseline multimodal": cal.multimodal,
                }
            )
    return rows
