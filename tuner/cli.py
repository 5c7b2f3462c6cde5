"""The ``tuner`` command line: one command per action; data on stdout, messages on stderr."""

from __future__ import annotations

import sys

import click

from tuner import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tuner")
def cli() -> None:
    """Autotuner for the sparse-MLA decode kernel (DeepSeek V3.2 / V4 FP8 KV caches)."""


def main() -> None:
    sys.exit(cli.main(standalone_mode=True))
