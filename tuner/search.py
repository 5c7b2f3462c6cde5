"""``tuner search``: one Optuna study per (space, workload, concurrency, device, backend).

Per study: the baseline first (its A/A rounds give the noise band), then every config of the grid
(enqueued, so resuming and several workers share one queue) or TPE's suggestions. Each config is
checked for feasibility on the target arch before anything launches; feasible ones go to the
worker: correctness gate, then paired A/B rounds against the baseline. Every trial and every raw
sample is written to the database as soon as it is measured; at the end the top finalists are
re-measured with more rounds.
"""

from __future__ import annotations

import re
import signal
import sys
import time
from dataclasses import dataclass

import click
import optuna
from tqdm import tqdm

from db import queries
from db.models import SampleModel
from db.models import StatisticModel
from db.models import StudyModel
from db.models import TrialModel
from db.store import Store
from kernels.config import PARAMS
from kernels.config import KernelConfig
from kernels.decode import kernel_source_hash
from kernels.decode import num_splits_for
from tuner import stats
from tuner.errors import TunerError
from tuner.feasibility import check_many
from tuner.measure import Worker
from tuner.measure import WorkerDied
from tuner.space import SearchSpace

GRID_MAX = 300  # the default sampler is the exhaustive grid up to this many feasible configs


def slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", s).strip("_")


def study_name(space: str, workload: str, concurrency: int, device: str, backend: str, kernel: str) -> str:
    return f"{space}/{workload}/C{concurrency}/{slug(device)}/{backend}/k{kernel}"


@dataclass
class Options:
    backend: str
    sampler: str | None = None
    n_trials: int | None = None
    timeout_s: float | None = None
    concurrency: list[int] | None = None
    remeasure: bool = False
    quiet: bool = False


