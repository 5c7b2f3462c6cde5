"""results/h200.db is built from a base that never changes and deltas that are only ever added
(results/h200_db.py): a run's changes, turned into a delta and applied, give back that run's database exactly."""

import hashlib
import importlib.util
import json
import lzma
import shutil
import sqlite3
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.recorded import make_results

spec = importlib.util.spec_from_file_location("h200_db", ROOT / "results" / "h200_db.py")
h200_db = importlib.util.module_from_spec(spec)
spec.loader.exec_module(h200_db)


def _dump(path) -> list[str]:
    con = sqlite3.connect(path)
    try:
        return sorted(con.iterdump())  # the same statements (sqlite_master's order is the order things were made)
    finally:
        con.close()


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return make_results(tmp_path_factory.mktemp("small") / "old.db")


def test_a_runs_changes_round_trip_through_a_delta(small, tmp_path):
    """Added rows, changed rows, removed rows and a new table: old + delta == new, through the file format."""
    new = tmp_path / "new.db"
    shutil.copy(small, new)
    con = sqlite3.connect(new)
    with con:
        n = con.execute("SELECT COUNT(*) FROM tuner_trials").fetchone()[0]
        con.execute(
            "INSERT INTO tuner_kernels (source_hash, adapter) VALUES ('f' || hex(randomblob(31)), 'sparse_mla')"
        )
        con.execute(
            "UPDATE tuner_statistics SET median_us = median_us * 0.5 WHERE id = (SELECT MIN(id) FROM tuner_statistics)"
        )
        con.execute("DELETE FROM tuner_samples WHERE id IN (SELECT id FROM tuner_samples LIMIT 3)")
        con.execute("CREATE TABLE tuner_extra (id INTEGER PRIMARY KEY, note TEXT)")
        con.execute("INSERT INTO tuner_extra (note) VALUES ('a run''s note'), (NULL)")
    con.close()
    assert n > 0
    old, fresh = sqlite3.connect(small), sqlite3.connect(new)
    delta = h200_db.make_delta(old, fresh)
    old.close(), fresh.close()
    assert set(delta["rows"]) == {"tuner_kernels", "tuner_statistics", "tuner_samples", "tuner_extra"}
    assert len(delta["rows"]["tuner_samples"]["delete"]) == 3 and not delta["rows"]["tuner_samples"]["rowids"]
    assert len(delta["rows"]["tuner_statistics"]["rowids"]) == 1  # only what changed, not the table
    text = lzma.compress(json.dumps(delta).encode())
    applied = tmp_path / "applied.db"
    shutil.copy(small, applied)
    con = sqlite3.connect(applied)
    with con:
        h200_db.apply_delta(con, json.loads(lzma.decompress(text)))
    con.close()
    assert _dump(applied) == _dump(new)


def test_a_migrations_schema_change_round_trips_too(small, tmp_path):
    """A new column (a migration's ALTER TABLE) and a new index: the changed table is made anew, whole."""
    new = tmp_path / "new.db"
    shutil.copy(small, new)
    con = sqlite3.connect(new)
    with con:
        con.execute("ALTER TABLE tuner_trials ADD COLUMN NEWPARAM INTEGER NOT NULL DEFAULT 0")
        con.execute("UPDATE tuner_trials SET NEWPARAM = 1 WHERE id = (SELECT MIN(id) FROM tuner_trials)")
        con.execute("CREATE INDEX ix_tuner_trials_newparam ON tuner_trials (NEWPARAM)")
        con.execute("DROP TABLE tuner_exports")
    old = sqlite3.connect(small)
    delta = h200_db.make_delta(old, con)
    old.close(), con.close()
    assert set(delta["tables"]) == {"tuner_trials"} and delta["drop"] == ["tuner_exports"]
    trials = delta["rows"]["tuner_trials"]  # remade whole, but only the new column's values travel
    assert "id" in trials["reuse"] and "NEWPARAM" not in trials["reuse"]
    assert all(not v for c, v in zip(trials["columns"], trials["values"], strict=True) if c in trials["reuse"])
    applied = tmp_path / "applied.db"
    shutil.copy(small, applied)
    con = sqlite3.connect(applied)
    with con:
        h200_db.apply_delta(con, json.loads(lzma.decompress(lzma.compress(json.dumps(delta).encode()))))
    con.close()
    assert _dump(applied) == _dump(new)


def test_the_built_database_is_current_and_its_base_never_changes():
    """The tests' results/h200.db (built by conftest.py) holds the base and every delta; the base's bytes are the
    ones it was committed with: a re-tune adds a delta, it never rewrites a binary in git."""
    assert h200_db.is_current()
    digest = hashlib.sha256(h200_db.BASE.read_bytes()).hexdigest()
    assert digest == h200_db.BASE_SHA256
    ignored = subprocess.run(["git", "check-ignore", "-q", "results/h200.db"], cwd=ROOT)
    assert ignored.returncode in (0, 128)  # ignored by git (128: not a git checkout, e.g. an unpacked sdist)


def test_the_command_line_says_what_is_wrong_in_one_sentence(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "results" / "h200_db.py"), "delta", str(tmp_path / "missing.db")],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and len(proc.stderr.splitlines()) == 1
    proc = subprocess.run(
        [sys.executable, str(ROOT / "results" / "h200_db.py"), "build"], capture_output=True, text=True
    )
    assert proc.returncode == 0 and "is current" in proc.stderr
