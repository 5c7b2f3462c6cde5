"""The ``tuner`` command line: one command per action; data on stdout, messages on stderr."""

from __future__ import annotations

import functools
import math
import os
import re
import sys
from pathlib import Path

import click

from ..db.errors import QUOTE_MAX
from ..db.errors import DatabaseError
from ..db.errors import quote
from ..db.verdicts import Phase
from ..db.verdicts import Verdict
from . import __version__
from .errors import TunerError
from .output import format_option
from .output import pct
from .output import render
from .output import varying

VERDICT_FIELDS = (  # a check row's fields after the config's parameters
    "shared_bytes",
    "limit_bytes",
    "registers",
    "spill_bytes",
    "estimate_bytes",
    "feasible",
    "reason",
)
# A kernel's adapter (the built-in one included) is loaded by the commands that use it, never at
# import, and reached through tuner/adapter.py alone: `--help`,
# `--version`, a completion and a bad option's error load no kernel, torch or Triton (tests/test_architecture.py).

INT64_MAX = 2**63 - 1  # SQLite's INTEGER and PostgreSQL's BIGINT: the largest integer the database stores
LONG_TOKEN = re.compile(rf"\S{{{QUOTE_MAX + 50},}}")  # longer than what quote() leaves
MESSAGE_MAX = 1000


def one_line(text: str) -> str:
    """A message as one line of sane length: any run of QUOTE_MAX + 50 or more characters without a space
    (user input echoed by a library) is cut to QUOTE_MAX and its length said, and the whole line too."""
    from .output import plain

    text = plain(" ".join(str(text).split()))  # a terminal escape in a stored name is shown, not obeyed
    text = LONG_TOKEN.sub(lambda m: f"{m.group(0)[:QUOTE_MAX]}... ({len(m.group(0))} characters)", text)
    return text if len(text) <= MESSAGE_MAX else text[:MESSAGE_MAX] + f"... ({len(text)} characters)"


def _fail(message: str) -> None:
    click.echo(f"error: {one_line(message)}", err=True)
    sys.exit(2)


