"""``tuner search``: one Optuna study per (space, workload, concurrency, device, backend).

Per study: the baseline first (its A/A rounds give the noise band), then every config of the grid
(enqueued, so resuming and several workers share one queue) or TPE's suggestions. Each config is
checked for feasibility on the target arch before anything launches; feasible ones go to the
worker: correctness gate, then paired A/B rounds against the baseline. Every trial and every raw
sample is written to the database as soon as it is measured; at the end the top finalists are
re-measured with more rounds.
"""

from __future__ import annotations

import json
import re
import signal
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from dataclasses import field

import click
import optuna
from sqlalchemy.exc import IntegrityError
from tqdm import tqdm

from db import queries
from db.models import NoiseModel
from db.models import SampleModel
from db.models import StatisticModel
from db.models import StudyModel
from db.models import TrialModel
from db.models import get_or_create
from db.store import DatabaseError
from db.store import Store
from kernels.config import PARAMS
from kernels.config import KernelConfig
from kernels.decode import kernel_source_hash
from tuner import stats
from tuner.errors import TunerError
from tuner.feasibility import check_many
from tuner.measure import Worker
from tuner.measure import WorkerDied
from tuner.space import SearchSpace

GRID_MAX = 300
HEARTBEAT_S = 2.0  # a running trial beats every 2 s; one silent for GRACE_S is a dead worker's
GRACE_S = 10  # the default sampler is the exhaustive grid up to this many feasible configs


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
    workers: int | None = None


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
    """Run (or resume, or join) every study of ``space``; one summary row per workload x concurrency."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # we record heartbeats ourselves around each measurement (ask/tell, not Study.optimize)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)  # heartbeat API
    storage = optuna.storages.RDBStorage(
        store.url,
        heartbeat_interval=HEARTBEAT_S,
        grace_period=GRACE_S,
        failed_trial_callback=optuna.storages.RetryFailedTrialCallback(max_retry=3),
    )
    workers = _start_workers(opts)
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
                checked = check_many(
                    configs,
                    wl,
                    space.target,
                    max_spill_bytes=space.max_spill_bytes,
                    enforce_device=opts.backend == "cuda",
                    store=store,
                )
                verdicts = dict(zip(configs, checked, strict=True))
                n_feasible = sum(v.feasible for v in verdicts.values())
                sampler = opts.sampler or ("grid" if n_feasible <= GRID_MAX else "tpe")
                if opts.backend == "cuda":
                    from tuner.warmup import warm

                    t0 = time.monotonic()
                    warm([c for c, v in verdicts.items() if v.feasible], wl)
                    click.echo(f"compiled {n_feasible} feasible configs in {time.monotonic() - t0:.0f} s", err=True)
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
                            workers,
                            opts,
                            stop,
                            t_start,
                        )
                    )
    finally:
        for w in workers:
            w.close()
    return summary


def _start_workers(opts: Options) -> list[Worker]:
    """One measurement worker per GPU (pinned with CUDA_VISIBLE_DEVICES), or N interpreter workers."""
    n = opts.workers
    if opts.backend == "cuda":
        import torch

        visible = torch.cuda.device_count()
        n = n or visible
        if n > visible:
            raise TunerError(f"--workers {n} needs {n} GPUs; {visible} are visible")
        workers = [Worker("cuda", {"CUDA_VISIBLE_DEVICES": _visible_device(i)}, gpu_index=i) for i in range(n)]
    else:
        workers = [Worker("interpreter", gpu_index=i) for i in range(n or 1)]
    for w in workers:
        w.start()
    return workers


def _visible_device(i: int) -> str:
    import os

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible.split(",")[i] if visible else str(i)


@dataclass
class _Ctx:
    """What the worker threads of one study share."""

    space: SearchSpace
    wl: object
    conc: int
    verdicts: dict
    sampler: str
    store: Store
    storage: object
    study: object
    ids: dict
    name: str
    opts: Options
    stop: _Stop
    t_start: float
    dists: dict
    done: set
    total: int
    budget: int
    bar: object
    lock: threading.Lock = field(default_factory=threading.Lock)
    n_new: int = 0
    counts: dict = field(default_factory=lambda: dict.fromkeys(("ok", "infeasible", "wrong", "crashed", "timeout"), 0))
    error: BaseException | None = None


def _study(space, spec, wl, conc, configs, verdicts, sampler, store, storage, workers, opts, stop, t_start):
    info = workers[0].info
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
        study_row = get_or_create(
            s,
            StudyModel,
            name=name,
            space_id=srow.id,
            workload_id=wrow.id,
            environment_id=env.id,
            kernel_id=kernel.id,
            concurrency=conc,
            backend=opts.backend,
        )
        ids = {"study": study_row.id, "kernel": kernel.id, "workload": wrow.id}
        done = set(queries.done_configs(s, study_row.id))
    optuna_sampler = optuna.samplers.TPESampler(seed=space.sampler["seed"]) if sampler == "tpe" else None
    study = optuna.create_study(
        study_name=name, storage=storage, direction="minimize", load_if_exists=True, sampler=optuna_sampler
    )
    optuna.storages.fail_stale_trials(study)
    order = [space.baseline] + [c for c in configs if c != space.baseline]
    if sampler == "grid":
        _enqueue_missing(study, order, done)
        total = len(order)
        budget = opts.n_trials or total
    else:
        if str(space.baseline) not in done:
            study.enqueue_trial(space.baseline.as_dict(), skip_if_exists=True)
        total = budget = opts.n_trials or space.sampler.get("n_trials") or 100
    bar = tqdm(
        total=total,
        initial=min(len(done), total),
        desc=f"{spec.name} C={conc}",
        file=sys.stderr,
        disable=opts.quiet,
        dynamic_ncols=True,
    )
    ctx = _Ctx(
        space,
        wl,
        conc,
        verdicts,
        sampler,
        store,
        storage,
        study,
        ids,
        name,
        opts,
        stop,
        t_start,
        _distributions(space),
        done,
        total,
        budget,
        bar,
    )
    threads = [threading.Thread(target=_worker_loop, args=(ctx, w), daemon=True) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(timeout=0.5)  # keeps the main thread responsive to Ctrl-C
    bar.close()
    if ctx.error is not None:
        raise ctx.error
    if not stop.requested and len(done) >= total:
        _finalists(ctx, workers[0])
    return _summary_row(store, ids["study"], spec.name, conc)


def _key(params: dict) -> str:
    try:
        return str(KernelConfig.from_dict(params))
    except (ValueError, TypeError, KeyError):
        return ""


def _enqueue_missing(study, order, done) -> None:
    """Queue every config that is neither measured, nor queued, nor running (by any worker or host)."""
    states = (optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING)
    pending = {_key(t.params) for t in study.get_trials(deepcopy=False, states=states)}
    for cfg in order:
        if str(cfg) not in done and str(cfg) not in pending:
            study.enqueue_trial(cfg.as_dict(), skip_if_exists=False)


def _worker_loop(ctx: _Ctx, worker: Worker) -> None:
    try:
        env_id, band = _noise_band(ctx, worker)
        while True:
            with ctx.lock:
                if ctx.stop.requested or ctx.n_new >= ctx.budget or len(ctx.done) >= ctx.total:
                    return
                if ctx.opts.timeout_s and time.monotonic() - ctx.t_start > ctx.opts.timeout_s:
                    return
                trial = _next_trial(ctx)
            if trial is None:
                time.sleep(1.0)  # others are running the last trials; a dead host's come back after its grace period
                continue
            _run_trial(ctx, worker, trial, env_id, band)
    except BaseException as e:  # noqa: BLE001 - handed to the main thread
        ctx.error = ctx.error or e
        ctx.stop.requested = True


def _next_trial(ctx: _Ctx):
    """The next queued trial, or None to wait. Called under the context lock."""
    study = ctx.study
    optuna.storages.fail_stale_trials(study)  # a dead worker's trial is failed and re-queued (heartbeat)
    if ctx.sampler == "grid":
        waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
        if not waiting:
            if study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
                return None
            ctx.done |= _done_keys(ctx)
            order = [ctx.space.baseline] + [c for c in ctx.verdicts if c != ctx.space.baseline]
            _enqueue_missing(study, order, ctx.done)
            if not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):
                ctx.done |= {str(c) for c in order}  # nothing left anywhere
                return None
    trial = study.ask(fixed_distributions=ctx.dists)
    if ctx.sampler == "grid" and "fixed_params" not in ctx.storage.get_trial(trial._trial_id).system_attrs:
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)  # another host emptied the queue first
        return None
    ctx.storage.record_heartbeat(trial._trial_id)
    return trial


def _done_keys(ctx: _Ctx) -> set:
    with ctx.store.session() as s:
        return set(queries.done_configs(s, ctx.ids["study"]))


def _run_trial(ctx: _Ctx, worker: Worker, trial, env_id: int, band: float) -> None:
    cfg = KernelConfig.from_dict(trial.params)
    key = str(cfg)
    with ctx.lock:
        seen = key in ctx.done or key in _done_keys(ctx)
    if seen or not ctx.space.satisfies(cfg):
        ctx.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        return
    beat = _Heartbeat(ctx.storage, trial._trial_id)
    t0 = time.monotonic()
    try:
        result = _measure(
            worker,
            ctx.space,
            ctx.wl,
            ctx.conc,
            cfg,
            ctx.verdicts[cfg],
            trial.number,
            ctx.space.measurement["rounds"],
            True,
        )
    finally:
        beat.stop()
    result["wall_s"] = time.monotonic() - t0
    stat = _record(ctx, worker, env_id, cfg, result, band, trial.number)
    with ctx.lock:
        ctx.done.add(key)
        if stat is False:  # another worker or host recorded this config first
            ctx.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            return
        ctx.counts[result["verdict"]] += 1
        ctx.n_new += 1
        ctx.bar.update(1)
        ctx.bar.set_postfix_str(_postfix(ctx.store, ctx.ids["study"]), refresh=False)
    if result["verdict"] == "ok":
        ctx.study.tell(trial, stat.median_us)
    else:
        trial.set_user_attr("verdict", result["verdict"])
        ctx.study.tell(trial, state=optuna.trial.TrialState.PRUNED)


class _Heartbeat:
    """Records Optuna heartbeats for a running trial, so that a dead worker's trial is detected."""

    def __init__(self, storage, trial_id: int, interval_s: float = HEARTBEAT_S) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(storage, trial_id, interval_s), daemon=True)
        self._thread.start()

    def _run(self, storage, trial_id, interval_s) -> None:
        while not self._stop.wait(interval_s):
            try:
                storage.record_heartbeat(trial_id)
            except Exception:  # noqa: BLE001 - a missed beat only risks an early retry
                pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _noise_band(ctx: _Ctx, worker: Worker) -> tuple[int, float]:
    """This GPU's A/A band for the study (measured once per study, host and GPU; the gate runs too)."""
    host, gpu = worker.info["host"], worker.gpu_index
    with ctx.store.session() as s:
        env_id = queries.ensure_environment(s, worker.info).id
        row = s.query(NoiseModel).filter_by(study_id=ctx.ids["study"], host=host, gpu_index=gpu).one_or_none()
        if row is not None:
            return env_id, row.band
    base = ctx.space.baseline
    res = _measure(
        worker, ctx.space, ctx.wl, ctx.conc, base, ctx.verdicts[base], 0, ctx.space.measurement["rounds"], True
    )
    if res["verdict"] != "ok":
        raise TunerError(
            f"the baseline {base} is {res['verdict']} on {host} GPU {gpu}: {res.get('reason', '')}; "
            "candidates cannot be compared with it - pick another `baseline` in the search space"
        )
    a, b = zip(*res["samples"], strict=True)
    band = stats.noise_band(a, b, seed=gpu)
    with ctx.store.session() as s:
        try:
            with s.begin_nested():
                s.add(
                    NoiseModel(
                        study_id=ctx.ids["study"],
                        host=host,
                        gpu_index=gpu,
                        band=band,
                        n=len(a),
                        samples=json.dumps(res["samples"]),
                    )
                )
        except IntegrityError:
            pass
        study = s.get(StudyModel, ctx.ids["study"])
        study.noise_band = max(band, study.noise_band or 0.0)  # the study reports its widest GPU
        study.noise_n = len(a)
    return env_id, band


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


