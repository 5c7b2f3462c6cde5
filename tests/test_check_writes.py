"""A compile-only `tuner check` keeps its verdict cache in the database --db names (or $TUNER_DB), and
writes nothing into the working directory when that is elsewhere."""

import sqlite3
from pathlib import Path

from tests.conftest import tuner_in_process as tuner

SMOKE = Path(__file__).resolve().parent.parent / "search_spaces" / "smoke.yaml"


def test_check_caches_where_db_says_and_nowhere_else(tmp_path, monkeypatch):
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("TUNER_DB", raising=False)
    proc = tuner("check", str(SMOKE), "--db", f"sqlite:///{elsewhere / 'cache.db'}", "-q")
    assert proc.returncode == 0, proc.stderr
    assert list(work.iterdir()) == []  # no ./tuner.db, nothing else
    con = sqlite3.connect(elsewhere / "cache.db")
    (n,) = con.execute("SELECT count(*) FROM tuner_feasibility").fetchone()
    con.close()
    assert n > 0  # the verdicts are cached there
    monkeypatch.setenv("TUNER_DB", f"sqlite:///{elsewhere / 'env.db'}")
    proc = tuner("check", str(SMOKE), "-q")
    assert proc.returncode == 0 and (elsewhere / "env.db").exists() and list(work.iterdir()) == []