def expected_errors(fn):
    """Expected failures become one sentence on stderr and exit status 2, never a traceback: our own
    errors, and the storage's errors that say the disk or file system cannot take a write."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            from .environment import check_environment

            check_environment()
            return fn(*args, **kwargs)
        except (TunerError, DatabaseError) as e:
            from . import interrupted

            if interrupted(e):  # e.g. an adapter whose import a Ctrl-C broke: the interrupt, not the error
                click.echo("interrupted", err=True)
                sys.exit(130)
            _fail(_from_env(str(e), kwargs.get("db_url")))
        except KeyboardInterrupt:  # a second Ctrl-C: what was recorded stays recorded
            click.echo("interrupted", err=True)
            sys.exit(130)
        except Exception as e:  # disk full, read-only, quota: Optuna's and SQLAlchemy's errors wrap the cause
            from ..db.store import resource_error
            from . import interrupted

            if interrupted(e):  # a Ctrl-C inside an extension module's import: another error, caused by it
                click.echo("interrupted", err=True)
                sys.exit(130)

            err = resource_error(e, kwargs.get("db_url") or "the results database")
            if err is None:
                raise
            _fail(str(err))

    return wrapper


def _from_env(message: str, db_url: str | None) -> str:
    """A message about ``--db`` names $TUNER_DB when the URL came from it (no --db on the command line)."""
    env = os.environ.get("TUNER_DB")
    if env and db_url == env and message.startswith(("--db ", "--db:")) and "--db" not in sys.argv[1:]:
        return "$TUNER_DB (the default of --db)" + message[len("--db") :]
    return message


class BoundedInt(click.ParamType):
    """An integer in ``low..high`` (by default what the database stores); the message quotes the input
    cut to about 200 characters (click's own echoes it whole)."""

    name = "integer"

    def __init__(self, low: int = 1, high: int = INT64_MAX) -> None:
        self.low, self.high = low, high

    def convert(self, value, param, ctx):
        if isinstance(value, int) and not isinstance(value, bool):
            n = value
        else:
            text = str(value).strip()
            if not re.fullmatch(r"[+-]?[0-9]{1,40}", text):
                self.fail(f"{quote(value)} is not a valid integer.", param, ctx)
            n = int(text)
        if not self.low <= n <= self.high:
            self.fail(f"{quote(value)} is not in the range {self.low}<=x<={self.high}.", param, ctx)
        return n


class Seconds(click.ParamType):
    """A duration in seconds: finite and positive (``nan``, ``inf``, 0 and negatives are refused)."""

    name = "seconds"

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            x = float(value)
        else:
            try:
                x = float(str(value).strip()) if len(str(value)) <= 100 else math.nan
            except ValueError:
                self.fail(f"{quote(value)} is not a number of seconds", param, ctx)
        if not math.isfinite(x) or x <= 0:
            self.fail(f"{quote(value)} is not a finite number of seconds > 0", param, ctx)
        return x


DB_INT = BoundedInt()


def _pct(band) -> str:
    return pct(band)


def _ci(lo, hi, digits: int = 2) -> str:
    return "-" if lo is None or hi is None else f"{lo:.{digits}f}-{hi:.{digits}f}"


def _ties(text: str) -> str:
    """Every config tied with the best, whole (the column wraps between keys)."""
    keys = (text or "").split()
    return "-" if not keys else " ".join(keys)


def _best_brief(rows: list[dict]) -> list[dict]:
    extra = varying(rows, "device", "backend")
    return [
        {
            "space": r["space"],
            "workload": r["workload"],
            **{k: r[k] for k in extra},
            "config": r["config"],
            "median_us": r["median_us"],
            "95% CI us": _ci(r["ci_low_us"], r["ci_high_us"]),
            "ratio": r["ratio"],
            "effect": r["effect"],
            "band": _pct(r["noise_band"]),
            "kernel": r["kernel"],
            "ties": _ties(r["tied_with"]),
        }
        for r in rows
    ]


def _trials_brief(rows: list[dict]) -> list[dict]:
    from .output import bounded

    keys = (
        "trial",
        *varying(rows, "space"),
        "C",
        "config",
        "verdict",
        "median_us",
        "ratio",
        "effect",
        *varying(rows, "kernel"),
        "reason",
    )
    return [
        {**{k: r[k] for k in keys}, "reason": bounded(r["reason"], whole="`tuner show TRIAL -f json`")} for r in rows
    ]


def _studies_brief(rows: list[dict]) -> list[dict]:
    return [
        {
            **{k: r[k] for k in ("space", "workload", "C", *varying(rows, "device", "backend"))},
            "band": _pct(r["noise_band"]),
            "trials": r["trials"],
            "ok": r["ok"],
            "kernel": (r["kernel"] or "")[:12],
        }
        for r in rows
    ]


def _values_text(v) -> str:
    """A launch-only column's values in a brief row: up to three listed, more as ``low..high (n)``."""
    values = [int(x) for x in v.split(",")] if isinstance(v, str) else v if isinstance(v, list) else [v]
    return ",".join(map(str, values)) if len(values) <= 3 else f"{min(values)}..{max(values)} ({len(values)})"


def _check_brief(rows: list[dict], adapter=None) -> list[dict]:
    from .adapter import default_adapter

    adapter = adapter or default_adapter()
    params = adapter.params
    out = []
    for r in rows:
        compiled_values = {p.name: r[p.name] for p in params if p.compiled}
        compiled = adapter.compiled_label(adapter.config(compiled_values))
        launch = {p.name: r[p.name] for p in params if not p.compiled}
        out.append(
            {
                **({"workload": r["workload"]} if "workload" in r else {}),
                "config": compiled,
                **{k: _values_text(v) for k, v in launch.items()},
                "shared": r["shared_bytes"],
                "limit": r["limit_bytes"],
                "regs": r["registers"],
                "spill": r["spill_bytes"],
                "feasible": r["feasible"],
                "reason": _bounded(r["reason"]),
            }
        )
    # columns that say nothing here: one limit for every row (the reasons quote it), no registers compiled
    drop = {k for k in ("limit", "regs", "spill") if len({str(r[k]) for r in out}) == 1}
    drop -= {k for k in ("regs", "spill") if out and out[0][k] is not None}
    return [{k: v for k, v in r.items() if k not in drop} for r in out]


def _bounded(text):
    from .output import bounded

    return bounded(text)


def _search_brief(rows: list[dict]) -> list[dict]:
    from ..db.verdicts import Verdict as V

    out = []
    for r in rows:
        others = {v.value: r.get(v.value, 0) for v in V if v is not V.OK}
        failed = ", ".join(f"{n} {k}" for k, n in others.items() if n and k != V.INFEASIBLE)
        out.append(
            {
                "workload": r["workload"],
                "C": r["C"],
                "best": r["best"],
                "median_us": r["median_us"],
                "ratio (95% CI)": r["ratio vs baseline (95% CI)"],
                "effect": r["effect"],
                "band": r["noise band"],
                "ok": r["ok"],
                "infeasible": others.get(V.INFEASIBLE, 0),
                "other": failed or "-",
            }
        )
    return out


def _compare_brief(rows: list[dict]) -> list[dict]:
    # two kernels' studies at one level are two rows: the kernel column tells them apart
    keys = ("space", "workload", *varying(rows, "device"), "C", *varying(rows, "kernel"), "A_us", "B_us", "A/B")
    return [
        {
            **{k: r[k] for k in keys},
            "95% CI": _ci(r["ci_low"], r["ci_high"], 4),
            "band": _pct(r["noise_band"]),
            "effect": r["effect"],
        }
        for r in rows
    ]


def _calibrate_brief(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        mde = next(k for k in r if k.startswith("mde (") and "finalist" not in k)
        out.append(
            {
                **{k: r[k] for k in ("workload", "C", *varying(rows, "device"), "pairs")},
                "spread": pct(r["spread"], 2),
                "band": pct(r["band"], 2),
                mde.replace(" rounds)", " r)"): pct(r[mde], 2, sign=False),
                "mde (final)": pct(r["mde (finalist rounds)"], 2, sign=False),
                "false rate": pct(r["false non-flat rate"], 1, sign=False),
                "multimodal": r["baseline multimodal"],
            }
        )
    return out


def _statistics_brief(rows: list[dict]) -> list[dict]:
    return [
        {
            "phase": r["phase"],
            "n": r["n"],
            "median_us": round(r["median_us"], 3),
            "95% CI us": _ci(r["ci_low_us"], r["ci_high_us"], 3),
            "ratio": round(r["ratio"], 4),
            "ratio CI": _ci(r["ratio_ci_low"], r["ratio_ci_high"], 4),
            "band": _pct(r["noise_band"]),
            "verdict": r["classification"],
            "p": "-" if r["p_value"] is None else f"{r['p_value']:.2g}",
        }
        for r in rows
    ]


results_backend_option = click.option(  # the listings' and export's filter (a search's --backend picks where it runs)
    "--backend",
    type=click.Choice(["cuda", "interpreter"]),
    default=None,
    help="Only results measured on this backend (default: any).",
)
db_option = click.option(
    "--db",
    "db_url",
    default=lambda: os.environ.get("TUNER_DB", "sqlite:///tuner.db"),
    show_default="sqlite:///tuner.db or $TUNER_DB",
    help="Results database URL (SQLAlchemy).",
)
kernel_option = click.option(  # export's and report's kernel (a search's is its space's `kernel:`)
    "--kernel",
    default="sparse_mla",
    show_default=True,
    help="Whose results: a kernel adapter, as a space's `kernel:` names it (built-in name or module:Class).",
)


COMPLETION = """Shell completion: add the line for your shell to its startup file.

\b
  bash (~/.bashrc):  eval "$(_TUNER_COMPLETE=bash_source tuner)"
  zsh  (~/.zshrc):   eval "$(_TUNER_COMPLETE=zsh_source tuner)"
  fish (~/.config/fish/completions/tuner.fish):  _TUNER_COMPLETE=fish_source tuner | source"""


@click.group(
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120},
    epilog=COMPLETION,
)
@click.version_option(__version__, prog_name="tuner")
def cli() -> None:
    """Autotuner for the sparse-MLA decode kernel (DeepSeek V3.2 / V4 FP8 KV caches).

    Every listing takes -f table|json|csv and --db URL; `tuner COMMAND --help` says more.
    """


@cli.command(short_help="Which configs of SPACE_FILE fit the target arch, and why not (compiles only).")
@click.argument("space_file", type=click.Path(dir_okay=False))
@click.option("--target", default=None, help="Arch whose limits apply (default: the space's `target`).")
@click.option("--workload", "workload_name", default=None, help="Only this workload of the space.")
@click.option("--all", "show_all", is_flag=True, help="One row per config, not one per compiled binary.")
@click.option(
    "--registers",
    is_flag=True,
    help="Compile through ptxas for registers and spills too (default: only when max_spill_bytes makes them decide).",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress on stderr.")
@format_option
@db_option
@expected_errors
def check(
    space_file: str,
    target: str | None,
    workload_name: str | None,
    show_all: bool,
    registers: bool,
    quiet: bool,
    fmt: str,
    db_url: str,
) -> None:
    """Which configs of SPACE_FILE fit the target arch, and why not. Compiles only; needs no GPU.

    One row per compiled binary x workload: configs that differ only in launch-only parameters
    (TARGET_CTAS) compile to the same binary and share a row, whose launch-only columns list their
    values (json: a list). --all: one row per config. Verdicts are cached, so a second check is
    fast. With several workloads, json/csv rows also carry a `workload` field.

    Where registers cannot decide a verdict (the space sets no max_spill_bytes), each compile stops
    once Triton has allocated shared memory: the verdict is the compiler's own shared size for the
    target, and registers and spills stay empty; --registers compiles through ptxas for them.
    """
    from .space import TARGETS
    from .space import load_space

    space = load_space(space_file)  # a bad space file's error comes before the check's modules load

    from ..db.store import Store
    from .feasibility import check_many
    from .progress import Progress

    adapter = space.adapter
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
    launch_only = [p.name for p in adapter.params if not p.compiled]
    fields = (("workload",) if len(workloads) > 1 else ()) + adapter.param_names + VERDICT_FIELDS
    rows, n_ok = [], 0
    progress = Progress(quiet)
    registers = registers or space.max_spill_bytes is not None
    for w in workloads:
        name = f"{space.name}/{w.name}"
        depth = "" if registers else " (shared memory only; --registers: registers too)"
        progress.message(f"{name}: checking {len(configs)} configs for {target}{depth}")
        with progress.compiling(name) as task:
            verdicts = check_many(
                configs,
                w.workload(),
                target,
                max_spill_bytes=space.max_spill_bytes,
                store=store,
                on_progress=task,
                registers=registers,
                adapter=adapter,
            )
        groups: dict = {}  # compiled binary -> [(config, verdict)]; one config each with --all
        for cfg, v in zip(configs, verdicts, strict=True):
            binary = tuple((p.name, getattr(cfg, p.name)) for p in adapter.params if p.compiled)
            groups.setdefault(cfg if show_all else binary, []).append((cfg, v))
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
    click.echo(render(rows, fmt, functools.partial(_check_brief, adapter=adapter)))
    summary = f"{n_ok} feasible / {len(configs) * len(workloads) - n_ok} infeasible for {target}"
    click.echo(summary, err=fmt != "table")


def _backend(requested: str | None) -> str:
    if requested:
        return requested
    import torch

    return "cuda" if torch.cuda.is_available() else "interpreter"


class _SearchCommand(click.Command):
    """`tuner search`, whose help ends with every strategy's options (read when the help is shown)."""

    def format_epilog(self, ctx, formatter) -> None:
        from . import strategies

        formatter.write_paragraph()
        formatter.write_text(
            "Strategy options: set in the space file's `sampler:` mapping next to `name`, e.g. "
            "`sampler: {name: surrogate, stop_p: 0.1}` (name = default: what it does):"
        )
        formatter.write_paragraph()
        formatter.write_text("\b\n" + strategies.options_help())


@cli.command(
    cls=_SearchCommand,
    short_help="Tune every workload x concurrency of SPACE_FILE (or of --model's calls); samples go to the database.",
)
@click.argument("space_file", type=click.Path(dir_okay=False), required=False)
@click.option(
    "--model",
    default=None,
    help="Instead of SPACE_FILE: the decode calls of a model preset (deepseek-v4-flash, deepseek-v3.2, glm-5, "
    "glm-5.3-flash, deepseek-v4.1-flash) at --tp, with the engines' CUDA-graph batch sizes (docs/engines.md).",
)
@click.option("--tp", type=click.IntRange(1, 16), default=None, help="--model: the tensor-parallel size (1..16).")
@click.option(
    "--q-tokens",
    "q_tokens",
    default=None,
    help="--model: query tokens per request to tune, e.g. 1,2 (a speculative verify step; default 1).",
)
@click.option(
    "--max-batch",
    type=click.IntRange(1, 4096),
    default=None,
    help="--model: the largest CUDA-graph batch size to tune (default 96).",
)
@click.option(
    "--backend",
    type=click.Choice(["cuda", "interpreter", "replay"]),
    default=None,
    help="Default: cuda when a GPU is present, else the interpreter. replay: draw from --replay-db's samples.",
)
@click.option("--replay-db", default=None, help="replay backend: the database whose recorded samples are replayed.")
@click.option("--replay-device", default=None, help="replay backend: the GPU name to replay when it holds several.")
@click.option(
    "--replay-kernel",
    default=None,
    help="replay backend: the kernel hash whose samples are replayed (default: the newest at each level).",
)
@click.option(
    "--replay-queue",
    type=click.Choice(["memory", "database"]),
    default="memory",
    show_default=True,
    help="replay backend: where Optuna's queue lives; database: in the results database, as on a GPU "
    "(several processes share a study, a killed one's trials are resumed).",
)
@click.option(
    "--sampler",
    type=click.Choice(["grid", "tpe", "surrogate"]),
    default=None,
    help="The search strategy (default: the space's `sampler`, else surrogate); see docs/search.md.",
)
@click.option(
    "--seed",
    type=click.IntRange(min=0, max=2**31 - 1),
    default=0,
    show_default=True,
    help="Seeds the strategy and, with --backend replay, the replayed draws.",
)
@click.option(
    "--n-trials",
    type=DB_INT,
    default=None,
    help="At most this many trials per study, counting those a previous run measured (a resumed search adds the "
    "rest); larger than a finished level's count and cap, it continues that level up to this many.",
)
@click.option(
    "--first",
    "first",
    default=None,
    help="Configs to measure first at every level, before the sampler's own picks, "
    "e.g. T32-w4-s1-c768-p2,T16-w4-s2-c256.",
)
@click.option(
    "--timeout", "timeout_s", type=Seconds(), default=None, help="Stop after this many seconds (finite, > 0)."
)
@click.option("--concurrency", "concurrency", default=None, help="A subset of the space's levels, e.g. 1,96.")
@click.option(
    "--workers",
    type=DB_INT,
    default=None,
    help="Measurement workers sharing each study: default one per visible GPU, 1 on the CPU; "
    "at most the visible GPUs (cuda) or the machine's cores (interpreter); replay: N simulated GPUs (docs/workers.md).",
)
@click.option("--remeasure", is_flag=True, help="Measure again configs that already have results (kept).")
@click.option(
    "--redo",
    is_flag=True,
    help="Search levels an earlier run finished again, from their measurements (default: a finished level "
    "shows its stored result and measures nothing; a larger --n-trials continues it up to that many).",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
@format_option
@db_option
@expected_errors
def search(
    space_file,
    model,
    tp,
    q_tokens,
    max_batch,
    backend,
    replay_db,
    replay_device,
    replay_kernel,
    replay_queue,
    sampler,
    seed,
    n_trials,
    first,
    timeout_s,
    concurrency,
    workers,
    remeasure,
    redo,
    quiet,
    fmt,
    db_url,
):
    """Tune every workload x concurrency level of SPACE_FILE, or with --model NAME --tp N of a model preset's decode
    calls (no space file: docs/engines.md); every sample goes to the database.

    Re-running resumes: configs already measured for this kernel and environment are skipped, and a level
    an earlier run finished measures nothing (--redo searches it again; a larger --n-trials continues it).
    Ctrl-C stops after the running trial. A trial whose heartbeat (every 2 s) is silent for 10 s belongs to a
    dead host and is retried; $TUNER_HEARTBEAT_GRACE_S sets those 10 s (whole seconds, more than 2).
    """
    # a bad space file's error comes before the search's modules load
    space = _search_space(space_file, model, tp, q_tokens, max_batch, backend, replay_db, replay_device)

    from ..db.store import Store
    from .heartbeat import grace_s
    from .search import Options
    from .search import run_search
    from .summary import time_lines

    levels = _levels(concurrency)
    first_configs = _first_configs(first, space)
    if (replay_db or replay_kernel or replay_queue != "memory") and backend != "replay":
        raise TunerError("--replay-db, --replay-kernel and --replay-queue need --backend replay")
    if replay_db:  # checked as --db is, before anything is created
        from ..db.store import check_url

        check_url(replay_db, create=False, option="--replay-db")
    _check_workers(workers, _backend(backend))
    grace_s()  # $TUNER_HEARTBEAT_GRACE_S, checked before anything is created
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
        redo=redo,
        quiet=quiet,
        replay_db=replay_db,
        replay_device=replay_device,
        replay_kernel=replay_kernel,
        replay_queue=replay_queue,
        seed=seed,
    )
    rows = run_search(space, store, opts)
    store.verify()  # the file it opened still is the database's path: "results in" it is true
    if fmt == "table":
        click.echo(f"search {space.name} ({opts.backend}), results in {store.shown_url}:", err=True)
        stopped = [f"{r['workload']} C={r['C']}: {r['stopped']}" for r in rows]
        click.echo(render(rows, fmt, _search_brief))
        click.echo("why each level stopped:\n  " + "\n  ".join(stopped))
        click.echo("where the time went (s):\n  " + "\n  ".join(time_lines(rows)))
    else:
        click.echo(render(rows, fmt, _search_brief))
    if opts.interrupted:
        sys.exit(128 + (opts.stop_signal or 2))  # Ctrl-C 130, SIGTERM 143: every finished trial is recorded


def _search_space(space_file, model, tp, q_tokens, max_batch, backend, replay_db, replay_device):
    """SPACE_FILE's space, or the preset's (``--model``/``--tp``), cut under replay to what the database recorded."""
    from .space import load_space

    preset_options = [n for n, v in (("--tp", tp), ("--q-tokens", q_tokens), ("--max-batch", max_batch)) if v]
    if (space_file is None) == (model is None):
        raise TunerError("give a SPACE_FILE or --model NAME --tp N (one of them)")
    if space_file is not None:
        if preset_options:
            raise TunerError(f"{', '.join(preset_options)} apply to --model, not to a SPACE_FILE")
        return load_space(space_file)
    from .adapter import default_adapter

    replayed = {"replay_db": replay_db, "replay_device": replay_device} if backend == "replay" and replay_db else {}
    space, notes = default_adapter().model_space(model, tp, q_tokens=q_tokens, max_batch=max_batch, **replayed)
    for line in notes:
        click.echo(line, err=True)
    return space


def _first_configs(text: str | None, space) -> list:
    """``--first``: config keys of the space, in the order given."""
    if not text:
        return []
    configs, allowed = [], set(space.configs())
    for key in text.split(","):
        key = key.strip()
        if len(key) > 100:  # no config key is this long; the message quotes only its start
            raise TunerError(f"--first: {quote(key, 60)} is not a config key of the form {space.baseline}")
        try:
            cfg = space.adapter.config_type.parse(key)
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
    levels = []
    for c in text.split(","):
        c = c.strip()
        if not re.fullmatch(r"[0-9]{1,19}", c) or not 1 <= int(c) <= INT64_MAX:
            raise TunerError(f"--concurrency must be a comma list of integers in 1..{INT64_MAX}, got {quote(text)}")
        levels.append(int(c))
    return levels


MAX_SIMULATED_GPUS = 64


def _check_workers(workers: int | None, backend: str) -> None:
    """``--workers`` within what this machine can run: one measurement process per visible GPU (cuda), at most one
    per core of the machine (interpreter), up to :data:`MAX_SIMULATED_GPUS` simulated GPUs (replay)."""
    if workers is None:
        return
    if backend == "cuda":
        import torch

        visible = torch.cuda.device_count()
        if workers > visible:
            raise TunerError(
                f"--workers {workers} needs {workers} GPUs, but {visible} are visible "
                "(CUDA_VISIBLE_DEVICES); use --workers 1.." + str(max(visible, 1))
            )
        return
    if backend == "replay":  # simulated GPUs (tuner.replay.SimulatedGPUs): threads that run one at a time
        if not 1 <= workers <= MAX_SIMULATED_GPUS:
            raise TunerError(f"--workers {workers}: the replay backend simulates 1..{MAX_SIMULATED_GPUS} GPUs")
        return
    cores = os.cpu_count() or 1
    if workers > cores:
        raise TunerError(
            f"--workers {workers} is more than the {cores} cores of this machine; the {backend} backend "
            f"runs one measurement process per worker: use --workers 1..{cores}"
        )


@cli.command(short_help="Measure the A/A noise: the baseline against itself (spread, band, smallest effect).")
@click.argument("space_file", type=click.Path(dir_okay=False))
@click.option("--workload", "workload_name", default=None, help="Only this workload of the space.")
@click.option("--concurrency", default=None, help="Levels to calibrate, e.g. 1,96 (default: every level).")
@click.option("--pairs", type=BoundedInt(3, 100_000), default=30, show_default=True, help="Independent capture pairs.")
@click.option(
    "--backend",
    type=click.Choice(["cuda", "interpreter"]),
    default=None,
    help="Default: cuda when a GPU is present, else the interpreter.",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress on stderr.")
@format_option
@db_option
@expected_errors
def calibrate(space_file, workload_name, concurrency, pairs, backend, quiet, fmt, db_url):
    """Measure this GPU's A/A noise: SPACE_FILE's baseline against itself, independent captures and inputs.

    Prints the spread between captures, the band verdicts use (the larger of the spread and the
    space's min_effect), the smallest effect the configured rounds detect, and how often the current
    policy calls an A/A trial non-flat. `tuner search` uses the latest calibration of the same
    environment, workload and concurrency.
    """
    from ..db.store import Store
    from . import calibrate as cal
    from .progress import Progress
    from .search import Options
    from .search import start_processes
    from .space import load_space

    space = load_space(space_file)
    workloads = [w for w in space.workloads if workload_name in (None, w.name)]
    if not workloads:
        raise TunerError(
            f"--workload {workload_name!r} is not in {space.path}; it has {[w.name for w in space.workloads]}"
        )
    levels = _levels(concurrency) or space.concurrency
    store = Store(db_url)
    processes = start_processes(Options(backend=_backend(backend)), kernel=space.adapter.spec)
    progress = Progress(quiet)
    task = progress.task(f"calibrate {space.name}", len(workloads) * len(levels))
    progress.message(
        f"calibrate {space.name}: {pairs} A/A pairs of {space.baseline} at {len(workloads) * len(levels)} "
        "(workload, concurrency) points"
    )
    try:
        with task:
            counted = [_CountedProcess(p, task) for p in processes]
            rows = cal.run(space, store, _backend(backend), workloads, levels, pairs, counted)
    finally:
        for p in processes:
            p.close()
    store.verify()
    click.echo(render(rows, fmt, _calibrate_brief))


class _CountedProcess:
    """A measurement process whose every ok answer advances a progress task (calibrate's points); all
    else is the process's own."""

    def __init__(self, proc, task) -> None:
        self._proc, self._task = proc, task

    def __getattr__(self, name):
        return getattr(self._proc, name)

    def measure(self, req, **kw):
        reply = self._proc.measure(req, **kw)
        if reply.verdict == Verdict.OK:  # a retried failure counts once, when it answers
            self._task.advance(1, postfix=f"C={req.batch}")
        return reply


def _best_row(t) -> dict:
    st = t.statistic()
    env = t.environment
    row = {
        "trial": t.id,
        "config": t.config_key,
        **t.param_values(),
        "median_us": round(st.median_us, 3),
        "ci_low_us": round(st.ci_low_us, 3),
        "ci_high_us": round(st.ci_high_us, 3),
        "ratio": round(st.ratio, 4),
        "ratio_ci_low": round(st.ratio_ci_low, 4),
        "ratio_ci_high": round(st.ratio_ci_high, 4),
        "effect": st.classification,
        "noise_band": round(st.noise_band, 4),
        "n": st.n,
        "phase": st.phase,
    }
    wl = t.workload
    nbytes = _bytes_moved(wl, t.concurrency) if t.backend == "cuda" else None
    gbps = nbytes / (st.median_us * 1e-6) / 1e9 if nbytes else 0.0
    row["GBps"] = round(gbps, 1) if t.backend == "cuda" and nbytes else None
    row["pct_copy_bw"] = round(100 * gbps / env.copy_gbps, 1) if (env.copy_gbps and row["GBps"] is not None) else None
    row.update(
        space=t.study.space.name,
        workload=wl.name,
        concurrency=t.concurrency,
        device=env.gpu_name,
        backend=t.backend,
        kernel=t.study.kernel.source_hash[:12],
        trial=t.id,
        date=t.created_at.strftime("%Y-%m-%d %H:%M"),
    )
    return row


def _bytes_moved(wl, concurrency: int) -> int | None:
    """The least bytes a call of a recorded workload moves: the built-in kernel's whole call (both caches, every
    token), or another adapter's :meth:`~tuner.adapter.KernelAdapter.bytes_moved` (None when it cannot be
    made here)."""
    from .adapter import adapter_named

    try:
        adapter = adapter_named(wl.adapter)
        return adapter.bytes_moved(adapter.recorded_workload(wl), concurrency)
    except Exception:  # noqa: BLE001 - an adapter this environment cannot import: the row goes without it
        return None


@cli.command(short_help="The best ok config at a concurrency, with its CI, ratio to baseline, effect, kernel and ties.")
@click.option("--concurrency", type=DB_INT, required=True, help="Batch size (concurrency level).")
@click.option("--space", default=None, help="Only this search space's results (its `name`, e.g. v4_flash_tp4).")
@click.option("--workload", default=None, help="Only this workload's results (its name in the space, e.g. v4_flash).")
@click.option("--device", default=None, help="GPU name as stored, e.g. 'NVIDIA H200'.")
@results_backend_option
@click.option(
    "--kernel",
    default="newest",
    show_default=True,
    help="Whose trials: `newest`, each level's newest kernel (what `trials` lists and `export` deploys), or the "
    "kernel whose source hash starts with this (the `kernel` column; `tuner db compact --help` lists them).",
)
@format_option
@db_option
@expected_errors
def best(concurrency, space, workload, device, backend, kernel, fmt, db_url):
    """The best `ok` config at a concurrency, with its CI, ratio to baseline, effect (win, flat, loss against
    the baseline, beyond the noise band) and kernel: each level's newest kernel unless --kernel names one."""
    from ..db import queries
    from ..db.store import Store

    store = Store(db_url, readonly=True)
    with store.session() as s:
        kernel_id = None if kernel == "newest" else queries.kernel_named(s, kernel).id
        found = queries.best(
            s, concurrency, space=space, workload=workload, device=device, backend=backend, kernel_id=kernel_id
        )
        rows = [
            {**_best_row(t), "tied_with": " ".join(x.config_key for x in queries.tied(s, t) if x.id != t.id)}
            for t in found
        ]
    if not rows:
        raise TunerError(_no_level(store, concurrency, space=space, workload=workload, device=device, backend=backend))
    if len(rows) > 1:
        click.echo(f"{len(rows)} matches, one per space/workload/device/backend (narrow with --space etc.)", err=True)
    click.echo(render(rows, fmt, _best_brief))


def _no_level(store, concurrency: int, **where) -> str:
    """Why ``best`` found nothing: the levels that do hold ok results (under the same filters), and the nearest."""
    from ..db import queries

    with store.session() as s:
        levels = queries.ok_levels(s, **where)
    filters = ", ".join(f"--{k} {quote(v, 60)}" for k, v in where.items() if v)
    scope = f" ({filters})" if filters else ""
    if not levels:
        return f"no ok result at any concurrency in {store.shown_url}{scope} (run `tuner search` first)"
    nearest = min(levels, key=lambda c: (abs(c - concurrency), c))
    return (
        f"no ok result at concurrency {concurrency} in {store.shown_url}{scope}; the levels with ok results are "
        f"{', '.join(map(str, levels))} (nearest: {nearest})"
    )


@cli.command(short_help="Every trial of each level's newest kernel: config, verdict, reason, median, ratio, effect.")
@click.option("--concurrency", type=DB_INT, default=None, help="Only this concurrency level (default: every level).")
@click.option(
    "--verdict",
    type=click.Choice([v.value for v in Verdict] + ["all"]),
    default="all",
    show_default=True,
    help="Only trials with this verdict (ok, or why the trial has no measurement).",
)
@click.option(
    "--kernel",
    default="newest",
    show_default=True,
    help="Whose trials: `newest`, each level's newest kernel (the trials `best` ranks), `all` (every kernel's), or "
    "the kernel whose source hash starts with this (the `kernel` column).",
)
@click.option("--space", default=None, help="Only this search space's trials (its `name`, e.g. v4_flash_tp4).")
@click.option(
    "--sort",
    type=click.Choice(["id", "median_us", "config"]),
    default="id",
    show_default=True,
    help="Row order: trial id, median (fastest first, unmeasured last) or config parameters.",
)
@format_option
@db_option
@expected_errors
def trials(concurrency, verdict, space, kernel, sort, fmt, db_url):
    """Every trial: config, verdict (ok, infeasible, ...), reason, feasibility numbers, median, ratio and effect
    (win, flat, loss). Each level's newest kernel only, as `best` ranks them, unless --kernel says otherwise."""
    from sqlalchemy import select

    from ..db import queries
    from ..db.models import PARAM_COLUMNS
    from ..db.models import TrialModel
    from ..db.store import Store

    store = Store(db_url, readonly=True)
    with store.session() as s:
        rows = []
        kernel_id = None if kernel in ("newest", "all") else queries.kernel_named(s, kernel).id
        found = queries.trials(s, concurrency=concurrency, verdict=verdict, space=space, kernel_id=kernel_id)
        for t in queries.newest_per_level(found) if kernel == "newest" else found:
            st = t.evidence().statistic()  # a duplicate shows its original's numbers
            rows.append(
                {
                    "trial": t.id,
                    "space": t.study.space.name,
                    "C": t.concurrency,
                    "config": t.config_key,
                    **t.param_values(),
                    "verdict": t.verdict,
                    "duplicate_of": t.duplicate_of,
                    "median_us": round(st.median_us, 3) if st else None,
                    "ratio": round(st.ratio, 4) if st else None,
                    "effect": st.classification if st else None,
                    "shared_bytes": t.shared_bytes,
                    "registers": t.registers,
                    "kernel": t.study.kernel.source_hash[:12],
                    "reason": t.reason,
                }
            )
    key = {
        "id": lambda r: r["trial"],
        "config": lambda r: tuple(r.get(p, 0) for p in PARAM_COLUMNS) + (r["config"],),
        "median_us": lambda r: (r["median_us"] is None, r["median_us"] or 0),
    }[sort]
    rows.sort(key=key)
    if not rows:
        levels = ""
        if concurrency is not None:
            with store.session() as s:
                found = sorted(set(s.scalars(select(TrialModel.concurrency).distinct())))
            levels = f" (levels with trials: {', '.join(map(str, found)) or 'none'})"
        click.echo(f"no trials match{levels}", err=True)
    click.echo(render(rows, fmt, _trials_brief))


@cli.command(short_help="Write the kernel's autotune tables: the best ok config per batch size.")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(),
    default=None,
    help="engine/sglang: directory for the tables (default: $SPARSE_MLA_CONFIG_DIR when set, else ./tuned_configs; "
    "with --engine, where the engine's plugin reads them); triton: the .py file to write (default, or `-`: stdout).",
)
@click.option(
    "--engine",
    type=click.Choice(["sglang", "vllm"]),
    default=None,
    help="Write the tables where that engine's plugin reads them: $SPARSE_MLA_CONFIG_DIR, else "
    "~/.local/share/sparse_mla_tuner/configs (sglang: its triton_<version>/ layout; vllm: vLLM's flat layout).",
)
@click.option(
    "--format",
    "export_format",
    type=click.Choice(["engine", "sglang", "triton", "json"]),
    default=None,
    help="engine (default): flat JSON tables {batch: config} the kernel reads, with a provenance sidecar; "
    "sglang: the same in a triton_<version>/ folder; triton: an importable list of triton.Config; json: another "
    "kernel's tables (--kernel), its adapter's export_table().",
)
@results_backend_option
@click.option(
    "--record",
    is_flag=True,
    help="Also record each table written in the database's tuner_exports (without it the database is only read).",
)
@click.option(
    "--shape",
    "shapes",
    multiple=True,
    metavar="HEADSxTOPK",
    help="engine/sglang: only the table of this shape (repeatable, e.g. --shape 8x128 --shape 64x1152); a shape "
    "not tuned gets the nearest tuned shape's configs (docs/engines.md).",
)
@kernel_option
@db_option
@expected_errors
def export(out_dir, engine, export_format, backend, record, shapes, kernel, db_url):
    """Write the kernel's autotune tables: the best ok config per concurrency, per device and workload."""
    from ..db.store import Store
    from .adapter import load_adapter
    from .export import export as write_tables
    from .export import records
    from .progress import Progress

    adapter = load_adapter(kernel, "--kernel")
    if out_dir == "-":  # the standard output, as for the space's `-`: never a file or folder named "-"
        if export_format != "triton":
            raise TunerError(
                "--out -: the tables are files in a folder, which the standard output cannot hold; name a folder "
                "(--format triton writes its one module to the standard output)"
            )
        out_dir = None
    if engine is not None:
        layout = {"sglang": "sglang", "vllm": "engine"}[engine]
        if export_format not in (None, layout):
            raise TunerError(f"--engine {engine} writes the {layout} layout; leave out --format {export_format}")
        export_format = layout
        if out_dir is None:
            out_dir = adapter.export_dir()

    store = Store(db_url, create=False) if record and records(adapter, export_format) else Store(db_url, readonly=True)
    try:
        progress = Progress(False)  # the reading (when slow) and the tables written, on stderr
        written = write_tables(
            store, adapter, export_format, out_dir, backend=backend, record=record, shapes=shapes, progress=progress
        )
    except OSError as e:
        raise TunerError(f"cannot write {e.filename or out_dir}: {e.strerror}") from None
    if isinstance(written, str):  # a module's text, to stdout
        click.echo(written, nl=False)
        return
    for path in written:
        click.echo(str(path))


@cli.command(short_help="The A/B report in Markdown (--plots: PNG plots too).")
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write here (default, or `-`: stdout)."
)
@click.option("--plots", "plots_dir", type=click.Path(file_okay=False), default=None, help="Write PNG plots here.")
@click.option(
    "--bench",
    "bench_files",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="A same-run benchmark of ours against FlashMLA (the JSON of the built-in kernel's `bench` or `bench_call` "
    "module; repeatable): the median plot of its device and call shows FlashMLA from it.",
)
@kernel_option
@db_option
@expected_errors
def report(output, plots_dir, bench_files, kernel, db_url):
    """The A/B report: noise band, best per concurrency, each lever's effect, dead ends, infeasible configs."""
    import os.path

    from ..db.store import Store
    from .adapter import load_adapter
    from .progress import Progress
    from .report import render_report
    from .report import sections_of

    if output == "-":  # the standard output, as for the space's `-`: never a file named "-"
        output = None
    if output:  # a FIFO, a directory or a link where the report should go: one sentence before any work
        from .export import check_output

        check_output(Path(output))
    prefix = ""
    if plots_dir and output:
        prefix = os.path.relpath(plots_dir, os.path.dirname(os.path.abspath(output)) or ".") + "/"
    try:
        adapter = load_adapter(kernel, "--kernel")
        benches = tuple(sections_of(adapter).load_bench(f) for f in bench_files)
        text = render_report(Store(db_url, readonly=True), plots_dir, prefix, benches, Progress(False), adapter)
    except OSError as e:
        raise TunerError(f"cannot write {e.filename or plots_dir}: {e.strerror}") from None
    if output:
        from .export import write_file

        write_file(Path(output), text)  # atomically, a regular file only (never a FIFO, never through a link)
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text)


