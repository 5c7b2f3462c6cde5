"""``tuner search``: every study of a space, one per (workload, concurrency) on this device and backend.

Per workload: the feasibility verdicts for the target arch (compile only), then on a GPU a parallel
warm-up compile of the feasible configs; then one :class:`tuner.study.StudyRun` per concurrency
level, in the space's order, all with one strategy object (:mod:`tuner.strategies`), so a model-based
strategy carries what each level taught it to the next. Measurement processes (one per GPU, or N
interpreter processes) are started once and shared by every study.

The strategy is ``--sampler``, else the space file's ``sampler: {name: ...}``, else the default
(:data:`tuner.strategies.DEFAULT`).
"""

from __future__ import annotations

import os
import signal
import time
import warnings
from dataclasses import dataclass
from dataclasses import field

import click
import optuna
import sqlalchemy.exc

from . import strategies
from .errors import TunerError
from .feasibility import BackgroundWarm
from .feasibility import check_many
from .heartbeat import HEARTBEAT_S
from .heartbeat import grace_s
from .measure import MeasurementProcess
from .progress import Progress
from .recorder import SpaceHistory
from .space import SearchSpace
from .study import StudyPlan
from .study import StudyRun


@dataclass
class Options:
    backend: str
    sampler: str | None = None
    n_trials: int | None = None
    first: list = field(default_factory=list)  # KernelConfigs measured first at every level (--first)
    timeout_s: float | None = None
    concurrency: list[int] | None = None
    remeasure: bool = False
    redo: bool = False  # search finished levels again (default: a finished level shows its stored row)
    quiet: bool = False
    workers: int | None = None  # measurement processes
    replay_db: str | None = None  # the replay backend's source database
    replay_device: str | None = None
    replay_kernel: str | None = None  # whose samples the replay backend draws (default: the newest kernel)
    replay_queue: str = "memory"  # where the replay backend keeps Optuna's queue: memory | database
    seed: int = 0  # seeds the strategy and the replay backend's draws
    refit: str | None = None  # when re-fitted hyperparameters swap in (strategies.make; default: see make_strategy)
    strategy_options: dict = field(default_factory=dict)  # the strategy's options, over the space file's (benchmarks)
    replay_source: object | None = None  # a ReplaySource to draw from instead of opening replay_db (benchmarks)
    replay_speeds: list[float] | None = None  # replay: simulated GPUs' speeds (default: --workers GPUs of speed 1)
    simulated: object | None = None  # set by run_search when replaying on simulated GPUs: its SimulatedGPUs
    record_kernel: str | None = None  # the kernel hash the search records under (default: this code's)
    interrupted: bool = False  # set by run_search: Ctrl-C or SIGTERM stopped it (the CLI then exits 128 + signal)
    stop_signal: int = 0  # set by run_search: which signal (SIGINT 2: exit 130; SIGTERM 15: exit 143)


