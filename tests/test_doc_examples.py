"""Every code example of README.md and docs/ runs, as installed, so that none can rot.

A fenced block's info string is its language and then its marks, visible in the Markdown source::

    ```bash gpu        needs a CUDA GPU (its commands are probed with --help, not run)
    ```bash long       runs for minutes (the same)
    ```bash install    installs packages: .ci/run runs these lines (checked against it here)
    ```python engine   a piece of an engine's own code (runs inside the engine: parsed, not run)

Every line of a ``bash`` block is a command: ``tuner ...``, ``python -m sparse_mla_tuner...`` and ``python
SCRIPT.py ...`` are run with ``--help`` appended (click and argparse refuse an unknown command or option before
they print the help, so a renamed option fails here), whatever the block's marks; any other command must be in a
marked block. A ``python`` block without marks runs whole (under Triton's interpreter on a CPU), a ``gpu`` one is
compiled only; ``yaml`` and ``toml`` blocks are parsed. No block imports the checkout's folders as top-level
packages (``import kernels.x``): an installed wheel has only ``sparse_mla_tuner``.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import tomllib
import yaml

from tests.conftest import ROOT
from tests.conftest import tuner_in_process

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKS = {"gpu", "long", "install", "engine"}
FENCE = re.compile(r"^```(.*)$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    language: str
    marks: frozenset[str]
    text: str

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    out, open_at, info, body = [], None, "", []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        m = FENCE.match(line)
        if m and open_at is None:
            open_at, info, body = n, m.group(1).split(), []
        elif m and line.strip() == "```":
            language, marks = (info[0], frozenset(info[1:])) if info else ("", frozenset())
            out.append(Block(path, open_at, language, marks, "\n".join(body) + "\n"))
            open_at = None
        elif open_at is not None:
            body.append(line)
    assert open_at is None, f"{path}: the block opened at line {open_at} is not closed"
    return out


BLOCKS = [b for path in DOCS for b in blocks(path)]


def commands(text: str) -> list[list[str]]:
    """A bash block's commands: continuations joined, comments dropped, split at ``&&``, ``;`` and ``|``, leading
    ``NAME=value`` assignments dropped (an ``export NAME=value`` line sets the environment: no command)."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split, lexer.commenters = True, "#"
        words, current = list(lexer), []
        for w in [*words, ";"]:
            if w in (";", "&&", "|", "||", "&"):
                while current and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", current[0]):
                    current.pop(0)
                if current and current[0] != "export":
                    out.append(current)
                current = []
            else:
                current.append(w)
    return out


@cache
def _python_help(argv: tuple[str, ...]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *argv, "--help"], capture_output=True, text=True, cwd=ROOT, timeout=300,
        env={**os.environ, "COLUMNS": "120"},
    )  # fmt: skip


def probe(cmd: list[str]) -> str | None:
    """Run a command of ours with ``--help``: None when it is not one of ours, else what went wrong ("" if nothing)."""
    if cmd[0] == "tuner":
        proc = tuner_in_process(*cmd[1:], "--help")
    elif cmd[0] in ("python", "python3") and cmd[1:2] == ["-m"] and cmd[2].startswith("sparse_mla_tuner"):
        proc = _python_help(("-m", cmd[2]))
    elif cmd[0] in ("python", "python3") and len(cmd) > 1 and cmd[1].endswith(".py") and (ROOT / cmd[1]).is_file():
        proc = _python_help((cmd[1],))
    else:
        return None
    ok = proc.returncode == 0 and ("Usage:" in proc.stdout or "usage:" in proc.stdout)
    return "" if ok else f"exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-300:]}"


def _ids(items):
    return [b.id for b in items]


BASH = [b for b in BLOCKS if b.language in ("bash", "sh", "shell")]


def test_the_blocks_are_found_and_marked_with_known_marks():
    assert len(BASH) >= 8 and any(b.language == "python" for b in BLOCKS)
    unknown = [(b.id, sorted(b.marks - MARKS)) for b in BLOCKS if b.marks - MARKS]
    assert not unknown, f"unknown marks (allowed: {sorted(MARKS)}): {unknown}"


@pytest.mark.parametrize("block", BASH, ids=_ids(BASH))
def test_every_command_of_a_bash_block_is_ours_and_answers_help(block):
    first_readme_block = block.path.name == "README.md" and block is BASH[0]
    for cmd in commands(block.text):
        if first_readme_block and cmd[0] in ("python3", "pip", "."):  # the fresh machine's set-up line (below)
            continue
        if "install" in block.marks and (cmd[0] == "pip" or cmd[:3] == ["python", "-m", "pytest"]):
            continue  # install lines: .ci/run runs them (test_ci_runs_the_readmes_install_lines)
        problem = probe(cmd)
        if problem is None:
            assert block.marks & {"gpu", "long"}, (
                f"{block.id}: `{shlex.join(cmd)}` is not a command of ours: mark the block"
            )
        else:
            assert problem == "", f"{block.id}: `{shlex.join(cmd)} --help`: {problem}"


def _ci_commands() -> set[str]:
    text = (ROOT / ".ci" / "run").read_text()
    return {" ".join(w for w in cmd if w != "-q") for cmd in map(tuple, commands(text))}


def test_ci_runs_the_readmes_install_lines():
    """.ci/run installs as the README tells a user and a contributor, and runs exactly its test command."""
    ci = _ci_commands()
    readme = [b for b in BASH if b.path.name == "README.md"]
    install = [readme[0], *(b for b in readme if "install" in b.marks)]
    lines = [
        cmd for b in install for cmd in commands(b.text) if cmd[0] == "pip" or cmd[:3] == ["python", "-m", "pytest"]
    ]
    assert any(cmd[:3] == ["python", "-m", "pytest"] for cmd in lines)
    for cmd in lines:
        assert " ".join(w for w in cmd if w != "-q") in ci, f".ci/run does not run the README's `{shlex.join(cmd)}`"
    first = readme[0].text.splitlines()
    assert len(first) == 2 and "pip install -e ." in first[0] and first[1].startswith("tuner search")


CODE = [b for b in BLOCKS if b.language == "python"]


@pytest.mark.parametrize("block", CODE, ids=_ids(CODE))
def test_no_example_imports_the_checkouts_folders_as_packages(block):
    for node in ast.walk(ast.parse(block.text)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        bad = [n for n in names if n.split(".")[0] in ("kernels", "db", "tuner")]
        assert not bad, f"{block.id} imports {bad}: installed, they are sparse_mla_tuner.{bad[0]}"


RUN = [b for b in CODE if not b.marks]


def _interpret() -> str:
    return os.environ.get("TRITON_INTERPRET", "0")


@pytest.mark.parametrize("block", RUN, ids=_ids(RUN))
def test_every_python_example_runs(block):
    proc = subprocess.run(
        [sys.executable, "-c", block.text],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        env={**{k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}, "TRITON_INTERPRET": _interpret()},
    )  # fmt: skip  (the working folder on sys.path, as a reader's `python` in a checkout: examples/ imports)
    assert proc.returncode == 0, f"{block.id}:\n{proc.stderr[-2000:]}"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.language in ("yaml", "toml")], ids=lambda b: b.id)
def test_every_yaml_and_toml_example_parses(block):
    if block.language == "yaml":
        yaml.safe_load(block.text)
    else:
        tomllib.loads(block.text)


def test_the_readme_and_the_benchmarks_are_short():
    """A user's page and the current state; the history is in git and results/ledger.jsonl."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150
    assert len((ROOT / "docs" / "benchmarks.md").read_text().splitlines()) <= 250