@cli.command(short_help="Everything about one trial, raw samples included.")
@click.argument("trial_id", type=DB_INT)
@format_option
@db_option
@expected_errors
def show(trial_id, fmt, db_url):
    """Everything about trial TRIAL_ID (see `tuner trials`), raw samples included."""
    from ..db.models import PARAM_COLUMNS
    from ..db.models import TrialModel
    from ..db.store import Store

    store = Store(db_url, readonly=True)
    with store.session() as s:
        t = s.get(TrialModel, trial_id)
        if t is None:
            raise TunerError(f"no trial {trial_id} in {store.shown_url} (see `tuner trials`)")
        info = {c.name: getattr(t, c.name) for c in TrialModel.__table__.columns}
        info.pop("params")
        if t.params is not None:  # another adapter's trial: its own parameters, not the built-in kernel's columns
            info = {k: v for k, v in info.items() if k not in PARAM_COLUMNS}
            at = list(info).index("config_key") + 1
            items = list(info.items())
            info = dict(items[:at] + list(t.param_values().items()) + items[at:])
        info["created_at"] = str(info["created_at"])
        info.update(
            space=t.study.space.name,
            workload=t.workload.name,
            device=t.environment.gpu_name,
            noise_band=t.study.noise_band,
            kernel_hash=t.study.kernel.source_hash,
        )
        if t.params is not None:
            info["adapter"] = t.study.kernel.adapter
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
    shown = [{"field": k, "value": _bounded(v) if isinstance(v, str) else v} for k, v in info.items()]
    click.echo(render(shown, "table", lambda rows: rows))  # a stored text beyond TEXT_MAX: whole in -f json
    click.echo("")
    click.echo(render(stats_rows, "table", _statistics_brief))
    click.echo("")
    click.echo(render(samples, "table", lambda rows: rows))