def _record(ctx: _Ctx, worker: Worker, env_id: int, cfg, result: dict, band: float, number: int):
    """Write the trial, its raw samples and its statistic in one transaction.

    Returns the statistic (None when not ok), or False when another worker already recorded this config.
    """
    verdict = ctx.verdicts[cfg]
    samples = result.get("samples") or []
    stat_row = None
    try:
        with ctx.store.session() as s, s.begin_nested():
            t = TrialModel(
                study_id=ctx.ids["study"],
                workload_id=ctx.ids["workload"],
                environment_id=env_id,
                kernel_id=ctx.ids["kernel"],
                concurrency=ctx.conc,
                backend=ctx.opts.backend,
                config_key=str(cfg),
                **cfg.as_dict(),
                num_splits=result.get("num_splits") or 0,
                is_baseline=cfg == ctx.space.baseline,
                verdict=result["verdict"],
                reason=result.get("reason") or (verdict.reason if verdict.feasible else ""),
                shared_bytes=verdict.shared_bytes,
                limit_bytes=verdict.limit_bytes,
                registers=verdict.registers,
                spill_bytes=verdict.spill_bytes,
                estimate_bytes=verdict.estimate_bytes,
                out_rel_err=result.get("out_rel_err"),
                lse_abs_err=result.get("lse_abs_err"),
                optuna_study=ctx.name,
                optuna_trial_number=number,
                wall_s=result.get("wall_s"),
            )
            s.add(t)
            s.flush()
            if samples:  # only an ok measurement has samples
                stat_row = _add_samples(s, t.id, "screen", result, worker.gpu_index, band, seed=number)
    except DatabaseError as e:
        if "UNIQUE" in str(e).upper() or "DUPLICATE" in str(e).upper():
            return False
        raise
    return stat_row


