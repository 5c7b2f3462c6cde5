"""The results database: schema versions, bad inputs, concurrent writers, queries."""

import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sqlalchemy import func
from sqlalchemy import select

from sparse_mla_tuner.db.models import SampleModel
from sparse_mla_tuner.db.models import TrialModel
from sparse_mla_tuner.db.store import DatabaseError
from sparse_mla_tuner.db.store import Store
from sparse_mla_tuner.db.store import head_revision
from sparse_mla_tuner.tuner.adapters.sparse_mla.records import config_of
from tests.conftest import tuner_in_process  # commands that read and write the database: no interpreter start


def test_new_database_is_created_at_head_next_to_optuna(tmp_path):
    import optuna

    url = f"sqlite:///{tmp_path / 't.db'}"
    store = Store(url)
    assert store.revision() == head_revision()
    optuna.create_study(study_name="s", storage=url)  # Optuna's tables and Alembic version table coexist
    assert Store(url).revision() == head_revision()
    con = sqlite3.connect(tmp_path / "t.db")
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"tuner_trials", "tuner_samples", "tuner_alembic_version", "trials", "studies", "alembic_version"} <= tables
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_fixture_of_schema_0001_upgrades_and_keeps_its_data(tmp_path):
    path = tmp_path / "old.db"
    shutil.copy("tests/fixtures/schema_0001.db", path)
    url = f"sqlite:///{path}"
    with pytest.raises(DatabaseError, match="older schema 0001.*tuner db upgrade"):
        Store(url)
    proc = tuner_in_process("db", "upgrade", "--db", url)
    assert proc.returncode == 0, proc.stderr
    store = Store(url)
    assert store.revision() == head_revision() != "0001"
    with store.session() as s:
        assert s.scalar(select(func.count()).select_from(SampleModel)) == 5
        t = s.get(TrialModel, 1)
        assert t.config_key == "T16-w4-s2-c4" and t.samples[0].gpu_index is None  # the new column


def test_newer_schema_is_refused_in_one_sentence(tmp_path):
    path = tmp_path / "new.db"
    Store(f"sqlite:///{path}")
    con = sqlite3.connect(path)
    con.execute("UPDATE tuner_alembic_version SET version_num = '9999'")
    con.commit()
    con.close()
    with pytest.raises(DatabaseError, match="schema 9999, newer than this sparse-mla-tuner knows"):
        Store(f"sqlite:///{path}")


@pytest.mark.parametrize(
    "make_url, message",
    [
        (lambda p: f"sqlite:///{p / 'notes.txt'}", "is not a SQLite database"),
        (lambda p: f"sqlite:///{p / 'corrupt.db'}", "is not a SQLite database"),
        (lambda p: f"sqlite:///{p / 'missing' / 'x.db'}", "does not exist"),
        (lambda p: "mysql://localhost/x", "unsupported database URL scheme 'mysql'"),
        (lambda p: "not a url", "is not a database URL"),
        (lambda p: f"sqlite:///{p}", "is a directory"),
    ],
    ids=["text-file", "corrupt", "no-dir", "scheme", "garbage", "directory"],
)
def test_bad_locations_get_one_sentence_and_status_2(tmp_path, make_url, message):
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "corrupt.db").write_bytes(b"SQLite format 2\x00" + b"\x00" * 100)
    url = make_url(tmp_path)
    with pytest.raises(DatabaseError, match=message):
        Store(url)
    proc = tuner_in_process("trials", "--db", url)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    if "/missing/" in url:  # `trials` only reads: it never creates a database
        message = "no database at"
    assert len(proc.stderr.strip().splitlines()) == 1 and message.split("'")[0] in proc.stderr