class _Stop:
    """Ctrl-C: finish the running trial, then stop (a second Ctrl-C aborts at once)."""

    def __init__(self) -> None:
        self.requested = False

    def __enter__(self):
        self._old = signal.signal(signal.SIGINT, self._handler)
        return self

    def _handler(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        click.echo("\ninterrupt: stopping after the current trial (Ctrl-C again to abort now)", err=True)

    def __exit__(self, *exc):
        signal.signal(signal.SIGINT, self._old)
        return False


def _distributions(space: SearchSpace) -> dict:
    return {p: optuna.distributions.CategoricalDistribution(space.parameters[p]) for p in PARAMS}


def run_search(space: SearchSpace, store: Store, opts: Options) -> list[dict]:
    """Run (or resume) every study of ``space``; returns one summary row per workload x concurrency."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(store.url)
    worker = Worker(opts.backend)
    info = worker.start()
    if opts.backend == "interpreter":
        click.echo(
            "no CUDA GPU: using the interpreter backend (kernel under TRITON_INTERPRET=1, wall-clock "
            "timing); its timings are not GPU timings",
            err=True,
        )
    levels = opts.concurrency or space.concurrency
    unknown = [c for c in levels if c not in space.concurrency]
    if unknown:
        raise TunerError(f"--concurrency {unknown} not in {space.path}'s concurrency list {space.concurrency}")
    configs = space.configs()
    summary = []
    t_start = time.monotonic()
    try:
        with _Stop() as stop:
            for spec in space.workloads:
                wl = spec.workload()
                verdicts = dict(
                    zip(
                        configs,
                        check_many(
                            configs,
                            wl,
                            space.target,
                            max_spill_bytes=space.max_spill_bytes,
                            enforce_device=opts.backend == "cuda",
                        ),
                        strict=True,
                    )
                )
                n_feasible = sum(v.feasible for v in verdicts.values())
                if opts.backend == "cuda":
                    from tuner.warmup import warm

                    t0 = time.monotonic()
                    warm([c for c, v in verdicts.items() if v.feasible], wl)
                    click.echo(f"compiled {n_feasible} feasible configs in {time.monotonic() - t0:.0f} s", err=True)
                sampler = opts.sampler or ("grid" if n_feasible <= GRID_MAX else "tpe")
                for conc in levels:
                    if stop.requested or (opts.timeout_s and time.monotonic() - t_start > opts.timeout_s):
                        break
                    summary.append(
                        _study(
                            space,
                            spec,
                            wl,
                            conc,
                            configs,
                            verdicts,
                            sampler,
                            store,
                            storage,
                            worker,
                            info,
                            opts,
                            stop,
                            t_start,
                        )
                    )
    finally:
        worker.close()
    return summary


def _study(space, spec, wl, conc, configs, verdicts, sampler, store, storage, worker, info, opts, stop, t_start):
    khash = kernel_source_hash()
    base_name = study_name(space.name, spec.name, conc, info["gpu_name"], opts.backend, khash)
    with store.session() as s:
        env = queries.ensure_environment(s, info)
        kernel = queries.ensure_kernel(s, khash)
        wrow = queries.ensure_workload(s, spec)
        srow = queries.ensure_space(s, space)
        name = base_name
        if opts.remeasure:  # a fresh study beside the old ones: nothing measured before is lost
            n_old = s.query(StudyModel).filter(StudyModel.name.like(base_name + "%")).count()
            name = f"{base_name}#r{n_old + 1}" if n_old else base_name
        study_row = s.query(StudyModel).filter_by(name=name).one_or_none()
        if study_row is None:
            study_row = StudyModel(
                name=name,
                space_id=srow.id,
                workload_id=wrow.id,
                environment_id=env.id,
                kernel_id=kernel.id,
                concurrency=conc,
                backend=opts.backend,
            )
            s.add(study_row)
            s.flush()
        ids = {"study": study_row.id, "env": env.id, "kernel": kernel.id, "workload": wrow.id}
        done = set(queries.done_configs(s, study_row.id))
        band = study_row.noise_band
    optuna_sampler = optuna.samplers.TPESampler(seed=space.sampler["seed"]) if sampler == "tpe" else None
    study = optuna.create_study(
        study_name=name, storage=storage, direction="minimize", load_if_exists=True, sampler=optuna_sampler
    )
    _fail_stale(study)
    order = [space.baseline] + [c for c in configs if c != space.baseline]
    if sampler == "grid":
        waiting = {_key(t.params) for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))}
        for cfg in order:
            if str(cfg) not in done and str(cfg) not in waiting:
                study.enqueue_trial(cfg.as_dict(), skip_if_exists=False)
        total = len(order)
        budget = opts.n_trials or total
    else:
        if str(space.baseline) not in done:
            study.enqueue_trial(space.baseline.as_dict(), skip_if_exists=True)
        total = budget = opts.n_trials or space.sampler.get("n_trials") or 100
    counts = {"infeasible": 0, "wrong": 0, "crashed": 0, "timeout": 0, "ok": 0}
    bar = tqdm(
        total=total,
        initial=min(len(done), total),
        desc=f"{spec.name} C={conc}",
        file=sys.stderr,
        disable=opts.quiet,
        dynamic_ncols=True,
    )
    dists = _distributions(space)
    n_new = 0
    while n_new < budget and len(done) < total and not stop.requested:
        if opts.timeout_s and time.monotonic() - t_start > opts.timeout_s:
            break
        if band is None and str(space.baseline) in done:
            band = _band_from_db(store, ids["study"])
            if band is None:
                _baseline_failed(store, ids["study"], space.baseline)
        trial = study.ask(fixed_distributions=dists)
        cfg = KernelConfig.from_dict(trial.params)
        key = str(cfg)
        if key in done or not space.satisfies(cfg):
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            if sampler == "grid":
                continue
            n_new += 1
            continue
        is_base = cfg == space.baseline
        if band is None and not is_base:  # the baseline (A/A) must come first: it sets the noise band
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            study.enqueue_trial(cfg.as_dict())  # to the back of the queue, behind the baseline
            continue
        verdict = verdicts[cfg]
        t0 = time.monotonic()
        result = _measure(worker, space, wl, conc, cfg, verdict, trial.number, space.measurement["rounds"], True)
        result["wall_s"] = time.monotonic() - t0
        band, stat = _record(
            store, ids, space, conc, cfg, verdict, result, is_base, band, name, trial.number, opts.backend
        )
        counts[result["verdict"]] += 1
        done.add(key)
        if is_base and result["verdict"] != "ok":
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            _baseline_failed(store, ids["study"], space.baseline)
        n_new += 1
        if result["verdict"] == "ok":
            study.tell(trial, stat.median_us)
        else:
            trial.set_user_attr("verdict", result["verdict"])
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        bar.update(1)
        bar.set_postfix_str(_postfix(store, ids["study"], band), refresh=False)
    bar.close()
    if not stop.requested and len(done) >= total:
        _finalists(store, ids, space, wl, conc, worker, name, opts, band, verdicts)
    return _summary_row(store, ids["study"], spec.name, conc, counts)


def _key(params: dict) -> str:
    try:
        return str(KernelConfig.from_dict(params))
    except (ValueError, TypeError, KeyError):
        return ""


def _fail_stale(study) -> None:
    """Trials left RUNNING by a killed run (kill -9) are failed so that their config is measured again."""
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        study.tell(t.number, state=optuna.trial.TrialState.FAIL)
        if t.params:
            study.enqueue_trial(t.params)


def _measure(worker, space, wl, conc, cfg, verdict, seed, rounds, check) -> dict:
    if not verdict.feasible:
        return {"verdict": "infeasible", "reason": verdict.reason, "samples": []}
    req = {
        "op": "measure",
        "workload": wl.__dict__,
        "batch": conc,
        "candidate": cfg.as_dict(),
        "baseline": space.baseline.as_dict(),
        "rounds": rounds,
        "seed": seed,
        "check": check,
    }
    try:
        return worker.request(req, timeout_s=space.measurement["trial_timeout_s"])
    except WorkerDied as e:
        return {"verdict": e.verdict, "reason": e.reason[-2000:], "samples": []}


def _record(store, ids, space, conc, cfg, verdict, result, is_base, band, name, number, backend):
    """Write the trial, its raw samples and its statistics in one transaction."""
    samples = result.get("samples") or []
    stat_row = None
    with store.session() as s:
        t = TrialModel(
            study_id=ids["study"],
            workload_id=ids["workload"],
            environment_id=ids["env"],
            kernel_id=ids["kernel"],
            concurrency=conc,
            backend=backend,
            config_key=str(cfg),
            **cfg.as_dict(),
            num_splits=result.get("num_splits") or 0,
            is_baseline=is_base,
            verdict=result["verdict"],
            reason=result.get("reason", ""),
            shared_bytes=verdict.shared_bytes,
            limit_bytes=verdict.limit_bytes,
            registers=verdict.registers,
            spill_bytes=verdict.spill_bytes,
            estimate_bytes=verdict.estimate_bytes,
            out_rel_err=result.get("out_rel_err"),
            lse_abs_err=result.get("lse_abs_err"),
            optuna_study=name,
            optuna_trial_number=number,
            wall_s=result.get("wall_s"),
        )
        if verdict.feasible and verdict.reason and not t.reason:
            t.reason = verdict.reason  # e.g. a spill warning
        s.add(t)
        s.flush()
        for r, (c, b) in enumerate(samples):
            s.add(
                SampleModel(
                    trial_id=t.id,
                    phase="screen",
                    round=r,
                    candidate_us=c,
                    baseline_us=b,
                    replays=result.get("replays", 1),
                )
            )
        if result["verdict"] == "ok" and samples:
            c, b = zip(*samples, strict=True)
            ps = stats.paired(c, b, seed=number)
            if is_base:
                band = stats.noise_band(c, b, seed=number)
                study = s.get(StudyModel, ids["study"])
                study.noise_band, study.noise_n = band, len(samples)
            stat_row = _stat(t.id, "screen", ps, band or 0.0)
            s.add(stat_row)
    return band, stat_row


def _stat(trial_id, phase, ps: stats.PairedStats, band: float) -> StatisticModel:
    return StatisticModel(
        trial_id=trial_id,
        phase=phase,
        n=ps.n,
        median_us=ps.median_us,
        ci_low_us=ps.ci_low_us,
        ci_high_us=ps.ci_high_us,
        baseline_median_us=ps.baseline_median_us,
        ratio=ps.ratio,
        ratio_ci_low=ps.ratio_ci_low,
        ratio_ci_high=ps.ratio_ci_high,
        noise_band=band,
        classification=ps.classify(band),
    )


def _baseline_failed(store, study_id, baseline) -> None:
    with store.session() as s:
        t = queries.done_configs(s, study_id).get(str(baseline))
        what = f"{t.verdict}: {t.reason}" if t else "not measured"
    raise TunerError(
        f"the baseline {baseline} is {what}; candidates cannot be compared with it - pick another "
        "`baseline` in the search space"
    )


def _band_from_db(store, study_id) -> float | None:
    with store.session() as s:
        return s.get(StudyModel, study_id).noise_band


def _postfix(store, study_id, band) -> str:
    with store.session() as s:
        rows = [t for t in queries.done_configs(s, study_id).values() if t.verdict == "ok" and t.statistic()]
        if not rows:
            return f"band ±{(band or 0) * 100:.1f}%"
        b = min(rows, key=lambda t: t.statistic().median_us)
        return f"best {b.config_key} {b.statistic().median_us:.1f}µs, band ±{(band or 0) * 100:.1f}%"


def _finalists(store, ids, space, wl, conc, worker, name, opts, band, verdicts) -> None:
    k, rounds = space.measurement["finalists"], space.measurement["finalist_rounds"]
    with store.session() as s:
        ok = [t for t in queries.done_configs(s, ids["study"]).values() if t.verdict == "ok" and t.statistic("screen")]
        ok.sort(key=lambda t: t.statistic("screen").median_us)
        todo = [(t.id, KernelConfig.from_dict(t.config())) for t in ok[:k] if not t.statistic("finalist")]
    for trial_id, cfg in todo:
        res = _measure(worker, space, wl, conc, cfg, verdicts[cfg], trial_id, rounds, check=False)
        if res["verdict"] != "ok":
            continue
        with store.session() as s:
            for r, (c, b) in enumerate(res["samples"]):
                s.add(
                    SampleModel(
                        trial_id=trial_id,
                        phase="finalist",
                        round=r,
                        candidate_us=c,
                        baseline_us=b,
                        replays=res.get("replays", 1),
                    )
                )
            c, b = zip(*res["samples"], strict=True)
            s.add(_stat(trial_id, "finalist", stats.paired(c, b, seed=trial_id), band or 0.0))


def _summary_row(store, study_id, workload, conc, counts) -> dict:
    with store.session() as s:
        trials = list(queries.done_configs(s, study_id).values())
        study = s.get(StudyModel, study_id)
        ok = [t for t in trials if t.verdict == "ok" and t.statistic()]
        tally = {v: sum(t.verdict == v for t in trials) for v in ("infeasible", "wrong", "crashed", "timeout")}
        row = {
            "workload": workload,
            "C": conc,
            "best": "-",
            "median_us": "-",
            "ratio vs baseline (95% CI)": "-",
            "verdict": "-",
            "noise band": f"±{(study.noise_band or 0) * 100:.1f}%",
            "ok": len(ok),
            **tally,
        }
        if ok:
            rank = {"finalist": 0, "screen": 1}
            b = min(ok, key=lambda t: (rank[t.statistic().phase], t.statistic().median_us))
            st = b.statistic()
            row.update(
                best=b.config_key,
                median_us=f"{st.median_us:.2f}",
                **{"ratio vs baseline (95% CI)": f"{st.ratio:.3f} [{st.ratio_ci_low:.3f}, {st.ratio_ci_high:.3f}]"},
                verdict=st.classification,
            )
    return row


def splits_for(cfg: KernelConfig, conc: int, wl) -> int:
    return num_splits_for(cfg, conc, wl.heads, wl.topk)[0]
