"""Reliability, round five (issue 59): a damaged version table, a read-only database and a dry run that changes
nothing; a space file's `kernel:` that names a module outside the registered adapters; environment variables; Ctrl-C
at any moment; a space file from a pipe. Each case is one sentence and exit 2 (or a clean run), never a traceback."""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.conftest import tuner_in_process as tuner

SMOKE = str(ROOT / "search_spaces" / "smoke.yaml")


def _one_sentence(proc, fragment=None):
    """Exit 2, one stderr line that starts with `error:`, no traceback."""
    err = proc.stderr
    assert proc.returncode == 2, (proc.returncode, err)
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    if fragment:
        assert fragment in lines[0], lines[0]


def _clean(proc):
    """Exit 0 or a one-sentence exit 2 (an empty database has nothing to export), never a traceback."""
    assert "Traceback" not in proc.stderr, proc.stderr
    if proc.returncode != 0:
        _one_sentence(proc)


# --- damaged version tables (item 2) ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fresh_db(tmp_path_factory) -> Path:
    """A database at the current schema with Optuna's tables, made once (copied by each test)."""
    import optuna

    from sparse_mla_tuner.db.store import Store

    path = tmp_path_factory.mktemp("fresh") / "fresh.db"
    url = f"sqlite:///{path}"
    Store(url).engine.dispose()
    storage = optuna.storages.RDBStorage(url)
    storage.engine.dispose()
    con = sqlite3.connect(path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.execute("PRAGMA journal_mode=DELETE")  # one file to copy
    con.close()
    return path


def _copy(src: Path, folder: Path, sql: str = "") -> Path:
    dst = folder / "t.db"
    shutil.copy(src, dst)
    if sql:
        con = sqlite3.connect(dst)
        con.executescript(sql)
        con.commit()
        con.close()
    return dst


DB_COMMANDS = [
    ["db", "upgrade"],
    ["db", "compact"],
    ["db", "compact", "--dry-run"],
    ["best", "--concurrency", "1"],
    ["trials"],
    ["studies"],
    ["show", "1"],
    ["compare", "T16-w4-s2-c512", "T16-w4-s2-c256"],
    ["report"],
    ["export", "--out", "{tmp}/tables"],
    ["export", "--record", "--out", "{tmp}/tables"],
    ["check", SMOKE],
]

TUNER_DAMAGE = [
    ("two-rows", "INSERT INTO tuner_alembic_version VALUES ('0009');", "holds 2 rows"),
    ("garbage", "UPDATE tuner_alembic_version SET version_num = 'garbage';", "'garbage', which is no revision"),
    ("empty", "DELETE FROM tuner_alembic_version;", "has tuner tables but no schema version"),
    ("dropped", "DROP TABLE tuner_alembic_version;", "has tuner tables but no schema version"),
]


@pytest.mark.parametrize("cmd", DB_COMMANDS, ids=lambda c: "-".join(c[:3]).replace("/", "_"))
@pytest.mark.parametrize("damage", TUNER_DAMAGE, ids=lambda d: d[0])
def test_a_damaged_tuner_version_table_is_one_sentence(tmp_path, fresh_db, cmd, damage):
    _, sql, fragment = damage
    db = _copy(fresh_db, tmp_path, sql)
    before = _dump(db)
    args = [a.format(tmp=tmp_path) for a in cmd]
    _one_sentence(tuner(*args, "--db", f"sqlite:///{db}"), fragment)
    assert _dump(db) == before  # nothing "repaired" by a guess


def _dump(db: Path) -> list[str]:
    con = sqlite3.connect(db)
    try:
        return list(con.iterdump())
    finally:
        con.close()


@pytest.fixture(scope="module")
def replayed(tmp_path_factory) -> tuple[str, str]:
    """A small space and the recorded database a replayed search of it draws from."""
    from tests.recorded import SMALL_SPACE
    from tests.recorded import make_recorded

    folder = tmp_path_factory.mktemp("recorded")
    (folder / "small.yaml").write_text(SMALL_SPACE)
    return str(folder / "small.yaml"), f"sqlite:///{make_recorded(folder / 'recorded.db')}"


OPTUNA_DAMAGE = [
    ("two-rows", "INSERT INTO alembic_version VALUES ('v3.0.0.a');", "holds 2 rows"),
    ("garbage", "UPDATE alembic_version SET version_num = 'garbage';", "which optuna"),
    ("older", "UPDATE alembic_version SET version_num = 'v3.0.0.a';", "optuna storage upgrade"),
]


@pytest.mark.parametrize("damage", OPTUNA_DAMAGE, ids=lambda d: d[0])
def test_a_damaged_optuna_version_table_is_one_sentence(tmp_path, fresh_db, replayed, damage):
    """The commands that use Optuna's tables say so in one sentence; those that never read them work as before."""
    _, sql, fragment = damage
    db = _copy(fresh_db, tmp_path, sql)
    url = f"sqlite:///{db}"
    space, recorded = replayed
    search = ["search", space, "-q", "--backend", "replay", "--replay-db", recorded, "--replay-queue", "database"]
    for cmd in (["db", "upgrade"], ["db", "compact"], ["db", "compact", "--dry-run"], search):
        _one_sentence(tuner(*cmd, "--db", url), fragment)
    for cmd in (["studies"], ["trials"], ["best", "--concurrency", "1"], ["report"]):
        _clean(tuner(*cmd, "--db", url))


# --- a dry run changes nothing; a read-only database says so (items 3 and 4) -----------------------------------


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def _with_wal(src: Path, folder: Path) -> Path:
    """A copy of ``src`` with a write-ahead log that a killed writer left beside it (no -shm)."""
    db = _copy(src, folder)
    code = (
        "import os, sqlite3, sys\n"
        "con = sqlite3.connect(sys.argv[1])\n"
        "con.execute('PRAGMA journal_mode=WAL'); con.execute('PRAGMA wal_autocheckpoint=0')\n"
        "con.execute('CREATE TABLE filler (x BLOB)')\n"
        "con.executemany('INSERT INTO filler VALUES (?)', [(os.urandom(4000),) for _ in range(50)])\n"
        "con.commit(); os._exit(0)\n"  # as kill -9: the log is never checkpointed
    )
    subprocess.run([sys.executable, "-c", code, str(db)], check=True)
    Path(f"{db}-shm").unlink(missing_ok=True)
    assert os.path.getsize(f"{db}-wal") > 100_000
    return db


def test_a_dry_run_never_checkpoints_a_log_into_the_file(tmp_path, fresh_db):
    db = _with_wal(fresh_db, tmp_path)
    before = {n: d for n, d in _digest(tmp_path).items() if not n.endswith("-shm")}
    proc = _executable("db", "compact", "--dry-run", "--db", f"sqlite:///{db}")  # its exit closes every connection
    assert proc.returncode == 0 and "dry run: nothing changed" in proc.stderr, proc.stderr
    after = {n: d for n, d in _digest(tmp_path).items() if not n.endswith("-shm")}
    assert after == before  # the file and its log, byte for byte


def _executable(*args: str, **kw) -> subprocess.CompletedProcess:
    """``tuner ARGS`` as a process of its own (the console script's entry point)."""
    code = "import sys; from sparse_mla_tuner.tuner.cli import main; sys.argv[0] = 'tuner'; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300, **kw)


def _ro_runs(directory: Path, runs):
    """Each ``tuner ARGS`` where ``directory`` is read-only (a read-only bind mount, also as root)."""
    from tests.test_hardening import _ro_runs as ro_runs

    if os.geteuid() == 0:
        probe = subprocess.run(["unshare", "-m", "true"], capture_output=True) if shutil.which("unshare") else None
        if probe is None or probe.returncode != 0:
            pytest.skip("cannot make a private mount namespace here")
    else:
        directory.chmod(0o555)
    try:
        return ro_runs(directory, runs)
    finally:
        directory.chmod(0o755)


def test_a_read_only_database_is_named_read_only_and_a_current_one_upgrades_as_a_no_op(tmp_path, fresh_db):
    ro = tmp_path / "ro"
    ro.mkdir()
    db = _copy(fresh_db, ro)
    old = ro / "old.db"
    shutil.copy(db, old)
    con = sqlite3.connect(old)
    con.execute("UPDATE tuner_alembic_version SET version_num = '0009'")
    con.commit()
    con.close()
    (tmp_path / "w").mkdir()
    walled = _with_wal(fresh_db, tmp_path / "w")
    shutil.copy(walled, ro / "w.db")
    shutil.copy(f"{walled}-wal", ro / "w.db-wal")
    before = _digest(ro)
    url, old_url, wal_url = (f"sqlite:///{ro / n}" for n in ("t.db", "old.db", "w.db"))
    runs = [
        ["db", "upgrade", "--db", url],
        ["db", "upgrade", "--db", old_url],
        ["db", "compact", "--db", url],
        ["db", "compact", "--dry-run", "--db", url],
        ["db", "compact", "--dry-run", "--db", wal_url],
        ["export", "--record", "--out", str(tmp_path / "tables"), "--db", url],
        ["studies", "--db", url],
    ]
    upgrade, upgrade_old, compact, dry, dry_wal, export, studies = _ro_runs(ro, runs)
    assert upgrade.returncode == 0 and "nothing to do" in upgrade.stderr, upgrade.stderr
    for proc in (upgrade_old, compact, export):
        _one_sentence(proc, "read-only")
        assert "unable to open" not in proc.stderr
    assert "older schema" in upgrade_old.stderr
    for proc in (dry, dry_wal, studies):
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "would be" in dry_wal.stderr
    assert _digest(ro) == before


# --- a space's `kernel:` imports only a registered adapter (item 5) -------------------------------------------


def _space_with_kernel(folder: Path, kernel: str) -> Path:
    text = Path(SMOKE).read_text().replace("name: smoke\n", f"name: smoke\nkernel: '{kernel}'\n")
    path = folder / "space.yaml"
    path.write_text(text)
    return path


def _planted(folder: Path) -> Path:
    """A module ``planted_mod`` that leaves a file ``RAN`` when it is imported, in ``folder/lib``."""
    lib = folder / "lib"
    lib.mkdir()
    (lib / "planted_mod.py").write_text(f"open({str(folder / 'RAN')!r}, 'w').write('ran')\nclass Adapter: pass\n")
    return lib


@pytest.mark.parametrize("kernel", ["this:Adapter", "planted_mod:Adapter", "os.path:join", "planted_mod:Nope"])
def test_a_kernel_outside_the_registered_adapters_is_refused_before_its_import(tmp_path, kernel, monkeypatch):
    monkeypatch.syspath_prepend(str(_planted(tmp_path)))
    monkeypatch.delenv("TUNER_ADAPTERS", raising=False)
    monkeypatch.delitem(sys.modules, "this", raising=False)
    space = _space_with_kernel(tmp_path, kernel)
    proc = tuner("check", str(space), "--db", f"sqlite:///{tmp_path / 'c.db'}")
    _one_sentence(proc, "is not a registered kernel adapter, so its module is not imported")
    assert "TUNER_ADAPTERS" in proc.stderr and "sparse_mla_tuner.adapters" in proc.stderr
    assert "this" not in sys.modules and "planted_mod" not in sys.modules
    assert not (tmp_path / "RAN").exists()
    assert not (tmp_path / "c.db").exists()


def test_an_allowed_or_entry_point_adapter_is_imported(tmp_path, monkeypatch):
    """$TUNER_ADAPTERS and an installed entry point (group sparse_mla_tuner.adapters) register a module: it is
    imported (and, naming no KernelAdapter, refused as such); a malformed $TUNER_ADAPTERS is one sentence."""
    lib = _planted(tmp_path)
    monkeypatch.syspath_prepend(str(lib))
    space = _space_with_kernel(tmp_path, "planted_mod:Adapter")
    db = ["--db", f"sqlite:///{tmp_path / 'c.db'}"]
    for allowed in ("planted_mod", "other:X, planted_mod:Adapter"):
        monkeypatch.setenv("TUNER_ADAPTERS", allowed)
        _one_sentence(tuner("check", str(space), *db), "is not a KernelAdapter subclass")
        assert (tmp_path / "RAN").exists()
        (tmp_path / "RAN").unlink()
        del sys.modules["planted_mod"]
    monkeypatch.setenv("TUNER_ADAPTERS", "planted mod;x")
    _one_sentence(tuner("check", str(space), *db), "$TUNER_ADAPTERS holds")
    assert not (tmp_path / "RAN").exists()

    monkeypatch.delenv("TUNER_ADAPTERS")
    dist = lib / "planted_dist-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: planted-dist\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[sparse_mla_tuner.adapters]\nplanted = planted_mod:Adapter\n")
    for kernel in ("planted_mod:Adapter", "planted"):
        space = _space_with_kernel(tmp_path, kernel)
        _one_sentence(tuner("check", str(space), *db), "'planted_mod:Adapter' is not a KernelAdapter subclass")
        assert (tmp_path / "RAN").exists()
        (tmp_path / "RAN").unlink()
        del sys.modules["planted_mod"]