WRITER = textwrap.dedent(
    """
    import sys
    from sparse_mla_tuner.db.store import Store
    from sparse_mla_tuner.db.models import *
    from sparse_mla_tuner.db import queries
    url, who = sys.argv[1], int(sys.argv[2])
    store = Store(url)
    info = dict(backend="interpreter", gpu_name="cpu", compute_capability="-", sm_count=0, driver="-", cuda="-",
                torch="t", triton="t", host="h")
    for i in range(25):
        with store.session() as s:
            env = queries.ensure_environment(s, info)
            k = queries.ensure_kernel(s, "k")
            w = get_or_create(s, WorkloadModel, name="w", kv_format="fp8_v32", heads=16, tp=1, topk=64,
                              page_size=64, context=256, d_qk=576, d_v=512)
            sp = get_or_create(s, SpaceModel, name="s", text_hash="h", text="t", path="p")
            st = get_or_create(s, StudyModel, name=f"study{who}", space_id=sp.id, workload_id=w.id,
                               environment_id=env.id, kernel_id=k.id, concurrency=1, backend="interpreter")
            t = TrialModel(study_id=st.id, workload_id=w.id, environment_id=env.id, kernel_id=k.id, concurrency=1,
                           backend="interpreter", config_key=f"cfg{i}", BLOCK_T=16, num_warps=4, num_stages=2,
                           TARGET_CTAS=i + 1, num_splits=1, verdict="ok", optuna_study="x")
            s.add(t)
            s.flush()
            for r in range(4):
                s.add(SampleModel(trial_id=t.id, phase="screen", round=r, candidate_us=1.0, baseline_us=1.0,
                                  replays=1))
    """
)


def test_four_processes_write_at_once_nothing_lost_nothing_duplicated(tmp_path):
    url = f"sqlite:///{tmp_path / 'c.db'}"
    Store(url)
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), url, str(w)],
            cwd=".",
            stderr=subprocess.PIPE,
            text=True,
            env={**__import__("os").environ, "PYTHONPATH": "."},
        )
        for w in range(4)
    ]
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read()
    with Store(url).session() as s:
        assert s.scalar(select(func.count()).select_from(TrialModel)) == 100
        assert s.scalar(select(func.count()).select_from(SampleModel)) == 400
        dup = s.execute(
            select(TrialModel.study_id, TrialModel.config_key, func.count())
            .group_by(TrialModel.study_id, TrialModel.config_key)
            .having(func.count() > 1)
        ).all()
        assert dup == []
        from sparse_mla_tuner.db.models import EnvironmentModel

        assert s.scalar(select(func.count()).select_from(EnvironmentModel)) == 1


def test_new_database_in_a_read_only_directory_is_one_sentence(tmp_path):
    """Runs as root too: the directory is a read-only mount there (see tests/test_hardening.py)."""
    from tests.test_hardening import _ro_run

    ro = tmp_path / "ro"
    ro.mkdir()
    if __import__("os").geteuid() != 0:
        ro.chmod(0o555)
    try:
        proc = _ro_run(ro, ["check", "search_spaces/smoke.yaml", "--db", f"sqlite:///{ro / 'x.db'}"])
    finally:
        ro.chmod(0o755)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: cannot create {ro / 'x.db'}: directory {ro} is not writable"]


