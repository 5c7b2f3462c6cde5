"""One formatter for every listing: ``-f table|json|csv``; data on stdout only."""

from __future__ import annotations

import csv
import io
import json

import click
from tabulate import tabulate

FORMATS = ("table", "json", "csv")

format_option = click.option(
    "-f", "--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True, help="Output format."
)


def render(rows: list[dict], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(rows, indent=1)
    if fmt == "csv":
        buf = io.StringIO()
        if rows:
            writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
        return buf.getvalue().rstrip("\n")
    return tabulate(rows, headers="keys", disable_numparse=True) if rows else "(no rows)"
