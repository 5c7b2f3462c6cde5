"""The ``tuner`` command line: one command per action; data on stdout, messages on stderr."""

from __future__ import annotations

import functools
import os
import sys

import click

from db.errors import DatabaseError
from db.verdicts import Phase
from db.verdicts import Verdict
from kernels.config import PARAM_NAMES
from kernels.config import KernelConfig
from tuner import __version__
from tuner.errors import TunerError
from tuner.output import format_option
from tuner.output import render

CHECK_FIELDS = PARAM_NAMES + (
    "shared_bytes",
    "limit_bytes",
    "registers",
    "spill_bytes",
    "estimate_bytes",
    "feasible",
    "reason",
)


def expected_errors(fn):
    """Expected failures become one sentence on stderr and exit status 2, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (TunerError, DatabaseError) as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)
        except KeyboardInterrupt:  # a second Ctrl-C: what was recorded stays recorded
            click.echo("interrupted", err=True)
            sys.exit(130)

    return wrapper


db_option = click.option(
    "--db",
    "db_url",
    default=lambda: os.environ.get("TUNER_DB", "sqlite:///tuner.db"),
    show_default="sqlite:///tuner.db or $TUNER_DB",
    help="Results database URL (SQLAlchemy).",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tuner")
def cli() -> None:
    """Autotuner for the sparse-MLA decode kernel (DeepSeek V3.2 / V4 FP8 KV caches)."""


@cli.command()
@click.argument("space_file", type=click.Path(dir_okay=False))
@click.option("--target", default=None, help="Arch whose limits apply (default: the space's `target`).")
@click.option("--workload", "workload_name", default=None, help="Only this workload of the space.")
@click.option("--all", "show_all", is_flag=True, help="One row per config, not one per compiled binary.")
@click.option("-q", "--quiet", is_flag=True, help="No progress on stderr.")
@format_option
@db_option
@expected_errors
def check(
    space_file: str, target: str | None, workload_name: str | None, show_all: bool, quiet: bool, fmt: str, db_url: str
) -> None:
    """Which configs of SPACE_FILE fit the target arch, and why not. Compiles only; needs no GPU.

    One row per compiled binary x workload: configs that differ only in launch-only parameters
    (TARGET_CTAS) compile to the same binary and share a row, whose launch-only columns list their
    values (json: a list). --all: one row per config. Verdicts are cached, so a second check is
    fast. With several workloads, json/csv rows also carry a `workload` field.
    """
    from db.store import Store
    from kernels.config import PARAMS
    from tuner.feasibility import check_many
    from tuner.progress import Progress
    from tuner.space import TARGETS
    from tuner.space import load_space

    space = load_space(space_file)
    store = Store(db_url)
    target = target or space.target
    if target not in TARGETS:
        raise TunerError(f"--target must be one of {sorted(TARGETS)}, got {target!r}")
    workloads = [w for w in space.workloads if workload_name in (None, w.name)]
    if not workloads:
        raise TunerError(
            f"--workload {workload_name!r} is not in {space.path}; it has {[w.name for w in space.workloads]}"
        )
    configs = space.configs()
    launch_only = [p.name for p in PARAMS if not p.compiled]
    fields = (("workload",) if len(workloads) > 1 else ()) + CHECK_FIELDS
    rows, n_ok = [], 0
    progress = Progress(quiet)
    for w in workloads:
        name = f"{space.name}/{w.name}"
        progress.message(f"{name}: checking {len(configs)} configs for {target}")
        with progress.compiling(name) as task:
            verdicts = check_many(
                configs, w.workload(), target, max_spill_bytes=space.max_spill_bytes, store=store, on_progress=task
            )
        groups: dict[tuple, list] = {}  # compile key -> [(config, verdict)]; one config each with --all
        for cfg, v in zip(configs, verdicts, strict=True):
            groups.setdefault(cfg if show_all else cfg.compile_key(), []).append((cfg, v))
            n_ok += v.feasible
        for members in groups.values():
            cfg, v = members[0]  # one binary: the same numbers for every member
            row = {"workload": w.name, **cfg.as_dict(), **v.as_dict()}
            if not show_all:
                for p in launch_only:
                    values = list(dict.fromkeys(getattr(c, p) for c, _ in members))
                    row[p] = values if fmt == "json" else ",".join(map(str, values))
            rows.append({k: row[k] for k in fields})
    if not show_all and len(rows) < len(configs) * len(workloads):
        progress.message(
            f"{len(configs) * len(workloads)} configs in {len(rows)} rows, one per compiled binary "
            f"(launch only: {', '.join(launch_only)}); --all lists every config"
        )
    click.echo(render(rows, fmt))
    summary = f"{n_ok} feasible / {len(configs) * len(workloads) - n_ok} infeasible for {target}"
    click.echo(summary, err=fmt != "table")


def _backend(requested: str | None) -> str:
    if requested:
        return requested
    import torch

    return "cuda" if torch.cuda.is_available() else "interpreter"


@cli.command()
@click.argument("space_file", type=click.Path(dir_okay=False))
@click.option(
    "--backend",
    type=click.Choice(["cuda", "interpreter", "replay"]),
    default=None,
    help="Default: cuda when a GPU is present, else the interpreter. replay: draw from --replay-db's samples.",
)
@click.option("--replay-db", default=None, help="replay backend: the database whose recorded samples are replayed.")
@click.option("--replay-device", default=None, help="replay backend: the GPU name to replay when it holds several.")
@click.option(
    "--sampler",
    type=click.Choice(["grid", "tpe"]),
    default=None,
    help="Default: the space's; grid when <= 300 feasible configs, else TPE.",
)
@click.option(
    "--n-trials",
    type=click.IntRange(min=1),
    default=None,
    help="At most this many trials per study, counting those a previous run measured (a resumed search adds the rest).",
)
@click.option(
    "--first",
    "first",
    default=None,
    help="Configs to measure first at every level, before the sampler's own picks, "
    "e.g. T32-w4-s1-c768-p2,T16-w4-s2-c256.",
)
@click.option(
    "--timeout", "timeout_s", type=click.FloatRange(min=0), default=None, help="Stop after this many seconds."
)
@click.option("--concurrency", "concurrency", default=None, help="A subset of the space's levels, e.g. 1,96.")
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="Measurement workers sharing each study: default one per visible GPU, 1 on the CPU.",
)
@click.option("--remeasure", is_flag=True, help="Measure again configs that already have results (kept).")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
@format_option
@db_option
@expected_errors
def search(
    space_file,
    backend,
    replay_db,
    replay_device,
    sampler,
    n_trials,
    first,
    timeout_s,
    concurrency,
    workers,
    remeasure,
    quiet,
    fmt,
    db_url,
):
    """Tune every workload x concurrency level of SPACE_FILE; every sample goes to the database.

    Re-running resumes: configs already measured for this kernel and environment are skipped.
    Ctrl-C stops after the running trial.
    """
    from db.store import Store
    from tuner.search import Options
    from tuner.search import run_search
    from tuner.space import load_space

    space = load_space(space_file)
    levels = _levels(concurrency)
    first_configs = _first_configs(first, space)
    if replay_db and backend != "replay":
        raise TunerError("--replay-db needs --backend replay")
    store = Store(db_url)
    opts = Options(
        backend=_backend(backend),
        sampler=sampler,
        n_trials=n_trials,
        first=first_configs,
        timeout_s=timeout_s,
        concurrency=levels,
        workers=workers,
        remeasure=remeasure,
        quiet=quiet,
        replay_db=replay_db,
        replay_device=replay_device,
    )
    rows = run_search(space, store, opts)
    if fmt == "table":
        click.echo(f"search {space.name} ({opts.backend}), results in {store.shown_url}:", err=True)
    click.echo(render(rows, fmt))
    if opts.interrupted:
        sys.exit(130)  # Ctrl-C: every finished trial is recorded; re-running resumes


def _first_configs(text: str | None, space) -> list:
    """``--first``: config keys of the space, in the order given."""
    from kernels import KernelConfig

    if not text:
        return []
    configs, allowed = [], set(space.configs())
    for key in text.split(","):
        try:
            cfg = KernelConfig.parse(key.strip())
        except ValueError as e:
            raise TunerError(f"--first: {e}") from None
        if cfg not in allowed:
            raise TunerError(
                f"--first: {cfg} is not a config of {space.path} (its parameter values and constraints allow "
                f"{len(allowed)} configs, e.g. {space.baseline})"
            )
        configs.append(cfg)
    return configs


def _levels(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(c) for c in text.split(",")]
    except ValueError:
        raise TunerError(f"--concurrency must be a comma list of integers, got {text!r}") from None


@cli.command()
@click.argument("space_file", type=click.Path(dir_okay=False))
@click.option("--workload", "workload_name", default=None, help="Only this workload of the space.")
@click.option("--concurrency", default=None, help="Levels to calibrate, e.g. 1,96 (default: every level).")
@click.option("--pairs", type=click.IntRange(min=3), default=30, show_default=True, help="Independent capture pairs.")
@click.option("--backend", type=click.Choice(["cuda", "interpreter"]), default=None)
@format_option
@db_option
@expected_errors
def calibrate(space_file, workload_name, concurrency, pairs, backend, fmt, db_url):
    """Measure this GPU's A/A noise: the baseline against itself, independent captures and inputs.

    Prints the spread between captures, the band verdicts use (the larger of the spread and the
    space's min_effect), the smallest effect the configured rounds detect, and how often the current
    policy calls an A/A trial non-flat. `tuner search` uses the latest calibration of the same
    environment, workload and concurrency.
    """
    from db.store import Store
    from tuner import calibrate as cal
    from tuner.search import Options
    from tuner.search import start_processes
    from tuner.space import load_space

    space = load_space(space_file)
    workloads = [w for w in space.workloads if workload_name in (None, w.name)]
    if not workloads:
        raise TunerError(
            f"--workload {workload_name!r} is not in {space.path}; it has {[w.name for w in space.workloads]}"
        )
    levels = _levels(concurrency) or space.concurrency
    store = Store(db_url)
    processes = start_processes(Options(backend=_backend(backend)))
    try:
        rows = cal.run(space, store, _backend(backend), workloads, levels, pairs, processes)
    finally:
        for p in processes:
            p.close()
    click.echo(render(rows, fmt))


def _best_row(t) -> dict:
    st = t.statistic()
    env = t.environment
    row = {
        "trial": t.id,
        **t.config().as_dict(),
        "median_us": round(st.median_us, 3),
        "ci_low_us": round(st.ci_low_us, 3),
        "ci_high_us": round(st.ci_high_us, 3),
        "ratio": round(st.ratio, 4),
        "ratio_ci_low": round(st.ratio_ci_low, 4),
        "ratio_ci_high": round(st.ratio_ci_high, 4),
        "verdict": st.classification,
        "noise_band": round(st.noise_band, 4),
        "n": st.n,
        "phase": st.phase,
    }
    from kernels.workload import Workload

    wl = t.workload
    nbytes = Workload(wl.kv_format, wl.heads, wl.topk, wl.page_size, wl.context).min_bytes(t.concurrency)
    gbps = nbytes / (st.median_us * 1e-6) / 1e9
    row["GBps"] = round(gbps, 1) if t.backend == "cuda" else None
    row["pct_copy_bw"] = round(100 * gbps / env.copy_gbps, 1) if (env.copy_gbps and t.backend == "cuda") else None
    row.update(
        space=t.study.space.name,
        workload=wl.name,
        concurrency=t.concurrency,
        device=env.gpu_name,
        backend=t.backend,
        trial=t.id,
        date=t.created_at.strftime("%Y-%m-%d %H:%M"),
    )
    return row


@cli.command()
@click.option("--concurrency", type=click.IntRange(min=1), required=True, help="Batch size (concurrency level).")
@click.option("--space", default=None)
@click.option("--workload", default=None)
@click.option("--device", default=None, help="GPU name as stored, e.g. 'NVIDIA H200'.")
@click.option("--backend", type=click.Choice(["cuda", "interpreter"]), default=None)
@format_option
@db_option
@expected_errors
def best(concurrency, space, workload, device, backend, fmt, db_url):
    """The best `ok` config at a concurrency, with its CI, ratio to baseline and noise verdict."""
    from db import queries
    from db.store import Store

    store = Store(db_url, readonly=True)
    with store.session() as s:
        found = queries.best(s, concurrency, space=space, workload=workload, device=device, backend=backend)
        rows = [
            {**_best_row(t), "tied_with": " ".join(x.config_key for x in queries.tied(s, t) if x.id != t.id)}
            for t in found
        ]
    if not rows:
        raise TunerError(f"no ok result at concurrency {concurrency} in {store.shown_url} (run `tuner search` first)")
    if len(rows) > 1:
        click.echo(
            f"{len(rows)} matches (one per space/workload/device/backend); narrow with --space, --workload, "
            "--device or --backend",
            err=True,
        )
    click.echo(render(rows, fmt))


@cli.command()
@click.option("--concurrency", type=click.IntRange(min=1), default=None)
@click.option("--verdict", type=click.Choice([v.value for v in Verdict] + ["all"]), default="all")
@click.option("--space", default=None)
@click.option("--sort", type=click.Choice(["id", "median_us", "config"]), default="id")
@format_option
@db_option
@expected_errors
def trials(concurrency, verdict, space, sort, fmt, db_url):
    """Every trial: config, verdict, reason, feasibility numbers, median and ratio."""
    from db import queries
    from db.store import Store

    store = Store(db_url, readonly=True)
    with store.session() as s:
        rows = []
        for t in queries.trials(s, concurrency=concurrency, verdict=verdict, space=space):
            st = t.evidence().statistic()  # a duplicate shows its original's numbers
            rows.append(
                {
                    "trial": t.id,
                    "space": t.study.space.name,
                    "C": t.concurrency,
                    **t.config().as_dict(),
                    "verdict": t.verdict,
                    "duplicate_of": t.duplicate_of,
                    "median_us": round(st.median_us, 3) if st else None,
                    "ratio": round(st.ratio, 4) if st else None,
                    "effect": st.classification if st else None,
                    "shared_bytes": t.shared_bytes,
                    "registers": t.registers,
                    "reason": t.reason,
                }
            )
    key = {
        "id": lambda r: r["trial"],
        "config": lambda r: tuple(r[p] for p in PARAM_NAMES),
        "median_us": lambda r: (r["median_us"] is None, r["median_us"] or 0),
    }[sort]
    rows.sort(key=key)
    if not rows:
        click.echo("no trials match", err=True)
    click.echo(render(rows, fmt))


@cli.command()
@click.option(
    "--out",
    "out_dir",
    type=click.Path(),
    default=None,
    help="engine/sglang: directory for the tables (default: kernels/configs/ of the package); "
    "triton: the .py file to write (default stdout).",
)
@click.option(
    "--format",
    "export_format",
    type=click.Choice(["engine", "sglang", "triton"]),
    default="engine",
    help="engine: flat JSON tables {batch: config} the kernel reads, with a provenance sidecar; "
    "sglang: the same in a triton_<version>/ folder; triton: an importable list of triton.Config.",
)
@click.option("--backend", type=click.Choice(["cuda", "interpreter"]), default=None)
@click.option(
    "--record",
    is_flag=True,
    help="Also record each table written in the database's tuner_exports (without it the database is only read).",
)
@db_option
@expected_errors
def export(out_dir, export_format, backend, record, db_url):
    """Write the kernel's autotune tables: the best ok config per concurrency, per device and workload."""
    from db.store import Store
    from tuner.export import export_tables
    from tuner.export import triton_module

    store = Store(db_url, create=False) if record and export_format != "triton" else Store(db_url, readonly=True)
    if export_format == "triton":
        text = triton_module(store, backend)
        if out_dir is None:
            click.echo(text, nl=False)
            return
        try:
            with open(out_dir, "w") as f:
                f.write(text)
        except OSError as e:
            raise TunerError(f"cannot write {out_dir}: {e.strerror}") from None
        click.echo(out_dir)
        return
    try:
        paths = export_tables(store, out_dir, backend, export_format, record=record)
    except OSError as e:
        raise TunerError(f"cannot write {e.filename or out_dir}: {e.strerror}") from None
    for path in paths:
        click.echo(str(path))


@cli.command()
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write here (default stdout).")
@click.option("--plots", "plots_dir", type=click.Path(file_okay=False), default=None, help="Write PNG plots here.")
@db_option
@expected_errors
def report(output, plots_dir, db_url):
    """The A/B report: noise band, best per concurrency, each lever's effect, dead ends, infeasible configs."""
    import os.path

    from db.store import Store
    from tuner.report import render_report

    prefix = ""
    if plots_dir and output:
        prefix = os.path.relpath(plots_dir, os.path.dirname(os.path.abspath(output)) or ".") + "/"
    try:
        text = render_report(Store(db_url, readonly=True), plots_dir, prefix)
    except OSError as e:
        raise TunerError(f"cannot write {e.filename or plots_dir}: {e.strerror}") from None
    if output:
        try:
            with open(output, "w") as f:
                f.write(text)
        except OSError as e:
            raise TunerError(f"cannot write {output}: {e.strerror}") from None
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text)


