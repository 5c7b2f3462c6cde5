"""One formatter for every listing: ``-f table|json|csv``; data on stdout only.

A table shows by default a brief view that fits :data:`WIDTH` columns (the columns a command names
as its brief ones, long cells cut with ``…``); ``--wide`` shows every field, and json and csv always
carry every field.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable

import click
import tabulate as tabulate_module
from tabulate import tabulate

FORMATS = ("table", "json", "csv")
WIDTH = 100  # the widest a default table may be: a terminal beside an editor, a log viewer, a review
GAP = 2  # tabulate's "simple" format puts two spaces between columns
MIN_CELL = 8  # a cut cell keeps at least this many characters
KEEP = ("config", "best")  # config keys are never cut: a cut key names another config
CUT_FIRST = ("ties", "TARGET_CTAS", "reason", "other", "space", "workload", "device", "study", "value")  # may give way
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # line ends, tabs, terminal escapes: shown, never obeyed
tabulate_module.MIN_PADDING = 0  # a column as wide as its widest cell or header, no more (GAP apart)


def _wide(ctx: click.Context, _param, value: bool) -> bool:
    if value:
        ctx.meta["tuner.wide"] = True
    return value


def format_option(fn):
    """``-f/--format table|json|csv`` and ``--wide`` (a table with every field, however wide)."""
    fn = click.option(
        "--wide",
        is_flag=True,
        expose_value=False,
        callback=_wide,
        help=f"table: every field (default: the main ones, fitting {WIDTH} columns).",
    )(fn)
    return click.option(
        "-f", "--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True, help="Output format."
    )(fn)


def wide() -> bool:
    """``--wide`` was given (click shares ``meta`` between a command's contexts)."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx and ctx.meta.get("tuner.wide"))


def render(rows: list[dict], fmt: str, brief: Callable[[list[dict]], list[dict]] | None = None) -> str:
    """``rows`` as ``fmt``. A table without ``--wide`` shows ``brief(rows)``, fitted to WIDTH."""
    if fmt == "json":
        return json.dumps(rows, indent=1)
    if fmt == "csv":
        buf = io.StringIO()
        if rows:
            writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
        return buf.getvalue().rstrip("\n")
    if not rows:
        return "(no rows)"
    if brief is None or wide():
        safe = [{plain(k): plain(v) if isinstance(v, str) else v for k, v in r.items()} for r in rows]
        return tabulate(safe, headers="keys", disable_numparse=True)
    try:
        shown = brief(rows)
    except Exception:  # noqa: BLE001 - rows of another shape than the brief view knows: every field, fitted
        shown = rows
    return table(shown)


def varying(rows: list[dict], *keys: str) -> list[str]:
    """The ``keys`` whose value is not the same in every row (columns worth a place in a brief view)."""
    return [k for k in keys if len({str(r.get(k)) for r in rows}) > 1]


def plain(value) -> str:
    """A cell as text: control characters (a stored name may hold a newline or a terminal escape) are
    written as escapes, so a cell is one line and the terminal only ever shows it."""
    text = "" if value is None else str(value)
    return _CONTROL.sub(lambda m: m.group(0).encode("unicode_escape").decode("ascii"), text)


def cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[: max(n - 1, 1)] + "…"


def table(rows: list[dict], width: int = WIDTH) -> str:
    """A plain table of ``rows`` no wider than ``width``: the widest columns give way first, their cells
    cut with ``…`` (never below MIN_CELL characters, and a header never below its own name's start)."""
    keys = list(rows[0])
    cells = [[plain(r.get(k)) for k in keys] for r in rows]
    widths = [max([len(k)] + [len(c[i]) for c in cells]) for i, k in enumerate(keys)]
    limit = list(widths)

    def total() -> int:
        return sum(limit) + GAP * (len(keys) - 1)

    for names in (CUT_FIRST, None):  # names, then any column but a config key
        while total() > width:
            cuttable = [
                j for j, k in enumerate(keys) if k not in KEEP and (names is None or k in names) and limit[j] > MIN_CELL
            ]
            if not cuttable:
                break
            i = max(cuttable, key=lambda j: limit[j])
            others = [limit[j] for j in cuttable if j != i]
            # down to the next widest column (then both give way together), or as far as needed
            step = min(limit[i] - max(others + [MIN_CELL]) or 1, total() - width, limit[i] - MIN_CELL)
            limit[i] -= max(step, 1)
    heads = [cut(k, limit[i]) for i, k in enumerate(keys)]
    body = [[cut(c[i], limit[i]) for i in range(len(keys))] for c in cells]
    return tabulate(body, headers=heads, disable_numparse=True)