def _int_list(text: str | None, option: str, low: int, high: int) -> list[int] | None:
    if not text:
        return None
    out = []
    for x in str(text).split(","):
        x = x.strip()
        if not re.fullmatch(r"[0-9]{1,9}", x) or not low <= int(x) <= high:
            raise TunerError(f"{option} must be a comma list of integers {low}..{high}, got {quote(text)}")
        out.append(int(x))
    return out


def _shapes_brief(rows: list[dict]) -> list[dict]:
    return [
        {
            "format": r["kv_format"],
            "heads": r["heads"],
            "topk": r["topk"],
            "q_tokens": r["q_tokens"],
            "served": "yes" if r["served"] else "no",
            "config from": r["origin"] + (f" {r['tuned']}" if r["tuned"] and r["origin"] != "measured" else ""),
            "rows up to": r["max_rows"] if r["max_rows"] is not None else "",
            "why not / to tune": r["reason"] or r["tune"] or "",
        }
        for r in rows
    ]


@cli.command(short_help="Which decode shapes the kernel serves on this device, and whose table configures each.")
@click.option("--device", default=None, help="GPU name as torch names it (default: this GPU, else cpu-interpreter).")
@click.option(
    "--kv-format", "formats", multiple=True, help="Only this cache format (repeatable; default every main cache's)."
)
@click.option("--heads", default=None, help="Local heads, e.g. 8,16 (default 8,16,32,64,128).")
@click.option("--topk", default=None, help="Top-k of the main cache, e.g. 256,1152 (default 64..2048).")
@click.option("--q-tokens", "q_tokens", default=None, help="Query tokens per request, e.g. 1,2 (default 1).")
@click.option("--model", default=None, help="Only the shapes of this model preset's calls at --tp.")
@click.option("--tp", type=click.IntRange(1, 16), default=None, help="--model: the tensor-parallel size.")
@format_option
@expected_errors
def shapes(device, formats, heads, topk, q_tokens, model, tp, fmt):
    """Which decode shapes the kernel serves on this device, and whose table configures each.

    The engine plugins decide with the same function (kernels.coverage.coverage), so what this prints is what
    an engine's log says. `config from`: measured (this shape's own table, measured on this device), replayed
    (drawn by --backend replay from recorded samples), unverified (a table without provenance, or of another
    edition of the chip), nearest HxK (the nearest tuned shape's table), default (the interpreter without a
    table), none (not served: `why not` names the argument).
    """
    from .adapter import default_adapter

    if device is None:
        import torch

        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu-interpreter"
    kw = {}
    for name, option, value in (("heads", "--heads", heads), ("topks", "--topk", topk)):
        kw[name] = _int_list(value, option, 1, 999_999_999)
    kw["q_tokens"] = _int_list(q_tokens, "--q-tokens", 1, 64)
    rows = default_adapter().served_shapes(device, formats=formats, model=model, tp=tp, **kw)
    click.echo(render(rows, fmt, _shapes_brief))