def test_the_shipped_example_is_registered_and_a_planted_examples_folder_is_not(tmp_path):
    from sparse_mla_tuner.tuner.adapter import load_adapter

    assert type(load_adapter("examples.row_softmax.adapter:RowSoftmaxAdapter")).__name__ == "RowSoftmaxAdapter"
    fake = tmp_path / "examples" / "evil"
    fake.mkdir(parents=True)
    (tmp_path / "examples" / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "adapter.py").write_text(f"open({str(tmp_path / 'RAN')!r}, 'w')\n")
    space = _space_with_kernel(tmp_path, "examples.evil.adapter:A")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    env.pop("TUNER_ADAPTERS", None)
    proc = _executable("check", str(space), "--db", f"sqlite:///{tmp_path / 'c.db'}", env=env, cwd=tmp_path)
    _one_sentence(proc, "is not a registered kernel adapter")
    assert not (tmp_path / "RAN").exists()


def test_an_adapter_named_in_a_database_is_not_imported_unregistered(monkeypatch):
    """`tuner best` makes a stored workload's adapter for its bandwidth: a stored name goes through the same rule."""
    from sparse_mla_tuner.tuner.cli import _bytes_moved

    class Stored:
        adapter = "this:Adapter"

        def description(self):
            return {}

    monkeypatch.delitem(sys.modules, "this", raising=False)
    monkeypatch.delenv("TUNER_ADAPTERS", raising=False)
    assert _bytes_moved(Stored(), 1) is None
    assert "this" not in sys.modules


