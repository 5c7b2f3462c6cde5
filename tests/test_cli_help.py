"""Every command explains itself: every option has help text, every argument is named in its command's
help, the top-level help lists every command whole, and shell completion is documented."""

import click
import pytest

from sparse_mla_tuner.tuner.cli import cli
from tests.conftest import tuner_in_process as tuner


def _commands(group: click.Group, path: tuple[str, ...] = ()):
    for name, cmd in group.commands.items():
        yield (*path, name), cmd
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*path, name))


COMMANDS = list(_commands(cli))


@pytest.mark.parametrize(("path", "cmd"), COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_every_option_has_help_and_every_argument_is_explained(path, cmd):
    assert (cmd.help or "").strip(), f"tuner {' '.join(path)} has no help"
    for param in cmd.params:
        if isinstance(param, click.Option) and not param.hidden:
            assert (param.help or "").strip(), f"tuner {' '.join(path)} {param.opts[0]} has no help text"
        elif isinstance(param, click.Argument):
            assert param.name.upper() in cmd.help, f"tuner {' '.join(path)}: {param.name.upper()} is not explained"


@pytest.mark.parametrize("columns", ["80", "100"])
def test_the_top_level_help_lists_every_command_uncut(columns, monkeypatch):
    monkeypatch.setenv("COLUMNS", columns)
    text = tuner("--help").stdout
    listing = text[text.index("Commands:") :]
    for name, cmd in cli.commands.items():
        short = " ".join(cmd.get_short_help_str(limit=10_000).split())
        assert short and not short.endswith("..."), name
        assert short in " ".join(listing.split()), (name, short)  # whole, however it wraps
    assert "_TUNER_COMPLETE=bash_source tuner" in text


def test_every_command_help_runs(monkeypatch):
    for path, _ in COMMANDS:
        proc = tuner(*path, "--help")
        assert proc.returncode == 0 and "Usage:" in proc.stdout, (path, proc.stderr)
