"""One formatter for every listing: ``-f table|json|csv``; data on stdout only.

A table shows by default a brief view (the columns a command names as its brief ones) sized to the terminal:
``$COLUMNS`` when set, else the terminal's width when stdout is one; piped output is not fitted. Where a table is
wider than that, its free-text columns (a reason, a list of ties) wrap at spaces, then the least important columns
are left out (said on stderr); no cell is ever cut, so a config key or an interval is always whole, except stored
free text or a stored name beyond :data:`TEXT_MAX` characters (a reason a compiler or a hostile database wrote),
shown by :func:`bounded` with its length said, at a terminal or not, ``--wide`` too. ``--wide`` shows every field,
and json and csv always carry every field, whole.

The units of every quantity come from one place: :func:`us`, :func:`pct` and :func:`gbps`.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import sys
import textwrap
from collections.abc import Callable

import click
import tabulate as tabulate_module
from tabulate import tabulate

FORMATS = ("table", "json", "csv")
WIDTH = 100  # the width the README's examples and the tests' default assume (a terminal beside an editor)
GAP = 2  # tabulate's "simple" format puts two spaces between columns
WRAP = ("reason", "ties", "other", "value", "stopped", "kernels")  # free text: may wrap at spaces
MIN_WRAP = 16  # a wrapped column keeps this many characters before any column is left out
DROP = (  # left out first to last when wrapping is not enough (never a config key, median, verdict or kernel)
    "backend",
    "effect",
    "infeasible",
    "workload",
    "device",
    "ratio CI",
    "band",
    "ratio",
    "95% CI us",
    "95% CI",
    "space",
    "other",
    "ties",
    "reason",
)
# what a line never breaks inside: a number with its digit groups and unit ("101 376 B", "260 duplicate",
# "75.7 µs"), and a sign with what it signs ("± 1.0 %", "> limit")
_NUMBER = r"[0-9][0-9.,]*(?: [0-9]{3}\b)*(?: (?:GB/s|[a-zA-Zµ%]+))?"
_GLUE = re.compile(rf"[±<>=] (?:{_NUMBER}|\S+)|(?<![\w.]){_NUMBER}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # line ends, tabs, terminal escapes: shown, never obeyed
tabulate_module.MIN_PADDING = 0  # a column as wide as its widest cell or header, no more (GAP apart)


def us(value, digits: int = 1) -> str:
    """A time in microseconds: ``75.7 µs`` (one space, the one format of every µs shown)."""
    return "-" if value is None or not math.isfinite(value) else f"{value:.{digits}f} µs"


def pct(fraction, digits: int = 1, sign: bool = True) -> str:
    """A fraction as a percentage: ``±6.8 %`` (a band, a spread: ``sign``) or ``6.8 %``."""
    if fraction is None or not math.isfinite(fraction):
        return "-"
    return f"{'±' if sign else ''}{fraction * 100:.{digits}f} %"


def gbps(value, digits: int = 0) -> str:
    """A bandwidth: ``4120 GB/s``."""
    return "-" if value is None or not math.isfinite(value) else f"{value:.{digits}f} GB/s"


def terminal_width() -> int | None:
    """The width a table is fitted to: ``$COLUMNS`` when set, else the terminal's when stdout is one;
    ``None`` (no fitting: full values) when stdout is piped."""
    text = os.environ.get("COLUMNS", "").strip()
    if text.isascii() and text.isdigit() and len(text) <= 9 and int(text) > 0:  # as check_environment reads it
        return int(text)
    try:
        if sys.stdout.isatty():
            return os.get_terminal_size(sys.stdout.fileno()).columns
    except (OSError, ValueError, AttributeError):
        pass
    return None


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
        help="table: every field, however wide (default: the main ones, sized to the terminal).",
    )(fn)
    return click.option(
        "-f",
        "--format",
        "fmt",
        type=click.Choice(FORMATS),
        default="table",
        show_default=True,
        help="Output format: table (for people), json or csv (every field, for programs).",
    )(fn)


def wide() -> bool:
    """``--wide`` was given (click shares ``meta`` between a command's contexts)."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx and ctx.meta.get("tuner.wide"))


def render(rows: list[dict], fmt: str, brief: Callable[[list[dict]], list[dict]] | None = None) -> str:
    """``rows`` as ``fmt``. A table without ``--wide`` shows ``brief(rows)``, fitted to the terminal."""
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
        safe = [{plain(k): _cell(k, v) for k, v in r.items()} for r in rows]
        return tabulate(safe, headers="keys", disable_numparse=True)
    try:
        shown = brief(rows)
    except Exception:  # noqa: BLE001 - rows of another shape than the brief view knows: every field, fitted
        shown = rows
    shown = [{k: bounded(v) if k in NAMES and isinstance(v, str) else v for k, v in r.items()} for r in shown]
    width = terminal_width()
    text, left_out = fit(shown, width)
    if left_out:
        click.echo(f"({', '.join(left_out)} left out to fit {width} columns; --wide or -f json shows them)", err=True)
    return text


TEXT_MAX = 500  # characters of a stored free text (a reason) a table or the report shows
STORED_TEXT = ("reason", "stopped")  # the free text a trial or a study stores: bounded in every table, --wide too
# stored names: at most 64 characters as a space gives them, so only a hand-made database holds a longer one
NAMES = ("space", "workload", "study", "device", "name")


def _cell(key, value):
    if not isinstance(value, str):
        return value
    return plain(bounded(value) if key in STORED_TEXT or key in NAMES else value)


def bounded(text, limit: int = TEXT_MAX, whole: str = "-f json") -> str | None:
    """A stored free text of at most ``limit`` characters (about): a longer one is cut, its length said and where
    it is whole (``whole``); None stays None."""
    if text is None:
        return None
    text = str(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters; {whole} has it whole)"


def varying(rows: list[dict], *keys: str) -> list[str]:
    """The ``keys`` whose value is not the same in every row (columns worth a place in a brief view)."""
    return [k for k in keys if len({str(r.get(k)) for r in rows}) > 1]


def plain(value) -> str:
    """A cell as text: control characters (a stored name may hold a newline or a terminal escape) are
    written as escapes, so a cell is one line and the terminal only ever shows it."""
    text = "" if value is None else str(value)
    return _CONTROL.sub(lambda m: m.group(0).encode("unicode_escape").decode("ascii"), text)


def _glued(text: str) -> str:
    return _GLUE.sub(lambda m: m.group(0).replace(" ", "\x00"), text)


_BREAK = re.compile(r"(?<=[/,])(?=[^\s/,])")  # after a slash or a comma inside a word (a path, a study name)


def _longest_word(text: str) -> int:
    return max((len(p) for w in _glued(text).split() for p in _BREAK.split(w)), default=0)


def _wrap(text: str, width: int) -> str:
    """``text`` in lines of at most ``width`` characters, broken at spaces; a word longer than ``width`` (an
    Optuna study name, a path) also after its slashes and commas. Nothing is cut: a piece longer than
    ``width`` stays whole on its own line."""
    if len(text) <= width:
        return text
    glued = _glued(text)
    if max((len(w) for w in glued.split()), default=0) <= width:
        lines = textwrap.wrap(glued, width, break_long_words=False, break_on_hyphens=False)
        return "\n".join(lines).replace("\x00", " ") or text
    lines, line = [], ""
    for word in glued.split():
        for k, piece in enumerate(_BREAK.split(word)):
            joined = line + ("" if k else " ") + piece if line else piece
            if line and len(joined) > width:
                lines.append(line)
                line = piece
            else:
                line = joined
    lines.append(line)
    return "\n".join(lines).replace("\x00", " ")


def fit(rows: list[dict], width: int | None) -> tuple[str, list[str]]:
    """A plain table of ``rows`` no wider than ``width`` where that is possible without cutting a value:
    headers wrap at spaces; the free-text columns (:data:`WRAP`) wrap at spaces, the widest first,
    down to MIN_WRAP; then columns are left out in :data:`DROP`'s order; then the free text wraps down
    to its longest word. Returns the table and the names of the columns left out. ``width=None``: as
    wide as the values are."""
    keys = list(rows[0])
    cells = [[plain(r.get(k)) for k in keys] for r in rows]
    heads = [plain(k) for k in keys]
    natural = [max([len(heads[i])] + [len(c[i]) for c in cells]) for i in range(len(keys))]
    longest = [
        max([_longest_word(heads[i])] + [(_longest_word(c[i]) if keys[i] in WRAP else len(c[i])) for c in cells])
        for i in range(len(keys))
    ]
    limit = list(natural)
    shown = list(range(len(keys)))
    left_out: list[str] = []

    def total() -> int:
        return sum(limit[i] for i in shown) + GAP * (len(shown) - 1)

    def narrow(floor: int) -> bool:
        """Narrow the widest column that can give way (free text first) by as much as needed."""
        for pool in ([i for i in shown if keys[i] in WRAP], shown):
            can = [i for i in pool if limit[i] > max(longest[i], floor if keys[i] in WRAP else 0)]
            if can:
                i = max(can, key=lambda j: limit[j])
                low = max(longest[i], floor if keys[i] in WRAP else 0)
                limit[i] = max(low, limit[i] - (total() - width))
                return True
        return False

    if width is not None:
        while total() > width and narrow(MIN_WRAP):
            pass
        for name in DROP:
            if total() <= width:
                break
            idx = [i for i in shown if keys[i] == name]
            if idx and len(shown) > 1:
                shown.remove(idx[0])
                left_out.append(keys[idx[0]])
                limit = [natural[i] if keys[i] in WRAP else limit[i] for i in range(len(keys))]  # room again
                while total() > width and narrow(MIN_WRAP):
                    pass
        while total() > width and narrow(0):
            pass
    body = [[_wrap(c[i], limit[i]) for i in shown] for c in cells]
    head = [_wrap(heads[i], limit[i]) for i in shown]
    return tabulate(body, headers=head, disable_numparse=True), left_out


def table(rows: list[dict], width: int | None = WIDTH) -> str:
    """``rows`` fitted to ``width`` (see :func:`fit`), the columns left out unsaid."""
    return fit(rows, width)[0]
