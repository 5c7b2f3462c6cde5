"""Test setup: without CUDA the kernel runs under Triton's interpreter.

``@triton.jit`` decides interpreter-or-compiler when ``kernels.decode`` is imported, so the variable
is set here, before any test module imports the kernel.
"""

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
from filelock import FileLock
from sqlalchemy import create_engine
from sqlalchemy import text

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

HAS_CUDA = torch.cuda.is_available()
ROOT = Path(__file__).resolve().parent.parent


def _build_results_db() -> None:
    """results/h200.db is a build product (results/h200_db.py: its base and deltas): built here, once per change
    of its parts, before any test reads it (under a lock: the xdist workers import this file at once)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("h200_db", ROOT / "results" / "h200_db.py")
    h200_db = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(h200_db)
    with FileLock(ROOT / "results" / ".h200.db.lock"):
        h200_db.build()


_build_results_db()
PG = os.environ.get("TUNER_TEST_PG")  # e.g. postgresql+psycopg://postgres:postgres@127.0.0.1/postgres


def _pg_database():
    """A fresh PostgreSQL database on the test server, dropped afterwards (a generator: yields its URL)."""
    name = f"tuner_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG, isolation_level="AUTOCOMMIT")
    with admin.connect() as con:
        con.execute(text(f"CREATE DATABASE {name}"))
    yield PG.rsplit("/", 1)[0] + "/" + name
    with admin.connect() as con:
        con.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """A fresh results database: SQLite, and PostgreSQL when the run has a server (``TUNER_TEST_PG``)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'w.db'}"
        return
    if not PG:
        pytest.skip("TUNER_TEST_PG is not set (CI starts a PostgreSQL server and sets it)")
    yield from _pg_database()


def tuner_in_process(*args: str) -> subprocess.CompletedProcess:
    """``tuner ARGS`` run by its executable's own entry point (:func:`tuner.cli.main`) in this process: its exit
    status, stdout and stderr, without an interpreter start per call. For the commands that only read and write
    the database and files (queries, export, report, check) and for replay searches (``--backend replay``: no
    kernel runs, no measurement process starts); a search that measures runs as its own process."""
    from click.testing import CliRunner

    from sparse_mla_tuner.tuner.cli import main

    argv = sys.argv
    with CliRunner().isolation() as (out, err, _):
        sys.argv = ["tuner", *args]
        try:
            main()
            code = 0  # main() always exits
        except SystemExit as e:
            if isinstance(e.code, str):  # as the interpreter does on its way out
                print(e.code, file=sys.stderr)
            code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        finally:
            sys.argv = argv
            sys.stdout.flush()
            sys.stderr.flush()
        stdout, stderr = out.getvalue().decode(), err.getvalue().decode()
    return subprocess.CompletedProcess(["tuner", *args], code, stdout, stderr)


def tuner_processes(runs, prefix=(), env=None, timeout=600) -> list[subprocess.CompletedProcess]:
    """Each ``tuner ARGS`` of ``runs`` in a process of its own, through the executable's own entry point
    (:func:`tuner.cli.main`), one after another, every one forked from one process that imported the tuner once
    (tests/many_searches.py): one interpreter start for them all. ``prefix`` starts that process under a wrapper
    (a read-only mount: tests/test_hardening.py), ``env`` with that environment. Their exit statuses, stdout and
    stderr, in order."""
    runs = [[str(a) for a in args] for args in runs]
    proc = subprocess.run(
        [*prefix, sys.executable, str(ROOT / "tests" / "many_searches.py")],
        input=json.dumps({"runs": runs, "together": False}), capture_output=True, text=True, cwd=ROOT,
        env=env, timeout=timeout,
    )  # fmt: skip  # the limit only guards against a hang
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr[-3000:]
    done = json.loads(proc.stdout.splitlines()[-1])
    return [
        subprocess.CompletedProcess(["tuner", *args], r["rc"], r["stdout"], r["stderr"])
        for args, r in zip(runs, done, strict=True)
    ]


