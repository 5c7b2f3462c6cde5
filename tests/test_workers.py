"""Many workers on one study: several interpreter workers in one process, and several hosts (here:
processes) sharing one database, one of them killed mid-trial. The workers' and hosts' database is PostgreSQL
when ``TUNER_TEST_PG`` names a server (CI starts one), else SQLite; the first starts are PostgreSQL's (SQLite's
are tests/test_db.py's), and the verdict cache's race runs against both."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine
from sqlalchemy import text

from tests.conftest import PG
from tests.conftest import _pg_database
from tests.conftest import cheap_smoke

CONFIGS = ["T16-w4-s1-c4", "T16-w4-s2-c4", "T32-w4-s1-c4", "T32-w4-s2-c4"]


def _cmd(*args):
    exe = shutil.which("tuner")
    return ([exe] if exe else [sys.executable, "-m", "sparse_mla_tuner.tuner"]) + list(args)


@pytest.fixture
def cheap(tmp_path):
    """The smoke space with the fewest rounds allowed: what is tested is how workers and hosts share the studies'
    trials, not how many rounds each trial measures."""
    return cheap_smoke(tmp_path)


@pytest.fixture
def shared_url(tmp_path):
    """The database several workers share: PostgreSQL when the test run has one (as hosts would), else SQLite."""
    if PG:
        yield from _pg_database()
    else:
        yield f"sqlite:///{tmp_path / 'w.db'}"


def _check_exactly_once(url, levels):
    eng = create_engine(url)
    with eng.connect() as con:
        rows = con.execute(text("SELECT concurrency, config_key, COUNT(*) FROM tuner_trials GROUP BY 1, 2")).all()
        assert sorted(rows) == sorted((c, k, 1) for c in levels for k in CONFIGS)
        orphans = con.execute(
            text("SELECT COUNT(*) FROM tuner_samples WHERE trial_id NOT IN (SELECT id FROM tuner_trials)")
        ).scalar()
        assert orphans == 0
        unlabeled = con.execute(text("SELECT COUNT(*) FROM tuner_samples WHERE gpu_index IS NULL")).scalar()
        assert unlabeled == 0
        return con.execute(text("SELECT DISTINCT gpu_index FROM tuner_samples")).scalars().all()


def test_two_workers_share_a_study(shared_url, cheap):
    """Two workers (measurement processes) of one search share a study's trials. One level shows it: the next
    level runs the same code with the same processes (the smoke search measures two levels with one worker)."""
    proc = subprocess.run(
        _cmd("search", cheap, "--db", shared_url, "-q", "--workers", "2", "--concurrency", "1"),
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    gpus = _check_exactly_once(shared_url, [1])
    assert sorted(gpus) == [0, 1]  # both workers measured, each sample says where
    eng = create_engine(shared_url)
    with eng.connect() as con:  # one A/A noise band per worker in the study
        bands = con.execute(text("SELECT study_id, gpu_index FROM tuner_noise")).all()
        assert sorted(g for _, g in bands) == [0, 1] and len({s for s, _ in bands}) == 1


def test_host_killed_mid_trial_is_detected_and_its_trial_retried(shared_url, cheap):
    """Two 'hosts' join the same studies; one is killed with SIGKILL while measuring. The other
    fails its trial once the heartbeat is stale, re-queues it and finishes the grid. Both run with a grace of 4 s
    (``$TUNER_HEARTBEAT_GRACE_S``, 10 by default): what is tested is that the stale trial is failed, retried and
    recorded once, not how long the grace is. Several hosts share a PostgreSQL database (docs/workers.md), so that
    is the database here when the test run has a server; SQLite stands in without one."""
    env = {**os.environ, "TUNER_HEARTBEAT_GRACE_S": "4"}
    a = subprocess.Popen(
        _cmd("search", cheap, "--db", shared_url, "-q", "--concurrency", "1"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=env,
    )
    time.sleep(2)
    b = subprocess.Popen(
        _cmd("search", cheap, "--db", shared_url, "-q", "--concurrency", "1"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=env,
    )
    eng = create_engine(shared_url)
    deadline = time.monotonic() + 300
    killed = False
    while time.monotonic() < deadline and not killed:
        time.sleep(0.3)
        try:
            with eng.connect() as con:
                n = con.execute(text("SELECT COUNT(*) FROM tuner_trials")).scalar()
                running = con.execute(text("SELECT COUNT(*) FROM trials WHERE state = 'RUNNING'")).scalar()
        except Exception:  # tables not created yet
            continue
        if n >= 1 and running >= 1:
            os.killpg(b.pid, signal.SIGKILL)
            killed = True
    b.wait()
    assert killed, "never saw a running trial to kill"
    out, err = a.communicate(timeout=600)
    assert a.returncode == 0, err
    _check_exactly_once(shared_url, [1])


def test_four_first_starts_on_a_new_postgresql_database(db_url, tmp_path):
    """Creating and stamping the schema is one step under PostgreSQL's advisory lock (SQLite's exclusive
    lock is tested in test_db.py): four `tuner search` started at once on an empty database all succeed. The four
    are forked from one process after the imports (tests/many_searches.py): four processes, one import. What is
    tested is the start, so they replay a small recording (tests/recorded.py) with Optuna's queue in the results
    database, as a GPU search keeps it: no kernel runs, no measurement or compile process starts."""
    import json

    from tests.recorded import SMALL_SPACE
    from tests.recorded import make_recorded

    if db_url.startswith("sqlite"):
        pytest.skip("the SQLite case is tests/test_db.py::test_eight_searches_start_at_once_on_a_new_file")
    recorded, space = make_recorded(tmp_path / "recorded.db"), tmp_path / "small.yaml"
    space.write_text(SMALL_SPACE)
    args = [
        "search", str(space), "--concurrency", "1", "--n-trials", "1", "-q", "--backend", "replay",
        "--replay-db", f"sqlite:///{recorded}", "--replay-queue", "database", "--db", db_url,
    ]  # fmt: skip
    t0 = time.monotonic()
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, str(root / "tests" / "many_searches.py")],
        input=json.dumps({"argv": args, "n": 4}), capture_output=True, text=True, cwd=root, timeout=1800,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads(proc.stdout.splitlines()[-1])
    assert len(runs) == 4
    errs = [r["stderr"] for r in runs]
    failed = [f"exit {r['rc']}: ...{r['stderr'][-2000:]}" for r in runs if r["rc"] != 0]
    assert not failed, "\n".join(failed)
    password = db_url.split("@")[0].rsplit(":", 1)[-1]
    assert all(f":{password}@" not in e for e in errs)  # the password is never shown
    eng = create_engine(db_url)
    with eng.connect() as con:
        assert con.execute(text("SELECT COUNT(*) FROM tuner_alembic_version")).scalar() == 1
        assert con.execute(text("SELECT COUNT(*) FROM tuner_studies")).scalar() == 1
    print(f"four first starts: {time.monotonic() - t0:.0f} s")


def test_a_verdict_cached_by_two_processes_at_once_is_written_once(db_url):
    """Searches that start together compile the same configs and cache the same verdicts at the same
    time. The second write of a key waits for the first and is skipped: with a read-then-insert the two
    inserts collided (a unique-key error, SQLite and PostgreSQL alike), and one of four first starts failed."""
    import threading

    from sparse_mla_tuner.db import queries
    from sparse_mla_tuner.db.store import Store

    store = Store(db_url)
    first, second = {"shared": 1024, "registers": 96, "stack": 0}, {"shared": 1, "registers": 1, "stack": 1}
    errors = []

    def late_writer():
        try:
            with store.session() as s:
                queries.feasibility_put(s, {"k": second})
        except Exception as e:  # reported below, not lost in the thread
            errors.append(e)

    with store.session() as s:
        queries.feasibility_put(s, {"k": first})
        s.flush()  # the first insert holds the key, uncommitted, while the second one starts
        t = threading.Thread(target=late_writer)
        t.start()
        t.join(timeout=1.0)  # the second writer waits for the first transaction
    t.join(timeout=120)
    assert not t.is_alive() and not errors, errors
    with store.session() as s:
        assert queries.feasibility_get(s, ["k"]) == {"k": first}


@pytest.mark.parametrize("value", ["0", "2", "1.5", "ten", "-3"])
def test_a_bad_heartbeat_grace_is_one_sentence(value, tmp_path, monkeypatch):
    """``$TUNER_HEARTBEAT_GRACE_S`` (the multi-host tests above shorten the grace with it) is whole seconds, more
    than the heartbeat interval; anything else is one sentence and exit status 2 before a database is made."""
    from tests.conftest import tuner_in_process

    monkeypatch.setenv("TUNER_HEARTBEAT_GRACE_S", value)
    path = tmp_path / "g.db"
    proc = tuner_in_process("search", cheap_smoke(tmp_path), "--db", f"sqlite:///{path}", "-q")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "TUNER_HEARTBEAT_GRACE_S" in proc.stderr, proc.stderr
    assert repr(value) in proc.stderr and not path.exists()


def test_the_heartbeat_grace_is_the_storages(tmp_path, monkeypatch):
    """The grace a search's Optuna storage fails silent trials after: 10 s, or ``$TUNER_HEARTBEAT_GRACE_S``."""
    from sparse_mla_tuner.tuner.heartbeat import GRACE_S
    from sparse_mla_tuner.tuner.search import _storage

    url = f"sqlite:///{tmp_path / 'g.db'}"
    monkeypatch.delenv("TUNER_HEARTBEAT_GRACE_S", raising=False)
    assert _storage(url).grace_period == GRACE_S == 10
    monkeypatch.setenv("TUNER_HEARTBEAT_GRACE_S", " 4 ")
    assert _storage(url).grace_period == 4


