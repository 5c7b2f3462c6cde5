"""Studies of any adapter's space in this process, without a results database (``docs/adapters.md``).

The parts are the tuner's own: the space (:mod:`tuner.space`) and its adapter, the study's candidates (one
config per distinct launch, :class:`tuner.study.StudyPlan`), a strategy (:mod:`tuner.strategies`) that
proposes what to measure next, and the paired statistics (:mod:`tuner.stats`). What differs from
``tuner search`` is the measuring and the recording: every candidate runs here, first through the
correctness gate against the adapter's reference, then in ``rounds`` interleaved pairs with the baseline
(wall-clock time: under ``TRITON_INTERPRET=1`` it ranks the interpreter, not a GPU), and the picks are
returned, not stored. ``tuner search`` records into a database whose columns are the built-in kernel's.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from dataclasses import field

from . import stats
from . import strategies
from .feasibility import Feasibility
from .space import SearchSpace
from .study import StudyPlan


@dataclass
class LevelResult:
    """One level of one workload: the pick, and every measured launch's ratio to the baseline."""

    workload: str
    concurrency: int
    pick: object  # the adapter's config
    ratios: dict = field(default_factory=dict)  # config -> candidate / baseline time (None: failed the gate)
    failures: dict = field(default_factory=dict)  # config -> why it failed the gate
    launches: int = 0  # distinct launches of the level
    stopped: str = ""


def run_local_study(space: SearchSpace, device: str = "cpu", sampler: str | None = None) -> list[LevelResult]:
    """Every workload x level of ``space``, measured in this process; one :class:`LevelResult` each."""
    name = sampler or space.sampler.get("name") or strategies.DEFAULT
    given = space.sampler.get("options", {}) if name == space.sampler.get("name") else {}
    strategy = strategies.make(name, space.sampler.get("seed", 0), **given)
    rounds = space.measurement["rounds"]
    out, history = [], []
    for spec in space.workloads:
        wl = spec.workload()
        # no compile here: under the interpreter there is no compiler (check it with KernelAdapter.compile_specs)
        verdicts = {c: Feasibility(True, 0, space.limit_bytes, None, None, 0, "not compiled") for c in space.configs()}
        for conc in space.concurrency:
            plan = StudyPlan(space, spec, wl, conc, verdicts, name)
            out.append(_level(space, plan, strategy, rounds, device, history))
    close = getattr(strategy, "close", None)
    if close is not None:
        close()
    return out


def _level(space: SearchSpace, plan: StudyPlan, strategy, rounds: int, device: str, history: list) -> LevelResult:
    """One level, measured until the strategy stops it; its measurements are added to ``history`` (the
    earlier levels' :class:`tuner.strategies.Measured` rows, which the strategy learns from)."""
    adapter, wl, conc, base = space.adapter, plan.workload, plan.concurrency, space.baseline
    inputs = adapter.inputs(wl, conc, device, seed=conc)
    expected = adapter.reference(inputs)
    candidates = plan.to_measure()
    level = strategies.Level(conc, wl, candidates, baseline=base, adapter=adapter)
    result = LevelResult(plan.spec.name, conc, base, launches=len(candidates))
    while True:
        why = strategy.stop_reason(level, history)
        proposed = strategy.propose(level, 1, history) if why is None else []
        if not proposed:
            result.stopped = why or "the strategy proposes nothing more"
            break
        cfg = proposed[0]
        failure = adapter.check(adapter.launch(cfg, inputs), expected)
        if failure:
            result.failures[cfg], result.ratios[cfg], level.measured[cfg] = failure, None, None
        else:
            pairs = [(_time(adapter, cfg, inputs), _time(adapter, base, inputs)) for _ in range(rounds)]
            ratio = 1.0 if cfg == base else stats.paired(*zip(*pairs, strict=True), bootstrap=False).ratio
            result.ratios[cfg], level.measured[cfg] = ratio, math.log(ratio)
    history += level.own()
    best = level.best()
    result.pick = best[0] if best is not None and best[1] < 0 else base
    return result


def _time(adapter, cfg, inputs) -> float:
    """One launch's wall time in µs."""
    t0 = time.perf_counter()
    adapter.launch(cfg, inputs)
    return (time.perf_counter() - t0) * 1e6
