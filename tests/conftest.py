"""Test setup: without CUDA the kernel runs under Triton's interpreter.

``@triton.jit`` decides interpreter-or-compiler when ``kernels.decode`` is imported, so the variable
is set here, before any test module imports the kernel.
"""

import os
import uuid

import pytest
import torch
from sqlalchemy import create_engine
from sqlalchemy import text

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

HAS_CUDA = torch.cuda.is_available()
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


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """Two workers, each running whole test files in order, when pytest-xdist is installed (the dev extra)
    and no ``-n`` was given: the suite is mostly one process waiting on another (searches, compiles), so
    two workers nearly halve it on 2 cores. ``-n 0`` runs it in one process; without xdist it runs in one."""
    if config.pluginmanager.hasplugin("xdist") and config.option.numprocesses is None:
        if not hasattr(config, "workerinput"):
            config.option.numprocesses = 2
            config.option.dist = "loadfile"


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)


@pytest.fixture
def device():
    return "cuda" if HAS_CUDA else "cpu"