# --- a huge stored reason is bounded in the report and in `trials` off a terminal (item 7) ---------------------


@pytest.fixture(scope="module")
def results_db(tmp_path_factory) -> Path:
    """tests/recorded.py's small results (three workloads, two levels), at the current schema."""
    from sparse_mla_tuner.db.store import Store
    from tests.recorded import make_results

    path = make_results(tmp_path_factory.mktemp("results") / "results.db")
    Store(f"sqlite:///{path}", upgrade=True).engine.dispose()
    return path


@pytest.mark.parametrize(
    "cmd",
    [["report"], ["trials"], ["trials", "--verdict", "infeasible"], ["show", "{trial}"], ["trials", "--wide"]],
    ids=["report", "trials", "infeasible", "show", "trials-wide"],
)
def test_a_huge_stored_reason_is_bounded(tmp_path, results_db, cmd, monkeypatch):
    """A 1 MB reason on an infeasible and an ok trial adds a bounded length to the output, not the megabyte."""
    monkeypatch.delenv("COLUMNS", raising=False)  # off a terminal: the table is not fitted
    url = f"sqlite:///{results_db}"
    con = sqlite3.connect(results_db)
    (trial,) = con.execute("SELECT MIN(id) FROM tuner_trials WHERE verdict = 'ok'").fetchone()
    con.close()
    cmd = [a.format(trial=trial) for a in cmd]
    plain = tuner(*cmd, "--db", url)
    assert plain.returncode == 0, plain.stderr
    db = tmp_path / "big.db"
    shutil.copy(results_db, db)
    huge = "ptxas error: " + "out of resources " * 60_000  # about a megabyte, with spaces (it wraps, is not cut)
    con = sqlite3.connect(db)
    for verdict in ("infeasible", "ok"):
        con.execute(
            "UPDATE tuner_trials SET reason = ? WHERE id = (SELECT MIN(id) FROM tuner_trials WHERE verdict = ?)",
            (huge + "\n" + "x" * 100_000, verdict),
        )
    con.commit()
    con.close()
    big = tuner(*cmd, "--db", f"sqlite:///{db}")
    assert big.returncode == 0, big.stderr
    assert len(big.stdout) - len(plain.stdout) < 5_000, len(big.stdout) - len(plain.stdout)
    assert "characters;" in big.stdout  # its length said
    whole = tuner("trials", "-f", "json", "--db", f"sqlite:///{db}")
    assert huge in whole.stdout  # the data itself: whole