def test_optunas_tables_made_by_another_process_at_the_same_moment_are_used(tmp_path, monkeypatch):
    """Several searches starting at once on a new PostgreSQL database: Optuna's CREATE TYPE of one loses to another's
    (type "studydirection" already exists, a ProgrammingError); the storage is opened again, the tables being there.
    Any other ProgrammingError is not retried."""
    import optuna
    import sqlalchemy

    from sparse_mla_tuner.tuner import search

    real, calls = optuna.storages.RDBStorage, []

    def racing(message):
        def storage(*a, **k):
            calls.append(message)
            if len(calls) == 1:
                orig = Exception(message)
                raise sqlalchemy.exc.ProgrammingError("CREATE TYPE studydirection AS ENUM (...)", {}, orig)
            return real(*a, **k)

        return storage

    monkeypatch.setattr(search.time, "sleep", lambda s: None)
    monkeypatch.setattr(optuna.storages, "RDBStorage", racing('type "studydirection" already exists'))
    assert isinstance(search._storage(f"sqlite:///{tmp_path / 'r.db'}"), real) and len(calls) == 2
    calls.clear()
    monkeypatch.setattr(optuna.storages, "RDBStorage", racing("permission denied for schema public"))
    with pytest.raises(sqlalchemy.exc.ProgrammingError, match="permission denied"):
        search._storage(f"sqlite:///{tmp_path / 's.db'}")
    assert len(calls) == 1