@cli.command(short_help="CONFIG_A against CONFIG_B at every concurrency both have (paired ratio, CI, effect).")
@click.argument("config_a")
@click.argument("config_b")
@click.option("--space", default=None, help="Only this search space's studies (its `name`, e.g. v4_flash_tp4).")
@format_option
@db_option
@expected_errors
def compare(config_a, config_b, space, fmt, db_url):
    """CONFIG_A against CONFIG_B (e.g. T16-w4-s2-c512 T16-w4-s2-c256) at every concurrency both have.

    One row per study that measured both: a level measured with several kernels (each kernel source
    is its own study) has one row per kernel, told apart by the `kernel` column (its source hash).
    """
    from ..db import queries
    from ..db.store import Store
    from . import stats

    config_a, config_b = (str(_parse_config(c)) for c in (config_a, config_b))
    store = Store(db_url, readonly=True)
    rows = []
    with store.session() as s:
        by_study, unsampled = {}, 0
        for t in queries.trials(s, space=space, verdict=Verdict.OK):
            if t.config_key in (config_a, config_b):
                by_study.setdefault(t.study_id, {})[t.config_key] = t
        for pair in by_study.values():
            if len(pair) < 2:
                continue
            a, b = pair[config_a], pair[config_b]
            ra = [x.candidate_us / x.baseline_us for x in a.samples if x.phase == Phase.SCREEN]
            rb = [x.candidate_us / x.baseline_us for x in b.samples if x.phase == Phase.SCREEN]
            if not ra or not rb:  # a superseded kernel's study after `tuner db compact`: no rounds to compare
                unsampled += 1
                continue
            r, lo, hi = stats.ratio_of_ratios(ra, rb, seed=a.id)
            band = a.study.noise_band or 0.0
            effect = "A faster" if hi < 1 - band else "A slower" if lo > 1 + band else "flat"
            rows.append(
                {
                    "space": a.study.space.name,
                    "workload": a.workload.name,
                    "device": a.environment.gpu_name,
                    "C": a.concurrency,
                    "kernel": a.study.kernel.source_hash[:12],
                    "study": a.study.name,
                    "A_us": round(a.statistic().median_us, 3),
                    "B_us": round(b.statistic().median_us, 3),
                    "A/B": round(r, 4),
                    "ci_low": round(lo, 4),
                    "ci_high": round(hi, 4),
                    "noise_band": round(band, 4),
                    "effect": effect,
                }
            )
    if unsampled:
        click.echo(f"{unsampled} studies with both left out: their raw rounds were compacted away", err=True)
    if not rows:
        raise TunerError(f"no study in {store.shown_url} has ok results for both {config_a} and {config_b}")
    rows.sort(key=lambda r: (r["space"], r["workload"], r["device"], r["C"], r["study"]))
    click.echo(render(rows, fmt, _compare_brief))