@cli.command()
@click.argument("trial_id", type=int)
@format_option
@db_option
@expected_errors
def show(trial_id, fmt, db_url):
    """Everything about one trial, raw samples included."""
    from db.models import TrialModel
    from db.store import Store

    store = Store(db_url, readonly=True)
    with store.session() as s:
        t = s.get(TrialModel, trial_id)
        if t is None:
            raise TunerError(f"no trial {trial_id} in {store.shown_url} (see `tuner trials`)")
        info = {c.name: getattr(t, c.name) for c in TrialModel.__table__.columns}
        info["created_at"] = str(info["created_at"])
        info.update(
            space=t.study.space.name,
            workload=t.workload.name,
            device=t.environment.gpu_name,
            noise_band=t.study.noise_band,
            kernel_hash=t.study.kernel.source_hash,
        )
        stats_rows = [{c.name: getattr(st, c.name) for c in st.__table__.columns} for st in t.statistics]
        samples = [
            {
                "phase": x.phase,
                "round": x.round,
                "candidate_us": x.candidate_us,
                "baseline_us": x.baseline_us,
                "replays": x.replays,
                "gpu_index": x.gpu_index,
            }
            for x in t.samples
        ]
    if fmt == "json":
        import json

        click.echo(json.dumps({**info, "statistics": stats_rows, "samples": samples}, indent=1, default=str))
        return
    if fmt == "csv":
        click.echo(render(samples, "csv"))
        return
    click.echo(render([{"field": k, "value": v} for k, v in info.items()], "table"))
    click.echo("")
    click.echo(render(stats_rows, "table"))
    click.echo("")
    click.echo(render(samples, "table"))