def _add_samples(s, trial_id: int, phase: str, result: dict, gpu_index: int, band: float, seed: int):
    """Every raw paired sample of one measurement, and its statistic (returned)."""
    for r, (c, b) in enumerate(result["samples"]):
        s.add(
            SampleModel(
                trial_id=trial_id,
                phase=phase,
                round=r,
                candidate_us=c,
                baseline_us=b,
                replays=result.get("replays", 1),
                gpu_index=gpu_index,
            )
        )
    c, b = zip(*result["samples"], strict=True)
    stat = _stat(trial_id, phase, stats.paired(c, b, seed=seed), band)
    s.add(stat)
    return stat


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


def _postfix(store, study_id) -> str:
    with store.session() as s:
        band = s.get(StudyModel, study_id).noise_band or 0.0
        rows = [t for t in queries.done_configs(s, study_id).values() if t.verdict == "ok" and t.statistic()]
        if not rows:
            return f"band ±{band * 100:.1f}%"
        b = min(rows, key=lambda t: t.statistic().median_us)
        return f"best {b.config_key} {b.statistic().median_us:.1f}µs, band ±{band * 100:.1f}%"


def _finalists(ctx: _Ctx, worker: Worker) -> None:
    """Re-measure the top ``finalists`` with ``finalist_rounds`` (on one GPU, against its own band)."""
    k, rounds = ctx.space.measurement["finalists"], ctx.space.measurement["finalist_rounds"]
    with ctx.store.session() as s:
        ok = [
            t for t in queries.done_configs(s, ctx.ids["study"]).values() if t.verdict == "ok" and t.statistic("screen")
        ]
        ok.sort(key=lambda t: t.statistic("screen").median_us)
        todo = [(t.id, KernelConfig.from_dict(t.config())) for t in ok[:k] if not t.statistic("finalist")]
        noise = (
            s.query(NoiseModel)
            .filter_by(study_id=ctx.ids["study"], host=worker.info["host"], gpu_index=worker.gpu_index)
            .one_or_none()
        )
        band = noise.band if noise else (s.get(StudyModel, ctx.ids["study"]).noise_band or 0.0)
    for trial_id, cfg in todo:
        res = _measure(worker, ctx.space, ctx.wl, ctx.conc, cfg, ctx.verdicts[cfg], trial_id, rounds, check=False)
        if res["verdict"] != "ok":
            continue
        try:
            with ctx.store.session() as s, s.begin_nested():
                _add_samples(s, trial_id, "finalist", res, worker.gpu_index, band, seed=trial_id)
        except DatabaseError:
            continue  # another host re-measured this finalist first


def _summary_row(store, study_id, workload, conc) -> dict:
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