def _parse_config(text: str):
    from .adapter import default_adapter

    try:
        return default_adapter().parse_config(text)
    except ValueError as e:
        raise TunerError(str(e)) from None


@cli.command(short_help="Every study: space, workload, concurrency, device, noise band, trial counts, kernel.")
@format_option
@db_option
@expected_errors
def studies(fmt, db_url):
    """Every study: space, workload, concurrency, device, backend, noise band and trial counts."""
    from sqlalchemy import select

    from ..db import queries
    from ..db.models import StudyModel
    from ..db.store import Store

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
    click.echo(render(rows, fmt, _studies_brief))


@cli.group()
def db() -> None:
    """The results database."""


@db.command(short_help="Migrate an older results database to the current schema; label old Optuna studies.")
@db_option
@expected_errors
def upgrade(db_url):
    """Migrate an older results database to the current schema (nothing is dropped), and give every Optuna
    study that an older search left without them its metric name and attributes (optuna-dashboard shows
    every study alike)."""
    from ..db.errors import DatabaseReadOnlyError
    from ..db.store import Store
    from ..db.store import head_revision
    from .upgrade import METRIC
    from .upgrade import label_studies

    try:
        store = Store(db_url, upgrade=True, create=False)
    except DatabaseReadOnlyError as e:
        _upgrade_read_only(db_url, e)
        return
    labelled = label_studies(store)
    click.echo(f"{store.shown_url} is at schema {store.revision()} (head {head_revision()})", err=True)
    if labelled:
        click.echo(f"labelled {labelled} Optuna studies with their metric name ({METRIC}) and attributes", err=True)