SMOKE_MEASUREMENT = "rounds: 4, finalists: 2, finalist_rounds: 5"  # search_spaces/smoke.yaml's


def cheap_smoke(folder: Path, trial_timeout_s: int = 60) -> str:
    """The smoke space with the fewest rounds allowed (and ``trial_timeout_s``) written in ``folder``: its path. For
    the searches whose test is about their trials, processes and database (killed, interrupted, faulted, shared by
    workers), not about how many rounds a trial measures (tests/test_search.py's smoke search checks those)."""
    text = (ROOT / "search_spaces" / "smoke.yaml").read_text()
    assert SMOKE_MEASUREMENT in text and "trial_timeout_s: 60" in text, "smoke.yaml's measurement changed"
    text = text.replace(SMOKE_MEASUREMENT, "rounds: 3, finalists: 1, finalist_rounds: 3")
    path = folder / "cheap.yaml"
    path.write_text(text.replace("trial_timeout_s: 60", f"trial_timeout_s: {trial_timeout_s}"))
    return str(path)


@pytest.fixture(scope="session")
def smoke_search(tmp_path_factory):
    """One smoke search under the interpreter (``tuner search search_spaces/smoke.yaml``) for the whole run, which
    test_search.py queries and test_strategies.py replays: the xdist workers share it (the first to need it runs
    it, under a file lock, the other waits for it). Its ``path`` is read-only: users copy it. Also its exit status,
    stdout, stderr and wall time."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the workers' common folder
    folder, run = shared / "smoke-search", shared / "smoke-search" / "run.json"
    with FileLock(str(shared / "smoke-search.lock")):
        if not run.exists():
            folder.mkdir(exist_ok=True)
            t0 = time.monotonic()
            proc = subprocess.run(
                [sys.executable, "-m", "sparse_mla_tuner.tuner", "search", "search_spaces/smoke.yaml", "--db",
                 f"sqlite:///{folder / 'tuner.db'}", "-q"],
                capture_output=True, text=True, cwd=ROOT, timeout=1800,
                # piped and unfitted, whatever width the test that first asks for it has set
                env={k: v for k, v in os.environ.items() if k != "COLUMNS"},
            )  # fmt: skip
            fields = {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}
            run.write_text(json.dumps({**fields, "wall_s": time.monotonic() - t0}))
    return {**json.loads(run.read_text()), "path": folder / "tuner.db"}


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """Three workers, each running whole test files in order, when pytest-xdist is installed (the dev extra)
    and no ``-n`` was given: the suite is mostly one process waiting on another (searches, compiles, killed
    hosts' grace periods), so on 2 cores two workers left about a third of the CPU idle (14.4 CPU-minutes in
    11.1 minutes) and a third worker fills it (the same work in 7.6 minutes: `git show 315e042:README.md`, Tests).
    ``-n 0`` runs it in one process; without xdist it runs in one."""
    if config.pluginmanager.hasplugin("xdist") and config.option.numprocesses is None:
        if not hasattr(config, "workerinput"):
            config.option.numprocesses = 3
            config.option.dist = "loadfile"
            config.option.loadscopereorder = False  # files in the order FIRST gives, not by their number of tests


# The files that take longest (--durations on the 2-core machine), longest first: the workers take files in
# collection order, each the next one when it is nearly done, so the long ones start at once, one per worker,
# and the short ones even out the end. test_strategies.py comes after test_search.py's start, so the smoke
# search they share (smoke_search) is running or done when it needs it.
FIRST = (
    "test_search.py", "test_decode_call.py", "test_decode.py", "test_resources.py", "test_feasibility.py",
    "test_workers.py", "test_hardening.py", "test_verdicts.py", "test_whole_call.py", "test_faults.py",
    "test_export.py", "test_strategies.py", "test_db.py",
)  # fmt: skip


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):  # a worker's collection is what the scheduler hands out in order
        rank = {name: i for i, name in enumerate(FIRST)}
        items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))  # stable: files keep their own order
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)


@pytest.fixture
def device():
    return "cuda" if HAS_CUDA else "cpu"