@cli.command()
@click.argument("config_a")
@click.argument("config_b")
@click.option("--space", default=None)
@format_option
@db_option
@expected_errors
def compare(config_a, config_b, space, fmt, db_url):
    """CONFIG_A against CONFIG_B (e.g. T16-w4-s2-c512 T16-w4-s2-c256) at every concurrency both have."""
    from db import queries
    from db.store import Store
    from tuner import stats

    config_a, config_b = (str(_parse_config(c)) for c in (config_a, config_b))
    store = Store(db_url, readonly=True)
    rows = []
    with store.session() as s:
        by_study = {}
        for t in queries.trials(s, space=space, verdict=Verdict.OK):
            if t.config_key in (config_a, config_b):
                by_study.setdefault(t.study_id, {})[t.config_key] = t
        for pair in by_study.values():
            if len(pair) < 2:
                continue
            a, b = pair[config_a], pair[config_b]
            ra = [x.candidate_us / x.baseline_us for x in a.samples if x.phase == Phase.SCREEN]
            rb = [x.candidate_us / x.baseline_us for x in b.samples if x.phase == Phase.SCREEN]
            r, lo, hi = stats.ratio_of_ratios(ra, rb, seed=a.id)
            band = a.study.noise_band or 0.0
            verdict = "A faster" if hi < 1 - band else "A slower" if lo > 1 + band else "flat"
            rows.append(
                {
                    "space": a.study.space.name,
                    "workload": a.workload.name,
                    "device": a.environment.gpu_name,
                    "C": a.concurrency,
                    "A_us": round(a.statistic().median_us, 3),
                    "B_us": round(b.statistic().median_us, 3),
                    "A/B": round(r, 4),
                    "ci_low": round(lo, 4),
                    "ci_high": round(hi, 4),
                    "noise_band": round(band, 4),
                    "verdict": verdict,
                }
            )
    if not rows:
        raise TunerError(f"no study in {store.shown_url} has ok results for both {config_a} and {config_b}")
    rows.sort(key=lambda r: (r["space"], r["workload"], r["device"], r["C"]))
    click.echo(render(rows, fmt))