def _upgrade_read_only(db_url: str, refused) -> None:
    """``tuner db upgrade`` of a database this process cannot write: a no-op when it is at the current schema with
    nothing to label, else ``refused`` (the read-only sentence) with what the upgrade would have to write."""
    from ..db.errors import DatabaseError
    from ..db.store import Store
    from ..db.store import check_optuna_schema
    from ..db.store import head_revision
    from .upgrade import unlabelled_studies

    try:
        store = Store(db_url, readonly=True)
    except DatabaseError as e:
        if "tuner db upgrade" not in str(e):  # damaged, not a database, ...: that is what to say
            raise
        raise DatabaseError(f"{refused}; it is at an older schema, so upgrading it needs to write") from None
    check_optuna_schema(store.engine, store.shown_url)
    n = unlabelled_studies(store)
    if n:
        raise DatabaseError(f"{refused}; {n} of its Optuna studies need labels, so upgrading it needs to write")
    click.echo(f"{store.shown_url} is at schema {store.revision()} (head {head_revision()}): nothing to do", err=True)


def _compact_brief(rows: list[dict]) -> list[dict]:
    keys = ("kernel", "studies", "trials", "samples", "kept", "samples_dropped", "optuna_studies_dropped")
    names = ("kernel", "studies", "trials", "samples", "kept", "samples out", "optuna studies out")
    out = [{n: r[k] for n, k in zip(names, keys, strict=True)} for r in rows]
    for o, r in zip(out, rows, strict=True):
        if "optuna_unlaunched_dropped" in r:
            o["optuna unlaunched out"] = r["optuna_unlaunched_dropped"]
    return out