class Stop:
    """Ctrl-C or SIGTERM: finish the running trial, then stop (a second one aborts at once)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.requested = False
        self.signalled = False  # a signal, as opposed to a worker's error asking the others to stop
        self.signum = 0  # the first signal that asked (the CLI exits with 128 + it)
        self._old: dict = {}  # the handlers this one replaced, restored on exit

    def __enter__(self):
        self._old = {s: signal.signal(s, self._handler) for s in self.SIGNALS}
        return self

    def _handler(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = self.signalled = True
        self.signum = signum
        what = "interrupt" if signum == signal.SIGINT else signal.Signals(signum).name
        click.echo(f"\n{what}: stopping after the current trial (Ctrl-C again to abort now)", err=True)

    def __exit__(self, *exc):
        for s, old in self._old.items():
            signal.signal(s, old)
        return False


def _quiet_optuna() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # we record heartbeats ourselves around each measurement (ask/tell, not Study.optimize)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)  # heartbeat API


def _storage(url: str) -> optuna.storages.RDBStorage:
    _quiet_optuna()
    sqlite = sqlalchemy.engine.make_url(url).get_backend_name() == "sqlite"
    # SQLite: the driver's own BEGIN comes only before a write, so Optuna's read-then-write of a queued trial
    # (``ask`` takes the first WAITING trial and sets it RUNNING) let two processes take the same trial, and one
    # of them failed telling it; every transaction of Optuna's is BEGIN IMMEDIATE instead (see _serialized)
    kwargs = {"connect_args": {"timeout": 60, "isolation_level": None}} if sqlite else {}
    for attempt in range(5):
        try:
            storage = optuna.storages.RDBStorage(
                url,
                engine_kwargs=kwargs,
                heartbeat_interval=HEARTBEAT_S,
                grace_period=grace_s(),
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=3),
            )
            break
        except (
            sqlalchemy.exc.IntegrityError,
            sqlalchemy.exc.OperationalError,
            sqlalchemy.exc.ProgrammingError,
            optuna.exceptions.StorageInternalError,
        ) as e:
            # another process created Optuna's tables at the same moment; they exist now (PostgreSQL says so of
            # Optuna's enum types as a ProgrammingError: type "studydirection" already exists)
            duplicate = not isinstance(e, sqlalchemy.exc.ProgrammingError) or "already exists" in str(e)
            if attempt == 4 or not duplicate:
                raise
            time.sleep(0.5 * (attempt + 1))
    if sqlite:
        _serialized(storage.engine)
    return storage


def _serialized(engine) -> None:
    """Every transaction on ``engine`` (a SQLite one whose driver issues no BEGIN of its own) starts with BEGIN
    IMMEDIATE: it holds the write lock from its first read, so no two processes act on the same read."""

    @sqlalchemy.event.listens_for(engine, "begin")
    def _begin(con):
        con.exec_driver_sql("BEGIN IMMEDIATE")

    @sqlalchemy.event.listens_for(engine, "connect")
    def _connect(dbapi_con, _record):  # as the results store's own connections (db/store.py): WAL, no fsync per commit
        dbapi_con.execute("PRAGMA synchronous=NORMAL")

    engine.dispose()  # the connection Optuna opened to create its tables is replaced by one with the pragma


def make_strategy(space: SearchSpace, opts: Options) -> strategies.Strategy:
    """The strategy of a workload's studies: ``opts.sampler``, else the space's, else the default, seeded by the
    space's seed plus ``opts.seed``, with the space's ``sampler:`` options (when it names that strategy) and
    ``opts.strategy_options``. Its re-fits are ``opts.refit``, else deterministic when replaying (a seed
    repeats the search) and in the background on a GPU (the search never waits for the model)."""
    sampler = opts.sampler or space.sampler.get("name") or strategies.DEFAULT
    refit = opts.refit or ("deterministic" if opts.backend == "replay" else "background")
    # the space's options are its own strategy's (a --sampler of another strategy leaves them), then opts'
    given = dict(space.sampler.get("options", {})) if sampler == space.sampler.get("name") else {}
    given.update(opts.strategy_options)
    return strategies.make(sampler, space.sampler.get("seed", 0) + opts.seed, refit, **given)


def run_search(space: SearchSpace, store, opts: Options, strategy: strategies.Strategy | None = None) -> list[dict]:
    """Run (or resume, or join) every study of ``space``; one summary row per workload x concurrency. Every
    study uses ``strategy`` when given (a caller that reads its timings), else one made per workload."""
    levels = opts.concurrency or space.concurrency
    unknown = [c for c in levels if c not in space.concurrency]
    if unknown:
        raise TunerError(f"--concurrency {unknown} not in {space.path}'s concurrency list {space.concurrency}")
    source, storage = _source_and_storage(opts, store, space.adapter)
    processes = start_processes(opts, source, space.adapter.spec)
    if opts.backend == "interpreter":
        click.echo(
            "no CUDA GPU: using the interpreter backend (kernel under TRITON_INTERPRET=1, wall-clock "
            "timing); its timings are not GPU timings",
            err=True,
        )
    summary = []
    background: list = []  # (workload, configs, BackgroundWarm) of each workload's compile for this GPU
    t_start = time.monotonic()
    try:
        with Stop() as stop, Progress(opts.quiet, total_studies=len(space.workloads) * len(levels)) as progress:
            for spec in space.workloads:
                wl = spec.workload()
                t0 = time.perf_counter()
                verdicts = _feasibility(space, spec.name, wl, levels, source, store, opts, progress)
                feasible = [c for c, v in verdicts.items() if v.feasible]
                sampler = opts.sampler or space.sampler.get("name") or strategies.DEFAULT
                level_strategy = strategy if strategy is not None else make_strategy(space, opts)
                if opts.backend == "cuda":  # the first level measures meanwhile (see BackgroundWarm)
                    cc = int(processes[0].info["compute_capability"].replace(".", ""))
                    background.append(
                        (spec.name, len(feasible), BackgroundWarm(feasible, wl, cc, adapter=space.adapter))
                    )
                    progress.message(f"{spec.name}: compiling {len(feasible)} feasible configs in the background")
                compile_s = time.perf_counter() - t0  # counted in this workload's first level's row
                shares: list[float] = []  # the share of launches each finished level measured (the ETA's guess)
                history = SpaceHistory()  # the workload's recorded trials, read whole once, then what each level added
                for conc in levels:
                    if stop.requested or (opts.timeout_s and time.monotonic() - t_start > opts.timeout_s):
                        break
                    plan = StudyPlan(space, spec, wl, conc, verdicts, sampler)
                    run = StudyRun(
                        plan, store, storage, processes, opts, stop, t_start, progress, level_strategy, history
                    )
                    run.candidates.expected_share = sum(shares) / len(shares) if shares else None
                    row = run.run()
                    queue = run.candidates.queue_order  # empty at a level finished earlier
                    if row.get("stopped") and queue and row["stopped"] != "interrupted":
                        shares.append(run.candidates.n_measured / len(queue))
                    row["compile_s"] = round(row.get("compile_s", 0.0) + compile_s, 3)
                    row["wall_s"] = round(row.get("wall_s", 0.0) + compile_s, 3)
                    compile_s = 0.0
                    summary.append(row)
                    _report_warm(background, progress)
            opts.interrupted, opts.stop_signal = stop.signalled, stop.signum
    finally:
        for _, _, bg in background:
            bg.close()
        for p in processes:
            p.close()
    return summary


def _report_warm(background: list, progress) -> None:
    """Say once when a background compile has finished (and how long it took)."""
    for item in list(background):
        name, n, bg = item
        if bg.done() and bg.seconds is not None:
            progress.message(f"{name}: compiled {n} feasible configs in {bg.seconds:.0f} s (in the background)")
            background.remove(item)


def _source_and_storage(opts: Options, store, adapter) -> tuple:
    """The replay source (``None`` unless ``--backend replay``: ``adapter``'s recordings) and Optuna's storage for
    this run."""
    from ..db.store import check_optuna_schema

    _quiet_optuna()
    if opts.backend != "replay":
        check_optuna_schema(store.engine, store.shown_url)
        return None, _storage(store.url)
    from .replay import ReplaySource

    if not opts.replay_db and opts.replay_source is None:
        raise TunerError("--backend replay needs --replay-db URL (the database whose samples are replayed)")
    # by default one process replays alone: Optuna's queue lives in memory (the results go to the database);
    # `--replay-queue database` keeps it in the results database as a GPU search does, so several replaying
    # processes share each study's queue and a resumed one continues the trials a killed one left
    source = opts.replay_source
    if source is None:
        source = ReplaySource(opts.replay_db, opts.replay_device, opts.replay_kernel, adapter)
    if opts.replay_queue == "database":
        check_optuna_schema(store.engine, store.shown_url)
        return source, _storage(store.url)
    return source, optuna.storages.InMemoryStorage()


def _feasibility(space: SearchSpace, name: str, wl, levels, source, store, opts: Options, progress) -> dict:
    """Every config's feasibility verdict for one workload: compiled for the target (cached in the
    database), or, when replaying, the verdicts recorded with the samples. Unless the space sets
    ``max_spill_bytes`` (spills decide), only shared memory decides, so each compile stops after Triton's
    shared-memory allocation, before LLVM and ptxas: a third of a full compile or less (the target's registers and
    spills are `tuner check`'s, and a search reuses them where `tuner check` cached them)."""
    configs = space.configs()
    if source is not None:
        checked = source.feasibility(configs, wl, levels)
    else:
        with progress.compiling(f"{name}: feasibility for {space.target}") as task:
            checked = check_many(
                configs,
                wl,
                space.target,
                max_spill_bytes=space.max_spill_bytes,
                enforce_device=opts.backend == "cuda",
                store=store,
                on_progress=task,
                registers=space.max_spill_bytes is not None,
                adapter=space.adapter,
            )
    return dict(zip(configs, checked, strict=True))


def start_processes(opts: Options, source=None, kernel: str | None = None) -> list:
    """One measurement process per GPU (pinned with CUDA_VISIBLE_DEVICES), N interpreter processes, or
    the replay backend's stand-in; ``kernel``: the adapter they measure (:attr:`KernelAdapter.spec`)."""
    n = opts.workers
    if source is not None:
        from .replay import ReplayProcess
        from .replay import SimulatedGPUs

        speeds = opts.replay_speeds or ([1.0] * n if n and n > 1 else None)
        if speeds is None:
            return [ReplayProcess(source)]
        gpus = opts.simulated = SimulatedGPUs(speeds)
        return [ReplayProcess(source, i, gpus) for i in range(gpus.n)]
    if opts.backend == "cuda":
        import torch

        visible = torch.cuda.device_count()
        n = n or visible
        if n > visible:
            raise TunerError(f"--workers {n} needs {n} GPUs; {visible} are visible")
        processes = [
            MeasurementProcess("cuda", {"CUDA_VISIBLE_DEVICES": _visible_device(i)}, gpu_index=i, kernel=kernel)
            for i in range(n)
        ]
    else:
        processes = [MeasurementProcess("interpreter", gpu_index=i, kernel=kernel) for i in range(n or 1)]
    for p in processes:
        p.start()
    return processes


def _visible_device(i: int) -> str:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible.split(",")[i] if visible else str(i)
