"""The search benchmark: every strategy over seeds, by replay of recorded full grids, on a CPU.

    python benchmarks/bench_search.py                       # the default cases, 10 seeds, every strategy
    python benchmarks/bench_search.py --strategies surrogate --seeds 3 --cases v4_216
    python benchmarks/bench_search.py --jobs 2 ...            # two runs at once (results are the same)
    python benchmarks/bench_search.py --overhead              # one replay search's time, and the model's share
    python benchmarks/bench_search.py --option stop_p=0.1 ...   # a strategy option (tuner search --help)
    python benchmarks/bench_search.py --gpus "1;1,1;1,1,0.5,0.5" ...  # N simulated GPUs per study, by their speeds

Each run is a real ``tuner search --backend replay --seed N`` of a space version stored with the recorded
full grid (``tuner_spaces``), against a fresh results database, so no run sees another's measurements and
no priors enter (``--priors`` first replays the nearest other kernel's records of the space into the fresh
database, under that kernel's hash: the strategy's priors, and the previous picks measured first). Per case and
strategy it prints:

- ``within 1 %``: the share of (level, seed) runs whose pick (what ``tuner best`` names) is within 1 % of
  the recorded best launch. The truth of a launch is the geometric mean ratio to the baseline over every
  recorded round (screening and finalist), which is what the replay draws from;
- median and worst regret of the pick against that best;
- ``measured``: launches measured, as a share of the distinct feasible launches, summed over the levels;
- ``false non-flat``: among ok trials whose true ratio lies within the study's band of the baseline, the
  share called win or regression after the study-wide correction (pooled, and the worst level).

``--landscape shifted`` multiplies every launch's recorded times by a smooth random factor of its
parameters and C (seeded), which moves the optimum: a landscape the strategy was not tuned on.
TPE gets ``--n-trials`` = 25 % of an average level's distinct launches.
``--gpus`` replays each run on simulated GPUs sharing each study (:class:`tuner.replay.SimulatedGPUs`: the study's
own threads, one per GPU, in virtual time): their ``simulated GPU s`` is the virtual wall time of the measurements.
Full results go to ``--out`` (JSON); the table is printed last.

``--overhead`` instead times one replay search as ``tuner search SPACE --backend replay --replay-db DB
--concurrency LEVELS`` runs it (the newest kernel's records, a fresh results database; default
``search_spaces/v4_flash_tp4.yaml`` at C = 1, 8, 48, 96): its wall time, the time the search spent in the
strategy (``model``: proposals and the stop rule, waits for a hyperparameter optimization included), of which
``waiting`` for an optimization, the levels' ``database`` time (the tuner's rows and Optuna's), the time outside the
levels (the replay source's load), the optimizations' own time in their worker (``optimizing``) and the launches
measured.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
from tabulate import tabulate  # noqa: E402

from sparse_mla_tuner.tuner import strategies  # noqa: E402

# The default cases: (space name, kernel hash whose full grids are replayed), in order; a case's levels are those
# at which that kernel recorded every config of the space. The current kernel's grids go first (add a line per
# space: ("v4_flash_tp4", HASH), ("v32_tp8", HASH), ("v4_flash_layer_tp4", HASH)); older kernels' stay as extra cases.
CASES: list[tuple[str, str]] = [
    ("v4_flash_tp4", "be009e1b9a4c"),  # the current kernel: 756 configs at all 15 levels (results/h200_db delta 0002)
    ("v32_tp8", "be009e1b9a4c"),
    ("v4_flash_tp4", "ea528dafbe5c"),
    ("v32_tp8", "efab766bd8d8"),
    ("v4_flash_tp4", "b0979f66ca00"),
    ("v32_tp8", "32ae50587d54"),
]
SHORT = {  # short names of older kernels' cases (--cases takes these or SPACE:KERNEL)
    ("v4_flash_tp4", "ea528dafbe5c"): "v4_216",
    ("v32_tp8", "efab766bd8d8"): "v32_216",
    ("v4_flash_tp4", "b0979f66ca00"): "v4_756",
    ("v32_tp8", "32ae50587d54"): "v32_756",
}


def case_name(space: str, kernel: str) -> str:
    return SHORT.get((space, kernel), f"{space}:{kernel}")


def parse_case(name: str) -> tuple[str, str]:
    """A ``--cases`` entry: a short name, or ``SPACE:KERNEL``."""
    for key, short in SHORT.items():
        if name == short:
            return key
    space, sep, kernel = name.partition(":")
    if not sep or not space or not kernel:
        known = ", ".join(case_name(*c) for c in CASES)
        raise SystemExit(f"--cases {name!r}: a short name or SPACE:KERNEL (the default cases: {known})")
    return space, kernel


STRATEGIES = ("surrogate", "grid", "tpe")
TPE_SHARE = 0.25  # TPE's --n-trials: this share of the mean distinct launches per level


@dataclass
class Case:
    name: str
    space_path: str
    kernel: str
    replay_db: str
    levels: list[int]


STUDIES = (  # a kernel's studies of a space, with their trials
    "FROM tuner_studies s JOIN tuner_spaces sp ON sp.id = s.space_id JOIN tuner_kernels k ON k.id = s.kernel_id "
    "JOIN tuner_trials t ON t.study_id = s.id WHERE sp.name = ? AND k.source_hash = ? "
)


def _rows(db: str, select: str, space: str, kernel: str) -> list:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return con.execute(select.replace("FROM_STUDIES ", STUDIES), (space, kernel)).fetchall()
    finally:
        con.close()


def full_grid_levels(db: str, space: str, kernel: str, n_configs: int) -> list[int]:
    """The levels at which the kernel's studies of the space recorded every config."""
    rows = _rows(
        db, "SELECT s.concurrency, count(DISTINCT t.config_key) FROM_STUDIES GROUP BY s.concurrency", space, kernel
    )
    return sorted(c for c, n in rows if n >= n_configs)