@db.command(short_help="Drop superseded kernels' raw samples and Optuna studies (trials and statistics kept).")
@click.option(
    "--keep-kernel",
    "keep",
    multiple=True,
    metavar="HASH",
    help="Keep this kernel's samples too (repeatable; each level's newest kernel is always kept).",
)
@click.option(
    "--drop-unlaunched",
    is_flag=True,
    help="Also drop every study's Optuna trials of configs that launched nothing (infeasible, duplicate); the "
    "tuner's own trials keep those verdicts.",
)
@click.option("--dry-run", is_flag=True, help="Only say what would go and the size after (on a temporary copy).")
@format_option
@db_option
@expected_errors
def compact(keep, drop_unlaunched, dry_run, fmt, db_url):
    """Drop the raw samples and Optuna studies of superseded kernels, keeping their trials and statistics; VACUUM."""
    from .compact import compact as run

    done = run(db_url, tuple(keep), dry_run, unlaunched=drop_unlaunched)
    click.echo(render(done.rows, fmt, _compact_brief))
    mb = 1024 * 1024
    what = "would be" if dry_run else "is now"
    click.echo(
        f"{done.url}: {done.bytes_before / mb:.1f} MiB, {what} {done.bytes_after / mb:.1f} MiB"
        + (" (dry run: nothing changed)" if dry_run else ""),
        err=True,
    )


def main() -> None:
    """Usage errors too are one line (click's default prints the usage block first). Ctrl-C at any moment is one
    line and exit status 130 (tuner/__init__.py guards the imports before this and the shutdown after)."""
    from . import guard_shutdown
    from . import release_import_guard

    release_import_guard()
    try:
        code = _run()
        guard_shutdown(code)  # from here on a Ctrl-C ends the process at once
    except KeyboardInterrupt:  # one that came between the command's end and the guard
        click.echo("interrupted", err=True)
        code = 130
        guard_shutdown(code)
    sys.exit(code)


def _run() -> int:
    from . import interrupted

    try:
        rv = cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        return 130
    except click.ClickException as e:
        click.echo(f"error: {one_line(e.format_message())} (see `tuner --help`)", err=True)
        return e.exit_code
    except SystemExit as e:
        if isinstance(e.code, str):  # as the interpreter would say it
            click.echo(e.code, err=True)
        return e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    except Exception as e:
        if not interrupted(e):  # a Ctrl-C inside an extension module's import surfaces as another error
            raise
        click.echo("interrupted", err=True)
        return 130
    return rv if isinstance(rv, int) else 0