def test_eight_searches_start_at_once_on_a_new_file(tmp_path):
    """Eight `tuner search` started at once on one new SQLite file: the schema is created and stamped in one step
    under a lock, Optuna's tables once, and the eight share each study's queue (the replay backend with the queue
    in the database, as on a GPU). All exit 0, and every launch is measured exactly once per study. The eight are
    forked from one process after the imports (tests/many_searches.py): eight processes, one import."""
    import json
    import os

    from tests.recorded import SMALL_SPACE
    from tests.recorded import make_recorded

    recorded, space = make_recorded(tmp_path / "recorded.db"), tmp_path / "small.yaml"
    space.write_text(SMALL_SPACE)
    url = f"sqlite:///{tmp_path / 'new.db'}"
    argv = [
        "search", str(space), "-q", "--backend", "replay", "--replay-db", f"sqlite:///{recorded}",
        "--replay-queue", "database", "--db", url,
    ]  # fmt: skip
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, str(root / "tests" / "many_searches.py")],
        input=json.dumps({"argv": argv, "n": 8}), capture_output=True, text=True, cwd=root, timeout=3600,
    )  # fmt: skip  # the limit only guards against a hang; a loaded machine is slow, never wrong
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads(proc.stdout.splitlines()[-1])
    assert len(runs) == 8
    failed = [f"exit {r['rc']}: ...{r['stderr'][-2000:]}" for r in runs if r["rc"] != 0]
    assert not failed, "\n".join(failed)
    errs = [r["stderr"] for r in runs]
    assert not [e for e in errs if "Traceback" in e], errs
    assert os.path.getsize(tmp_path / "new.db") > 0
    con = sqlite3.connect(tmp_path / "new.db")
    assert con.execute("SELECT version_num FROM tuner_alembic_version").fetchall() == [(head_revision(),)]
    assert con.execute("SELECT COUNT(*) FROM tuner_studies").fetchone() == (2,)
    per_study = "SELECT study_id, {} FROM tuner_trials {} GROUP BY 1, 2 HAVING COUNT(*) > 1"
    assert con.execute(per_study.format("config_key", "")).fetchall() == []  # each config recorded once
    launched = "WHERE verdict != 'duplicate' AND launch_key IS NOT NULL"
    assert con.execute(per_study.format("launch_key", launched)).fetchall() == []  # each launch measured once
    screened = con.execute(
        "SELECT t.study_id, COUNT(DISTINCT t.id) FROM tuner_samples x JOIN tuner_trials t ON t.id = x.trial_id "
        "WHERE x.phase = 'screen' GROUP BY 1 ORDER BY 1"
    ).fetchall()
    launches = con.execute(
        f"SELECT study_id, COUNT(DISTINCT launch_key) FROM tuner_trials {launched} AND verdict = 'ok' GROUP BY 1"
    ).fetchall()
    assert screened == launches and len(screened) == 2  # and every launch of both levels was measured
    assert con.execute("SELECT state FROM trials WHERE state IN ('RUNNING', 'WAITING')").fetchall() == []


def test_fixture_of_schema_0004_upgrades_to_the_declared_parameters(tmp_path):
    """0005 adds the declared maxnreg column (0 = no cap), 0006 launch identities and calibrations, 0007 calls,
    0008 the PREFETCH column (0: every old trial ran the loop without the prefetch), 0009 the BALANCED
    column (0: every old trial split each row alike), 0011 the MERGE column (0: every old trial merged its
    splits in a combine launch)."""
    path = tmp_path / "old4.db"
    shutil.copy("tests/fixtures/schema_0004.db", path)
    url = f"sqlite:///{path}"
    proc = tuner_in_process("db", "upgrade", "--db", url)
    assert proc.returncode == 0, proc.stderr
    store = Store(url)
    assert store.revision() == head_revision()
    with store.session() as s:
        trials = s.scalars(select(TrialModel)).all()
        assert trials and all(
            t.maxnreg == 0 and t.PREFETCH == 0 and t.BALANCED == 0 and t.MERGE == 0 and t.duplicate_of is None
            for t in trials
        )
        assert {str(config_of(t)) for t in trials} == {t.config_key for t in trials}  # old keys parse unchanged