def space_text(db: str, space: str, kernel: str) -> str:
    """The space version stored with the kernel's studies (the most configs recorded)."""
    rows = _rows(db, "SELECT sp.text FROM_STUDIES GROUP BY sp.id ORDER BY count(t.id) DESC LIMIT 1", space, kernel)
    if not rows:
        raise SystemExit(f"{db} holds no studies of space {space!r} by kernel {kernel}")
    return rows[0][0]


def truths(source, space, wl, levels) -> dict[int, dict[str, float]]:
    """Per level: every recorded ok launch's true ratio (geometric mean over all its recorded rounds)."""
    from sparse_mla_tuner.tuner.study import launch_key

    out = {}
    for c in levels:
        per = {}
        for cfg in space.configs():
            rec = source.lookup(wl, c, cfg)
            if rec is None or rec.verdict != "ok" or not rec.samples:
                continue
            d = np.log([a / b for a, b in rec.samples])
            per[launch_key(cfg, wl, c)] = math.exp(float(d.mean()))
        out[c] = per
    return out


def shift_source(source, baseline, seed: int, scale: float = 0.15) -> None:
    """A landscape the strategies were not tuned on: every recorded launch's candidate times (not the
    baseline's) multiplied by ``exp(scale * tanh(w . x / 4))``, a smooth random function of its log
    parameters and log C with weights ``w`` drawn from ``seed``: the optimum moves, the noise stays."""
    from sparse_mla_tuner.kernels.config import PARAM_NAMES

    w = np.random.default_rng(1000 + seed).normal(size=len(PARAM_NAMES) + 1)
    done: set[int] = set()
    for (_shape, c, cfg), rec in source.trials.items():
        if cfg == baseline or id(rec.samples) in done:
            continue
        done.add(id(rec.samples))
        x = np.array([math.log2(getattr(cfg, p) + 1) for p in PARAM_NAMES] + [math.log2(c)])
        f = math.exp(scale * math.tanh(float(w @ x) / 4))
        rec.samples[:] = [(a * f, b) for a, b in rec.samples]