def _parse_config(text: str) -> KernelConfig:
    try:
        return KernelConfig.parse(text)
    except ValueError as e:
        raise TunerError(str(e)) from None


@cli.command()
@format_option
@db_option
@expected_errors
def studies(fmt, db_url):
    """Every study: space, workload, concurrency, device, backend, noise band and trial counts."""
    from sqlalchemy import select

    from db import queries
    from db.models import StudyModel
    from db.store import Store

    store = Store(db_url, readonly=True)
    rows = []
    with store.session() as s:
        for st in s.scalars(select(StudyModel).order_by(StudyModel.id)):
            ts = list(queries.done_configs(s, st.id).values())
            rows.append(
                {
                    "study": st.name,
                    "space": st.space.name,
                    "workload": st.workload.name,
                    "C": st.concurrency,
                    "device": st.environment.gpu_name,
                    "backend": st.backend,
                    "noise_band": round(st.noise_band, 4) if st.noise_band is not None else None,
                    "trials": len(ts),
                    "ok": sum(t.verdict == Verdict.OK for t in ts),
                    "kernel": st.kernel.source_hash,
                }
            )
    if not rows:
        click.echo(f"no studies in {store.shown_url}", err=True)
    click.echo(render(rows, fmt))


@cli.group()
def db() -> None:
    """The results database."""


@db.command()
@db_option
@expected_errors
def upgrade(db_url):
    """Migrate an older results database to the current schema (nothing is dropped)."""
    from db.store import Store
    from db.store import head_revision

    store = Store(db_url, upgrade=True, create=False)
    click.echo(f"{store.shown_url} is at schema {store.revision()} (head {head_revision()})", err=True)


def main() -> None:
    """Usage errors too are one line (click's default prints the usage block first)."""
    try:
        rv = cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        click.echo(f"error: {e.format_message()} (see `tuner --help`)".replace("\n", " "), err=True)
        sys.exit(e.exit_code)
    sys.exit(rv if isinstance(rv, int) else 0)