def test_fixture_of_schema_0009_upgrades_to_adapter_records(tmp_path):
    """0010 names the adapter of kernels, spaces and workloads (every older row is the built-in kernel's) and gives
    a trial of another adapter its parameters as JSON: the old rows read as before, and a workload of another
    adapter may share a name with one of the built-in kernel's."""
    import json

    from sparse_mla_tuner.db import queries
    from sparse_mla_tuner.db.models import COLUMNS_ADAPTER
    from sparse_mla_tuner.db.models import KernelModel
    from sparse_mla_tuner.db.models import SpaceModel
    from sparse_mla_tuner.db.models import WorkloadModel
    from sparse_mla_tuner.db.models import config_fields

    path = tmp_path / "old9.db"
    shutil.copy("tests/fixtures/schema_0009.db", path)
    url = f"sqlite:///{path}"
    with pytest.raises(DatabaseError, match="older schema 0009"):
        Store(url, readonly=True)
    proc = tuner_in_process("db", "upgrade", "--db", url)
    assert proc.returncode == 0, proc.stderr
    store = Store(url)
    assert store.revision() == head_revision()
    with store.session() as s:
        trials = s.scalars(select(TrialModel)).all()
        assert trials and all(t.params is None and t.param_values() == config_of(t).as_dict() for t in trials)
        assert {str(config_of(t)) for t in trials} == {t.config_key for t in trials}
        for model in (KernelModel, SpaceModel, WorkloadModel):
            assert {r.adapter for r in s.scalars(select(model))} == {COLUMNS_ADAPTER}
        old = s.scalars(select(WorkloadModel)).first()
        assert old.fields == "" and old.description()["kv_format"] == old.kv_format
        other = queries.ensure_workload(s, "my.module:Adapter", name=old.name, cols=500)
        assert other.id != old.id and other.description() == {"name": old.name, "cols": 500}
        assert queries.ensure_workload(s, "my.module:Adapter", name=old.name, cols=500).id == other.id
        assert queries.ensure_workload(s, "my.module:Adapter", name=old.name, cols=600).id != other.id
        assert config_fields("my.module:Adapter", {"B": 1}) == {"params": json.dumps({"B": 1})}
        assert config_fields(COLUMNS_ADAPTER, {"BLOCK_T": 32}) == {"BLOCK_T": 32}
        with pytest.raises(DatabaseError, match="give the adapter its own source_hash"):
            queries.ensure_kernel(s, s.scalars(select(KernelModel)).first().source_hash, "my.module:Adapter")


def test_schema_0012_keeps_a_finished_level_in_the_tuners_own_table(tmp_path):
    """0012 adds ``tuner_studies.stopped`` and ``stopped_n_trials`` (a level's finished state, whatever holds
    Optuna's queue) and copies them from the Optuna study's ``stopped`` and ``n_trials`` attributes, so a level an
    older search finished stays finished; a study without them stays open."""
    path = tmp_path / "old9.db"
    shutil.copy("tests/fixtures/schema_0009.db", path)
    con = sqlite3.connect(path)
    (study_id,) = con.execute("SELECT study_id FROM studies").fetchone()
    con.executemany(
        "INSERT INTO study_user_attributes (study_id, key, value_json) VALUES (?, ?, ?)",
        [
            (study_id, "stopped", '"P(an unmeasured launch beats the best by > band) = 1.0% < 5%"'),
            (study_id, "n_trials", "7"),
        ],
    )
    con.execute(
        "INSERT INTO tuner_studies (name, space_id, workload_id, environment_id, kernel_id, concurrency, backend, "
        "created_at) SELECT name || '#open', space_id, workload_id, environment_id, kernel_id, 4, backend, created_at "
        "FROM tuner_studies"
    )
    con.commit()
    con.close()
    proc = tuner_in_process("db", "upgrade", "--db", f"sqlite:///{path}")
    assert proc.returncode == 0, proc.stderr
    con = sqlite3.connect(path)
    rows = dict(con.execute("SELECT concurrency, stopped || '/' || coalesce(stopped_n_trials, '-') FROM tuner_studies"))
    con.close()
    assert rows == {1: "P(an unmeasured launch beats the best by > band) = 1.0% < 5%/7", 4: None}