# --- every environment variable the tool reads: one sentence naming it (item 8) -------------------------------

BAD_ENV = [
    ("TUNER_COMPILE_JOBS", "abc"),
    ("TUNER_COMPILE_JOBS", "0"),
    ("TUNER_COMPILE_JOBS", "-3"),
    ("TUNER_COMPILE_JOBS", "1" * 50),
    ("TUNER_PROGRESS_INTERVAL_S", "soon"),
    ("TUNER_PROGRESS_INTERVAL_S", "nan"),
    ("TUNER_PROGRESS_INTERVAL_S", "-1"),
    ("TUNER_HEARTBEAT_GRACE_S", "1"),
    ("TUNER_HEARTBEAT_GRACE_S", "ten"),
    ("TUNER_ADAPTERS", "not a module!"),
    ("SPARSE_MLA_CONFIG_DIR", "{file}"),
    ("SPARSE_MLA_CONFIG_DIR", "x" * 5000),
    ("COLUMNS", "wide"),
    ("COLUMNS", "-80"),
    ("TUNER_FAULT", "explode@T16-w4-s2-c256"),
    ("TUNER_DB", "mysql://host/db"),
    ("TUNER_DB", "postgresql://host:99999/db"),
]


@pytest.mark.parametrize("cmd", [["studies"], ["check", SMOKE], ["search", SMOKE, "--backend", "interpreter"]])
@pytest.mark.parametrize("name, value", BAD_ENV, ids=[f"{n}={v[:12]}" for n, v in BAD_ENV])
def test_a_bad_environment_variable_is_one_sentence_naming_it(tmp_path, monkeypatch, name, value, cmd):
    file = tmp_path / "a-file"
    file.write_text("")
    monkeypatch.setenv(name, value.format(file=file))
    db = [] if name == "TUNER_DB" else ["--db", f"sqlite:///{tmp_path / 'x.db'}"]
    proc = tuner(*cmd, *db)
    _one_sentence(proc, f"${name}")
    assert not (tmp_path / "x.db").exists()  # refused before anything was made