def prior_kernels(db: str, space: str, kernel: str) -> list[str]:
    """The other kernels with studies of the space, nearest first: those recorded before ``kernel`` (the
    newest first), then those after it (the oldest first)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute(
            "SELECT k.source_hash, min(s.id) FROM tuner_studies s JOIN tuner_spaces sp ON sp.id = s.space_id "
            "JOIN tuner_kernels k ON k.id = s.kernel_id WHERE sp.name = ? GROUP BY k.source_hash",
            (space,),
        ).fetchall()
    finally:
        con.close()
    first = dict(rows)[kernel]
    before = sorted((i, h) for h, i in rows if i < first)[::-1]
    after = sorted((i, h) for h, i in rows if i > first)
    return [h for _, h in before + after]


def add_priors(case: Case, space, store, opts, seed: int) -> str | None:
    """Another kernel's records of the space, replayed into ``store`` first by the grid under that kernel's
    hash (a replay records the hash of the code that runs it): the surrogate's priors, and the previous picks
    every search measures first. The nearest kernel (:func:`prior_kernels`) whose baseline has A/A samples of
    its own at some level; returns its hash."""
    import dataclasses

    from sparse_mla_tuner.db import queries
    from sparse_mla_tuner.tuner import search as search_mod
    from sparse_mla_tuner.tuner.errors import TunerError
    from sparse_mla_tuner.tuner.replay import ReplaySource

    for prior in prior_kernels(case.replay_db, space.name, case.kernel):
        source = ReplaySource(opts.replay_db, None, prior)
        for c in case.levels:  # one at a time: a level whose baseline has no A/A of that kernel is left out
            try:
                search_mod.run_search(
                    space,
                    store,
                    dataclasses.replace(
                        opts,
                        sampler="grid",
                        replay_kernel=prior,
                        replay_source=source,
                        record_kernel=prior,
                        concurrency=[c],
                        seed=seed,
                        strategy_options={},
                    ),
                )
            except TunerError:
                continue
        with store.session() as s:
            if any(t.study.kernel.source_hash == prior for t in queries.trials(s)):
                return prior
    return None


def run_one(
    case: Case,
    strategy: str,
    seed: int,
    n_trials,
    landscape: str,
    priors: bool = False,
    options: dict | None = None,
    speeds: list[float] | None = None,
) -> dict:
    import dataclasses

    from sparse_mla_tuner.db import queries
    from sparse_mla_tuner.db.store import Store
    from sparse_mla_tuner.db.verdicts import Verdict
    from sparse_mla_tuner.kernels.config import kernel_source_hash
    from sparse_mla_tuner.tuner import search as search_mod
    from sparse_mla_tuner.tuner.adapters.sparse_mla.records import config_of
    from sparse_mla_tuner.tuner.replay import ReplaySource
    from sparse_mla_tuner.tuner.search import Options
    from sparse_mla_tuner.tuner.space import load_space
    from sparse_mla_tuner.tuner.study import launch_key

    space = load_space(case.space_path)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(f"sqlite:///{tmp}/bench.db")
        opts = Options(
            backend="replay",
            sampler=strategy,
            n_trials=n_trials,
            quiet=True,
            replay_db=f"sqlite:///{case.replay_db}",
            replay_kernel=case.kernel,
            seed=seed,
            concurrency=case.levels,
            strategy_options=dict(options or {}),
        )
        prior = add_priors(case, space, store, opts, seed) if priors else None
        if speeds:  # N simulated GPUs sharing each study (tuner.replay.SimulatedGPUs)
            opts = dataclasses.replace(opts, workers=len(speeds), replay_speeds=list(speeds))
        source = ReplaySource(opts.replay_db, None, case.kernel)
        if landscape == "shifted":
            shift_source(source, space.baseline, seed)
        t0 = time.monotonic()
        opts = dataclasses.replace(opts, replay_source=source)
        rows = search_mod.run_search(space, store, opts)
        wall = time.monotonic() - t0
        wl = space.workloads[0].workload()
        truth = truths(source, space, wl, case.levels)
        levels = []
        with store.session() as s:
            for row in rows:
                c = row["C"]
                trials = [
                    t
                    for t in queries.trials(s, concurrency=c)
                    if t.workload.name == space.workloads[0].name and t.study.kernel.source_hash == kernel_source_hash()
                ]  # this run's, not the priors'
                best = queries.best_of(trials)
                band = max((st.noise_band for t in trials if (st := t.statistic()) is not None), default=0.01)
                per = truth[c]
                best_true = min(per.values())
                pick_true = per.get(launch_key(config_of(best), wl, c)) if best else None
                regret = (pick_true / best_true - 1.0) if pick_true else float("inf")
                measured = sum(t.verdict not in (Verdict.INFEASIBLE, Verdict.DUPLICATE) for t in trials)
                near = flagged = 0
                for t in trials:
                    st = t.statistic()
                    true = per.get(t.launch_key) if t.launch_key else None
                    if t.verdict != Verdict.OK or st is None or true is None or t.is_baseline:
                        continue
                    if abs(math.log(true)) < math.log(1 + band):
                        near += 1
                        flagged += st.classification != "flat"
                levels.append(
                    {
                        "C": c,
                        "pick": best.config_key if best else None,
                        "regret": regret,
                        "measured": measured,
                        "launches": len(per),
                        "near": near,
                        "false_nonflat": flagged,
                        "stopped": row.get("stopped"),
                    }
                )
    sim = opts.simulated
    return {
        "case": case.name,
        "strategy": strategy,
        "seed": seed,
        "wall_s": wall,
        "levels": levels,
        "prior": prior,
        "speeds": list(speeds or [1.0]),
        "gpu_s": sim.now if sim is not None else None,  # simulated wall time of the measurements
        "busy_s": list(sim.busy) if sim is not None else None,
    }


def mean_launches(case: Case) -> float:
    from sparse_mla_tuner.tuner.replay import ReplaySource
    from sparse_mla_tuner.tuner.space import load_space

    space = load_space(case.space_path)
    source = ReplaySource(f"sqlite:///{case.replay_db}", None, case.kernel)
    per = truths(source, space, space.workloads[0].workload(), case.levels)
    return float(np.mean([len(v) for v in per.values()]))


def summarize(runs: list[dict]) -> list[dict]:
    table = []
    for (case, strategy, *_), group in _groups(runs).items():
        lv = [x for r in group for x in r["levels"]]
        regrets = np.array([x["regret"] for x in lv])
        near = sum(x["near"] for x in lv)
        false = sum(x["false_nonflat"] for x in lv)
        per_level: dict[int, list] = {}
        for x in lv:
            per_level.setdefault(x["C"], [0, 0])
            per_level[x["C"]][0] += x["near"]
            per_level[x["C"]][1] += x["false_nonflat"]
        worst_level = max((f / n for n, f in per_level.values() if n), default=0.0)
        table.append(
            {
                "case": case,
                "strategy": strategy,
                "runs": f"{len(group)} x {len(group[0]['levels'])}",
                "within 1 %": f"{np.mean(regrets <= 0.01):.0%}",
                "median regret": f"{np.median(regrets):.1%}",
                "worst regret": f"{np.max(regrets):.1%}",
                "measured": f"{sum(x['measured'] for x in lv) / sum(x['launches'] for x in lv):.1%}",
                "false non-flat (worst C)": f"{false / near if near else 0:.1%} ({worst_level:.0%})",
                "wall s/run": f"{np.mean([r['wall_s'] for r in group]):.0f}",
            }
        )
        sims = [r["gpu_s"] for r in group if r.get("gpu_s") is not None]
        if sims:
            table[-1]["GPUs"] = _speeds(group[0]["speeds"])
            table[-1]["simulated GPU s/run"] = f"{np.mean(sims):.0f}"
    return table


def _speeds(speeds) -> str:
    """``4 x 1.0`` or ``1.0,1.0,0.5,0.5``."""
    return f"{len(speeds)} x {speeds[0]:g}" if len(set(speeds)) == 1 else ",".join(f"{v:g}" for v in speeds)


def _per_level(levels) -> str:
    """Each level's regret and launches measured, as ``C=48: 0.0 %/61``."""
    return ", ".join(f"C={x['C']}: {x['regret']:.1%}/{x['measured']}" for x in levels)