def test_opening_retries_while_sqlite_says_locked_without_waiting(tmp_path, monkeypatch):
    """SQLite can answer "database is locked" without honouring the busy timeout (WAL switches and
    checkpoints of other starters); opening retries that, and only that."""
    from sqlalchemy.exc import OperationalError

    real = Store._prepare_schema
    calls = []

    def flaky(self, upgrade, create):
        calls.append(1)
        if len(calls) < 3:
            raise OperationalError("PRAGMA journal_mode=WAL", {}, sqlite3.OperationalError("database is locked"))
        return real(self, upgrade, create)

    monkeypatch.setattr(Store, "_prepare_schema", flaky)
    store = Store(f"sqlite:///{tmp_path / 'new.db'}")
    assert len(calls) == 3 and store.revision() == head_revision()

    def broken(self, upgrade, create):
        calls.append(1)
        raise OperationalError("SELECT 1", {}, sqlite3.OperationalError("disk I/O error"))

    monkeypatch.setattr(Store, "_prepare_schema", broken)
    calls.clear()
    with pytest.raises(DatabaseError, match="disk I/O error"):
        Store(f"sqlite:///{tmp_path / 'other.db'}")
    assert len(calls) == 1  # any other error is reported at once, as one sentence


def test_a_summary_given_by_name_lands_in_the_columns_of_those_names(tmp_path):
    from sparse_mla_tuner.db import queries
    from sparse_mla_tuner.db import record
    from sparse_mla_tuner.db.models import SpaceModel
    from sparse_mla_tuner.db.models import StatisticModel
    from sparse_mla_tuner.db.models import StudyModel
    from sparse_mla_tuner.db.models import WorkloadModel
    from sparse_mla_tuner.db.models import get_or_create
    from sparse_mla_tuner.db.verdicts import Effect
    from sparse_mla_tuner.db.verdicts import Phase

    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    info = dict(
        backend="interpreter",
        gpu_name="cpu",
        compute_capability="-",
        sm_count=0,
        driver="-",
        cuda="-",
        torch="t",
        triton="t",
        host="h",
    )
    fields = dict(
        n=10,
        median_us=20.0,
        ci_low_us=19.0,
        ci_high_us=21.0,
        baseline_median_us=40.0,
        ratio=0.5,
        ratio_ci_low=0.45,
        ratio_ci_high=0.55,
        noise_band=0.01,
        effect=Effect.WIN,
        p_value=0.001,
    )
    summary = record.Summary(**fields)
    assert record.Summary(*fields.values()) == summary  # the positional order of older callers still holds
    with store.session() as s:
        env = queries.ensure_environment(s, info)
        k = queries.ensure_kernel(s, "k")
        w = get_or_create(
            s,
            WorkloadModel,
            name="w",
            kv_format="fp8_v32",
            heads=16,
            tp=1,
            topk=64,
            page_size=64,
            context=256,
            d_qk=576,
            d_v=512,
        )
        sp = get_or_create(s, SpaceModel, name="s", text_hash="h", text="t", path="p")
        st = get_or_create(
            s,
            StudyModel,
            name="study",
            space_id=sp.id,
            workload_id=w.id,
            environment_id=env.id,
            kernel_id=k.id,
            concurrency=1,
            backend="interpreter",
        )
        t = record.add_trial(
            s,
            study_id=st.id,
            workload_id=w.id,
            environment_id=env.id,
            kernel_id=k.id,
            concurrency=1,
            backend="interpreter",
            config_key="c",
            BLOCK_T=16,
            num_warps=4,
            num_stages=2,
            TARGET_CTAS=1,
            num_splits=1,
            verdict="ok",
            optuna_study="x",
        )
        record.add_samples(s, t.id, Phase.SCREEN, [(20.0, 40.0)] * 10, 1, 0, summary)
    with store.session() as s:
        row = s.execute(select(StatisticModel)).scalar_one()
        stored = {name: getattr(row, name) for name in fields if name != "effect"}
        assert stored == {name: v for name, v in fields.items() if name != "effect"}
        assert row.classification == Effect.WIN
        assert s.scalar(select(func.count()).select_from(SampleModel).where(SampleModel.trial_id == t.id)) == 10