@pytest.mark.parametrize(
    "name, value",
    [("TUNER_COMPILE_JOBS", "2"), ("TUNER_PROGRESS_INTERVAL_S", "0"), ("TUNER_HEARTBEAT_GRACE_S", "4"),
     ("COLUMNS", "120"), ("COLUMNS", ""), ("TUNER_ADAPTERS", "pkg.mod:Cls, other"), ("TUNER_FAULT", "")],
)  # fmt: skip
def test_a_good_environment_variable_passes(tmp_path, monkeypatch, fresh_db, name, value):
    monkeypatch.setenv(name, value)
    proc = tuner("studies", "--db", f"sqlite:///{fresh_db}")
    assert proc.returncode == 0, proc.stderr


def test_help_works_whatever_the_environment(monkeypatch):
    monkeypatch.setenv("TUNER_COMPILE_JOBS", "abc")
    proc = tuner("check", "--help")
    assert proc.returncode == 0 and "SPACE_FILE" in proc.stdout


# --- Ctrl-C at any moment: exit 130 and one line, never a traceback (item 9) -----------------------------------


def _command() -> list[str]:
    exe = Path(sys.executable).parent / "tuner"  # the console script, as a user runs it
    return [str(exe)] if exe.exists() else [sys.executable, "-P", "-m", "sparse_mla_tuner.tuner"]