def _groups(runs):
    out: dict = {}
    for r in runs:
        key = (r["case"], r["strategy"]) if "speeds" not in r else (r["case"], r["strategy"], tuple(r["speeds"]))
        out.setdefault(key, []).append(r)
    return out


def _run_quietly(job) -> dict:
    os.environ.setdefault("TUNER_QUIET_OPTUNA", "1")
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    return run_one(*job)


def overhead(
    space_path: str,
    replay_db: str,
    levels: list[int],
    seed: int = 0,
    refit: str | None = None,
    options=None,
    replay_kernel: str | None = None,
) -> dict:
    """One replay search (see the module's docstring) and where its time went."""
    from sparse_mla_tuner.db.store import Store
    from sparse_mla_tuner.tuner import search as search_mod
    from sparse_mla_tuner.tuner.search import Options
    from sparse_mla_tuner.tuner.space import load_space

    space = load_space(space_path)
    opts = Options(
        backend="replay",
        quiet=True,
        replay_db=f"sqlite:///{replay_db}",
        replay_kernel=replay_kernel,
        concurrency=levels,
        seed=seed,
        refit=refit,
        strategy_options=dict(options or {}),
    )
    st = search_mod.make_strategy(space, opts)  # made here, so that its timings can be read afterwards
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        rows = search_mod.run_search(space, Store(f"sqlite:///{tmp}/overhead.db"), opts, strategy=st)
        wall = time.monotonic() - t0
    refitter = getattr(st, "refitter", None)
    return {
        "space": space.name,
        "levels": levels,
        "strategy": st.name,
        "replay_kernel": replay_kernel,
        "refit": refit or "deterministic",
        "wall_s": wall,
        "model_s": getattr(st, "model_seconds", float("nan")),
        "waiting_s": refitter.wait_seconds if refitter else 0.0,
        "optimizing_s": getattr(st, "hpo_seconds", 0.0),
        "optimizations": refitter.fits if refitter else 0,
        "measured": {r["C"]: r.get("ok") for r in rows},
        "database_s": sum(r.get("database_s", 0.0) for r in rows),  # the tuner's rows and Optuna's, in the levels
        "levels_s": sum(r.get("wall_s", 0.0) for r in rows),  # the rest of the wall: the replay source's load
    }


