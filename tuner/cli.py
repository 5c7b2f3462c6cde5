"""The ``tuner`` command line: one command per action; data on stdout, messages on stderr."""

from __future__ import annotations

import functools
import os
import sys

import click

from tuner import __version__
from tuner.errors import TunerError
from tuner.output import format_option
from tuner.output import render

CHECK_FIELDS = ("BLOCK_T", "num_warps", "num_stages", "TARGET_CTAS", "shared_bytes", "limit_bytes", "registers",
                "spill_bytes", "estimate_bytes", "feasible", "reason")  # fmt: skip


def expected_errors(fn):
    """Expected failures become one sentence on stderr and exit status 2, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TunerError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)

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
@format_option
@db_option
@expected_errors
def check(space_file: str, target: str | None, workload_name: str | None, fmt: str, db_url: str) -> None:
    """Which configs of SPACE_FILE fit the target arch, and why not. Compiles only; needs no GPU.

    One row per config x workload. Verdicts are cached, so a second check is fast. With
    several workloads, json/csv rows also carry a `workload` field.
    """
    from tuner.feasibility import check_many
    from tuner.space import TARGETS
    from tuner.space import load_space

    space = load_space(space_file)
    target = target or space.target
    if target not in TARGETS:
        raise TunerError(f"--target must be one of {sorted(TARGETS)}, got {target!r}")
    workloads = [w for w in space.workloads if workload_name in (None, w.name)]
    if not workloads:
        raise TunerError(
            f"--workload {workload_name!r} is not in {space.path}; it has {[w.name for w in space.workloads]}"
        )
    configs = space.configs()
    rows, n_ok = [], 0
    for w in workloads:
        click.echo(f"checking {len(configs)} configs of {space.name}/{w.name} for {target} ...", err=True)
        verdicts = check_many(configs, w.workload(), target, max_spill_bytes=space.max_spill_bytes)
        for cfg, v in zip(configs, verdicts, strict=True):
            row = {**({"workload": w.name} if len(workloads) > 1 else {}), **cfg.as_dict(), **v.as_dict()}
            rows.append({k: row[k] for k in (("workload",) if len(workloads) > 1 else ()) + CHECK_FIELDS})
            n_ok += v.feasible
    click.echo(render(rows, fmt))
    summary = f"{n_ok} feasible / {len(rows) - n_ok} infeasible for {target}"
    click.echo(summary, err=fmt != "table")


def main() -> None:
    cli.main(standalone_mode=True)