def _ctrl_c(args, tmp_path: Path, after, env=None, command=None):
    """``tuner ARGS`` (or ``command ARGS``) in a session of its own, sent SIGINT as a terminal sends it (to the whole
    process group) once ``after(proc)`` is true; (exit status, stdout, stderr, whether it was still running when
    signalled)."""
    import signal
    import time

    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    env.pop("COLUMNS", None)
    proc = subprocess.Popen(
        [*(command or _command()), *args], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 300  # only guards against a hang
    while time.monotonic() < deadline and not after(proc):
        time.sleep(0.02)
    try:  # stopped, so that it cannot end between the look and the signal (the signal is taken where it stopped)
        os.killpg(proc.pid, signal.SIGSTOP)
    except ProcessLookupError:
        pass
    alive = _stopped(proc)
    try:
        if alive:
            os.killpg(proc.pid, signal.SIGINT)
        os.killpg(proc.pid, signal.SIGCONT)
    except ProcessLookupError:
        pass
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err, alive


def _stopped(proc) -> bool:
    """Whether ``proc`` is stopped, not ending: a process already in its exit (tearing its memory down, not yet a
    zombie) takes no SIGSTOP and no SIGINT, yet ``poll()`` still calls it running. Without /proc, ``poll()``."""
    import time

    for _ in range(1000):
        try:
            state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return proc.poll() is None
        if state in "TtZX":
            return state in "Tt"
        time.sleep(0.002)
    return proc.poll() is None


def _after_s(seconds: float):
    import time

    t0 = time.monotonic()
    return lambda proc: time.monotonic() - t0 >= seconds


def _after_line(stream: str):
    """True once the process wrote its first line to ``stream`` (read here, so it is kept for the caller)."""
    seen = []

    def ready(proc) -> bool:
        if not seen:
            seen.append(getattr(proc, stream).readline())
        return True

    return ready


def _interrupted_cleanly(rc, err, alive):
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    if alive:
        assert rc == 130, (rc, err[-3000:])
        assert err.strip().splitlines()[-1] == "interrupted", err[-3000:]
        assert sum("interrupt" in line for line in err.splitlines()) == 1, err[-3000:]
    else:
        assert rc == 0, (rc, err[-3000:])


def _after_mapped(library: str):
    """True once the process has mapped a file whose path holds ``library`` (it is importing it); without /proc,
    after a second."""
    fallback = _after_s(1.0)

    def ready(proc) -> bool:
        if proc.poll() is not None:  # ended without mapping it: not a moment of this run (the caller's assert says)
            return True
        try:
            return library in Path(f"/proc/{proc.pid}/maps").read_text()
        except OSError:
            return fallback(proc)

    return ready


@pytest.mark.parametrize("moment", ["numpy", "sqlalchemy", "triton"])
def test_ctrl_c_while_the_tool_starts_is_130_and_one_line(tmp_path, moment):
    """Early: while the CLI imports its libraries (the space's, the database's, then Triton's for the compile check;
    torch only ever in the compile processes), caught as it maps them."""
    args = ["check", SMOKE, "-q", "--db", f"sqlite:///{tmp_path / 'c.db'}"]
    rc, _, err, alive = _ctrl_c(args, tmp_path, _after_mapped(moment))
    assert alive  # the check compiles for seconds after its imports
    _interrupted_cleanly(rc, err, alive)


CTRL_C_IN_IMPORT = """
import os, signal, time
hit = False
try:  # as Triton's extension does: the KeyboardInterrupt caught in its initialization, another error raised after
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)
except KeyboardInterrupt:
    hit = True
if hit:
    raise ImportError("initialization failed")
"""


def test_ctrl_c_that_breaks_an_adapters_import_is_130_not_a_bad_space(tmp_path):
    """A Ctrl-C that an extension turns into another error, with no KeyboardInterrupt in its chain, is still the
    interrupt: exit 130 and one line, not "module ... does not import" and exit 2."""
    (tmp_path / "ctrlc_adapter.py").write_text(CTRL_C_IN_IMPORT)
    space = tmp_path / "space.yaml"
    space.write_text(Path(SMOKE).read_text().replace("name: smoke", "name: smoke\nkernel: 'ctrlc_adapter:Adapter'"))
    env = {"PYTHONPATH": str(tmp_path), "TUNER_ADAPTERS": "ctrlc_adapter"}
    rc, _, err, alive = _ctrl_c(["check", str(space), "-q"], tmp_path, lambda proc: proc.poll() is not None,
                                env=env)  # fmt: skip
    assert rc == 130 and err.strip().splitlines() == ["interrupted"], (rc, err[-2000:])


def test_ctrl_c_during_a_check_is_130_and_one_line(tmp_path):
    """During the command: once it has said what it checks (the compile process at work)."""
    rc, _, err, alive = _ctrl_c(["check", SMOKE, "--db", f"sqlite:///{tmp_path / 'c.db'}"], tmp_path,
                                _after_line("stderr"))  # fmt: skip
    _interrupted_cleanly(rc, err, alive)


def test_ctrl_c_at_the_end_of_export_is_130_and_one_line(tmp_path, results_db):
    """At the end: once export printed its first table's path, while it writes the rest and exits."""
    args = ["export", "--db", f"sqlite:///{results_db}", "--out", str(tmp_path / "tables")]
    rc, _, err, alive = _ctrl_c(args, tmp_path, _after_line("stdout"))
    _interrupted_cleanly(rc, err, alive)


def test_ctrl_c_during_a_replayed_search_is_130(tmp_path, replayed):
    """A search stops after the running trial (its own line), whatever it was doing: its optimization worker, started
    with SIGINT ignored, never prints a traceback of its own."""
    space, recorded = replayed
    args = [
        "search",
        space,
        "-q",
        "--backend",
        "replay",
        "--replay-db",
        recorded,
        "--db",
        f"sqlite:///{tmp_path / 's.db'}",
    ]
    for seconds in (1.0, 2.0, 3.0):
        rc, _, err, alive = _ctrl_c(args, tmp_path, _after_s(seconds))
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
        assert rc == (130 if alive else 0), (rc, err[-3000:])


# --- a space file from a pipe or `-` (item 10) -----------------------------------------------------------------


def test_a_space_from_process_substitution_or_stdin_is_read(tmp_path):
    """`tuner check <(cat space.yaml)` (a /dev/fd pipe) and `cat space.yaml | tuner check -`, as a shell runs them."""
    if not shutil.which("bash"):
        pytest.skip("needs bash for <(...)")
    exe = " ".join(_command())
    db = f"sqlite:///{tmp_path / 'c.db'}"
    for line in (
        f"{exe} check <(cat {SMOKE}) -q -f json --db {db}",
        f"cat {SMOKE} | {exe} check - -q -f json --db {db}",
    ):
        proc = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert len(__import__("json").loads(proc.stdout)) >= 1


def test_a_space_from_a_fifo_and_stdin_in_process(tmp_path, monkeypatch):
    import io
    import threading

    fifo = tmp_path / "space.fifo"
    os.mkfifo(fifo)
    text = Path(SMOKE).read_text()
    writer = threading.Thread(target=lambda: fifo.write_text(text), daemon=True)
    writer.start()
    db = ["--db", f"sqlite:///{tmp_path / 'c.db'}"]
    proc = tuner("check", str(fifo), "-q", *db)
    writer.join(timeout=60)
    assert proc.returncode == 0, proc.stderr

    class Stdin:
        def __init__(self, data: bytes):
            self.buffer = io.BytesIO(data)

    monkeypatch.setattr(sys, "stdin", Stdin(text.encode()))
    from sparse_mla_tuner.tuner.space import load_space

    space = load_space("-")
    assert space.name == "smoke" and str(space.path) == "<stdin>"
    monkeypatch.setattr(sys, "stdin", Stdin(b"# " + b"x" * 1_100_000))
    with pytest.raises(Exception, match="at most 1000000"):
        load_space("-")  # bounded: a pipe is read to at most the limit, never whole
    monkeypatch.setattr(sys, "stdin", Stdin(b"name: [x\n"))
    with pytest.raises(Exception, match=r"<stdin>: not valid YAML"):
        load_space("-")


def test_a_huge_space_on_a_pipe_is_bounded(tmp_path):
    fifo = tmp_path / "big.fifo"
    os.mkfifo(fifo)
    code = f"try:\n    open({str(fifo)!r}, 'wb').write(b'# ' + b'x' * 5_000_000)\nexcept BrokenPipeError:\n    pass\n"
    writer = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.DEVNULL)
    proc = tuner("check", str(fifo), "--db", f"sqlite:///{tmp_path / 'c.db'}")
    writer.kill()
    writer.wait()
    _one_sentence(proc, "at most 1000000")
    assert not (tmp_path / "c.db").exists()