def parse_speeds(text: str) -> list[float]:
    """``1,1,0.5``: the speeds of simulated GPUs (positive numbers)."""
    try:
        speeds = [float(v) for v in text.split(",")]
    except ValueError:
        speeds = []
    if not speeds or any(not (v > 0) for v in speeds):
        raise SystemExit(f"--gpus {text!r}: comma-separated positive speeds, e.g. 1,1,0.5,0.5")
    return speeds


def parse_options(given: list[str]) -> dict:
    """``NAME=VALUE`` strings as strategy options (a VALUE as a Python literal: ``stop_p=0.1``, ``carry=2``); a
    name no strategy has, or a value out of its rule, ends the benchmark with the reason."""
    import ast

    if not given:
        return {}
    out = {}
    for item in given:
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--option {item!r}: NAME=VALUE")
        out[name.strip()] = ast.literal_eval(value.strip())
    known = {n for name in strategies.NAMES for n in strategies.options_type(name).names()}
    unknown = sorted(set(out) - known)
    if unknown:
        raise SystemExit(f"--option {unknown[0]}: no strategy has it; allowed: {', '.join(sorted(known))}")
    for name in strategies.NAMES:
        table = strategies.options_type(name)
        try:
            table.from_mapping({k: v for k, v in out.items() if k in table.names()}, name)
        except strategies.OptionError as e:
            raise SystemExit(f"--option {e}") from None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replay-db", default="results/h200.db")
    ap.add_argument(
        "--cases",
        default=",".join(case_name(*c) for c in CASES),
        help="comma-separated: short names or SPACE:KERNEL (default: every case of CASES)",
    )
    ap.add_argument(
        "--gpus",
        default=None,
        metavar="SPEEDS;SPEEDS",
        help="simulated GPUs sharing each study, as their speeds (1,1,0.5,0.5: four, two at half speed); several "
        "sets separated by ';' run each (default: one GPU, no simulated time)",
    )
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--grid-seeds", type=int, default=None, help="seeds for grid and TPE (default: --seeds)")
    ap.add_argument("--landscape", choices=["recorded", "shifted"], default="recorded")
    ap.add_argument(
        "--priors", action="store_true", help="replay the nearest other kernel's records into each fresh database first"
    )
    ap.add_argument("--out", default=None, help="JSON file for every run's levels")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once, one process each (default 1)")
    ap.add_argument("--overhead", action="store_true", help="time one replay search instead (see above)")
    ap.add_argument("--space", default="search_spaces/v4_flash_tp4.yaml", help="--overhead: the space")
    ap.add_argument("--levels", default="1,8,48,96", help="--overhead: the concurrency levels")
    ap.add_argument(
        "--replay-kernel",
        default="ea528dafbe5c",
        help="--overhead: the kernel hash whose records are replayed (default: the full grids of v4_216's kernel)",
    )
    ap.add_argument(
        "--refit",
        choices=["deterministic", "background", "inline"],
        default=None,
        help="--overhead: when re-optimized hyperparameters swap in (default: a replay's, deterministic)",
    )
    ap.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a strategy option (`tuner search --help` lists them), for every strategy that has it; repeatable",
    )
    args = ap.parse_args()
    if args.replay_db == "results/h200.db":  # a build product: from its committed base and deltas when stale
        subprocess.run([sys.executable, "results/h200_db.py", "build"], check=True)
    options = parse_options(args.option)
    if args.overhead:
        r = overhead(
            args.space,
            args.replay_db,
            [int(c) for c in args.levels.split(",")],
            refit=args.refit,
            options=options,
            replay_kernel=args.replay_kernel or None,
        )
        print(
            f"{r['space']} C={args.levels} ({r['strategy']}, {args.refit or 'deterministic'}): "
            f"{r['wall_s']:.1f} s in all, model {r['model_s']:.1f} s "
            f"(waiting for an optimization {r['waiting_s']:.1f} s), database {r['database_s']:.1f} s, outside the "
            f"levels {r['wall_s'] - r['levels_s']:.1f} s; {r['optimizations']} optimizations took "
            f"{r['optimizing_s']:.1f} s in their worker; ok launches per level {r['measured']}"
        )
        if args.out:
            Path(args.out).write_text(json.dumps(r, indent=1))
        return
    tmp = tempfile.mkdtemp()
    jobs = []
    gpu_sets = [None] if not args.gpus else [parse_speeds(g) for g in args.gpus.split(";")]
    for name in args.cases.split(","):
        space, kernel = parse_case(name)
        name = case_name(space, kernel)
        path = Path(tmp) / f"{name}.yaml"
        path.write_text(space_text(args.replay_db, space, kernel))
        from sparse_mla_tuner.tuner.space import load_space

        levels = full_grid_levels(args.replay_db, space, kernel, len(load_space(path).configs()))
        case = Case(name, str(path), kernel, args.replay_db, levels)
        for strategy in args.strategies.split(","):
            n_trials = None
            if strategy == "tpe":  # TPE's budget: a share of the distinct launches of an average level
                n_trials = max(1, round(TPE_SHARE * mean_launches(case)))
            seeds = args.seeds if strategy == "surrogate" or args.grid_seeds is None else args.grid_seeds
            # (the tables imported only when options are given: a model imported here would be forked into every run)
            mine = (
                {k: v for k, v in options.items() if k in strategies.options_type(strategy).names()} if options else {}
            )
            jobs += [
                (case, strategy, seed, n_trials, args.landscape, args.priors, mine, speeds)
                for speeds in gpu_sets
                for seed in range(seeds)
            ]
    runs = []
    with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:  # every run is independent
        for r in pool.map(_run_quietly, jobs):
            runs.append(r)
            lv = r["levels"]
            sim = f", {_speeds(r['speeds'])} GPUs {r['gpu_s']:.0f} s simulated" if r.get("gpu_s") is not None else ""
            print(
                f"{r['case']} {r['strategy']} seed {r['seed']}: {sum(x['regret'] <= 0.01 for x in lv)}/{len(lv)} "
                f"within 1 %, {sum(x['measured'] for x in lv)}/{sum(x['launches'] for x in lv)} measured, "
                f"{r['wall_s']:.0f} s{sim} ({_per_level(lv)})",
                flush=True,
            )
            if args.out:  # after every run: a run cut short keeps what it finished
                Path(args.out).write_text(json.dumps(runs, indent=1))
    print(tabulate(summarize(runs), headers="keys", tablefmt="github"))


if __name__ == "__main__":
    main()