def test_simulated_gpus_run_their_threads_in_the_order_of_virtual_time():
    """tuner.replay.SimulatedGPUs: one thread runs at a time, and a measurement's thread goes on when that
    measurement ends in virtual time (a GPU at half speed takes twice as long; a tie goes to the lower index),
    whatever the threads' real timing."""
    import random
    import threading

    from sparse_mla_tuner.tuner.replay import SimulatedGPUs

    gpus = SimulatedGPUs([1.0, 0.5])
    log, running = [], []
    plans = {0: [1.0, 1.0, 1.0], 1: [1.0]}  # GPU 1 at half speed: its one measurement ends at t=2

    def worker(i):
        gpus.begin(i)
        for seconds in plans[i]:
            running.append(i)
            time.sleep(random.uniform(0, 0.01))  # real time does not decide the order
            assert running == [i]  # no other thread runs meanwhile
            running.remove(i)
            gpus.measure(i, seconds)
            log.append((gpus.now, i))
        gpus.end(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in (1, 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert log == [(1.0, 0), (2.0, 0), (2.0, 1), (3.0, 0)]
    assert gpus.busy == [3.0, 2.0] and gpus.now == 3.0
    gpus.measure(0, 0.5)  # outside a level's threads (the finalists): at once, on the clock
    assert gpus.now == 3.5


def test_a_replay_on_simulated_gpus_shares_each_study_and_repeats_itself(tmp_path):
    """``--workers N`` on the replay backend: N simulated GPUs share each study as N GPUs would (the study's own
    threads, proposals with trials running elsewhere, the stop rule), every GPU measures, the run is the same
    again, and two GPUs take less simulated time than one."""
    from sparse_mla_tuner.db.store import Store
    from sparse_mla_tuner.tuner.search import Options
    from sparse_mla_tuner.tuner.search import run_search
    from sparse_mla_tuner.tuner.space import load_space
    from tests.recorded import LEVELS
    from tests.recorded import SMALL_SPACE
    from tests.recorded import make_recorded

    recorded = make_recorded(tmp_path / "recorded.db")
    (tmp_path / "small.yaml").write_text(SMALL_SPACE)
    space = load_space(str(tmp_path / "small.yaml"))

    def run(name, speeds):
        url = f"sqlite:///{tmp_path / name}"
        opts = Options(
            backend="replay", quiet=True, replay_db=f"sqlite:///{recorded}", seed=1, sampler="grid",
            workers=len(speeds), replay_speeds=speeds,
        )  # fmt: skip
        rows = run_search(space, Store(url), opts)
        eng = create_engine(url)
        with eng.connect() as con:
            trials = con.execute(
                text(
                    "SELECT t.concurrency, t.config_key, s.gpu_index FROM tuner_trials t JOIN tuner_samples s "
                    "ON s.trial_id = t.id WHERE s.phase = 'screen' GROUP BY t.id ORDER BY t.id"
                )
            ).all()
        eng.dispose()
        return [r["C"] for r in rows], trials, opts.simulated.now

    levels, one, t_one = run("one.db", [1.0])
    assert levels == list(LEVELS)
    _, two, t_two = run("two.db", [1.0, 1.0])
    _, again, t_again = run("again.db", [1.0, 1.0])
    assert two == again and t_two == t_again  # deterministic
    assert {g for *_, g in two} == {0, 1}  # both GPUs measured
    assert sorted((c, k) for c, k, _ in two) == sorted((c, k) for c, k, _ in one)  # the grid: the same launches
    assert t_two < t_one
