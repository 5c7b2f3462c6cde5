"""Nothing lost, nothing reported falsely: a database file deleted, moved or replaced under a running
command, a full disk, a quota, a read-only file system. Each stops the command with one sentence naming
the path and a non-zero exit; what was recorded before stays recorded."""

import errno
import os
import shutil
import sqlite3
import subprocess
import sys
import time

import optuna
import pytest
import sqlalchemy
from click.testing import CliRunner

from sparse_mla_tuner.db.errors import DatabaseError
from sparse_mla_tuner.db.store import Store
from sparse_mla_tuner.db.store import resource_error
from sparse_mla_tuner.tuner.cli import cli
from tests.conftest import cheap_smoke

SMOKE = "search_spaces/smoke.yaml"


def _tuner_cmd():
    exe = shutil.which("tuner")
    return [exe] if exe else [sys.executable, "-m", "sparse_mla_tuner.tuner"]


def _count(path, table="tuner_trials") -> int:
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return con.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:
        return 0


def _one_sentence(stderr: str, fragment: str) -> str:
    assert "Traceback" not in stderr, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and fragment in last, stderr
    assert len(last) < 600, last
    return last


# --- the file under the database's path is no longer the one opened ------------------------------


@pytest.mark.parametrize("how", ["delete", "move", "replace"])
def test_verify_notices_the_file_is_gone_or_another(tmp_path, how):
    path = tmp_path / "t.db"
    store = Store(f"sqlite:///{path}")
    store.verify()  # the file it opened
    with store.session():
        pass
    if how == "delete":
        path.unlink()
    elif how == "move":
        path.rename(tmp_path / "elsewhere.db")
    else:  # `mv other.db t.db`: another valid database takes the name
        Store(f"sqlite:///{tmp_path / 'other.db'}").engine.dispose()
        os.replace(tmp_path / "other.db", path)
    fragment = "was replaced by another file" if how == "replace" else "was deleted or moved away"
    with pytest.raises(DatabaseError, match=fragment):
        store.verify()
    with pytest.raises(DatabaseError, match=fragment):  # and no write is committed through it
        with store.session():
            pass


def test_verify_is_quiet_for_a_file_written_in_place(tmp_path):
    path = tmp_path / "t.db"
    store = Store(f"sqlite:///{path}")
    other = Store(f"sqlite:///{path}")  # another process's handle writing the same file
    with other.session() as s:
        s.execute(sqlalchemy.text("CREATE TABLE x (a INTEGER)"))
    store.verify()


@pytest.mark.parametrize("how", ["delete", "replace"])
def test_search_stops_when_its_database_is_deleted_or_replaced(tmp_path, how):
    """The search must not exit 0 and print "results in ..." for a file that does not hold them."""
    path = tmp_path / "s.db"
    space = cheap_smoke(tmp_path)  # what is tested is the stop: the fewest rounds allowed
    cmd = [*_tuner_cmd(), "search", space, "-q", "--backend", "interpreter", "--db", f"sqlite:///{path}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        while _count(path) < 1:  # the first trial is recorded: the search is under way
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.2)
        if how == "replace":  # `mv other.db s.db`: another valid database takes the name
            Store(f"sqlite:///{tmp_path / 'other.db'}").engine.dispose()
            os.replace(tmp_path / "other.db", path)
        else:
            path.unlink()
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 2, err
    assert "results in" not in err and out.strip() == ""
    _one_sentence(err, "was replaced by another file" if how == "replace" else "was deleted or moved away")


# --- the storage cannot take a write ---------------------------------------------------------------


def _wrapped(cause: BaseException) -> BaseException:
    """``cause`` as Optuna's storage raises it: StorageInternalError from SQLAlchemy's error from the driver's."""
    try:
        try:
            raise sqlalchemy.exc.OperationalError("INSERT INTO trials ...", {}, cause)
        except sqlalchemy.exc.OperationalError as e:
            raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from e
    except optuna.exceptions.StorageInternalError as e:
        return e


@pytest.mark.parametrize(
    "cause, fragment",
    [
        (sqlite3.OperationalError("database or disk is full"), "the disk is full"),
        (OSError(errno.ENOSPC, "No space left on device"), "the disk is full"),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), "the disk quota is exceeded"),
        (OSError(errno.EROFS, "Read-only file system"), "the file system is read-only"),
        (sqlite3.OperationalError("attempt to write a readonly database"), "is read-only"),
        (Exception('could not extend file "base/16384/2619": No space left on device'), "the disk is full"),
        (Exception("cannot execute INSERT in a read-only transaction"), "the database is read-only"),
    ],
    ids=["sqlite-full", "enospc", "edquot", "erofs", "sqlite-readonly", "pg-full", "pg-readonly"],
)
def test_resource_errors_are_one_sentence_naming_the_path(cause, fragment):
    url = "postgresql+psycopg://u:SECRET@db.example/tuner" if "pg" in str(cause) else "sqlite:////data/t.db"
    for e in (cause, _wrapped(cause)):
        err = resource_error(e, url)
        assert isinstance(err, DatabaseError) and fragment in str(err)
        assert "SECRET" not in str(err) and ("db.example" in str(err) or "/data/t.db" in str(err))
        assert "\n" not in str(err)


def test_other_errors_are_not_called_resource_errors():
    assert resource_error(_wrapped(sqlite3.OperationalError("no such table: trials")), "sqlite:///t.db") is None
    assert resource_error(OSError(errno.ENOENT, "No such file"), "sqlite:///t.db") is None


class _FullAfter:
    """An SQLAlchemy hook that answers SQLite's "database or disk is full" from the ``n``-th insert of a
    trial row on, the way a disk that fills up mid-search does."""

    def __init__(self, n: int) -> None:
        self.n, self.seen = n, 0

    def __call__(self, conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("INSERT INTO TUNER_TRIALS"):
            self.seen += 1
            if self.seen >= self.n:
                raise sqlite3.OperationalError("database or disk is full")


def test_a_disk_that_fills_mid_search_is_one_sentence_and_loses_nothing(tmp_path):
    """The writes fail in the results database whatever measures, so the search replays a small recording
    (tests/recorded.py); the interpreter backend's measurement process stopping on a database error is
    test_search_stops_when_its_database_is_deleted_or_replaced's."""
    from sparse_mla_tuner.tuner.space import load_space
    from tests.recorded import SMALL_SPACE
    from tests.recorded import make_recorded

    recorded, space = make_recorded(tmp_path / "recorded.db"), tmp_path / "small.yaml"
    space.write_text(SMALL_SPACE)
    configs = load_space(str(space)).configs()
    path = tmp_path / "f.db"
    url = f"sqlite:///{path}"
    args = [
        "search", str(space), "-q", "--backend", "replay", "--replay-db", f"sqlite:///{recorded}",
        "--concurrency", "1", "--db", url,
    ]  # fmt: skip
    hook = _FullAfter(3)
    sqlalchemy.event.listen(sqlalchemy.engine.Engine, "before_cursor_execute", hook)
    try:
        result = CliRunner().invoke(cli, args)
    finally:
        sqlalchemy.event.remove(sqlalchemy.engine.Engine, "before_cursor_execute", hook)
    assert result.exit_code == 2, (result.stderr, result.exception)
    _one_sentence(result.stderr, f"cannot write {url}: the disk is full")
    assert "results in" not in result.stderr
    con = sqlite3.connect(path)
    before = con.execute("SELECT config_key, verdict FROM tuner_trials ORDER BY id").fetchall()
    samples = con.execute("SELECT trial_id, phase, round, candidate_us FROM tuner_samples ORDER BY id").fetchall()
    con.close()
    assert len(before) == 2  # the two trials recorded before the disk filled are there, whole
    # with room again, the search resumes: the two are kept as they were, the rest measured once
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, (result.stderr, result.exception)
    con = sqlite3.connect(path)
    after = con.execute("SELECT config_key, verdict FROM tuner_trials ORDER BY id").fetchall()
    now = con.execute("SELECT trial_id, phase, round, candidate_us FROM tuner_samples ORDER BY id").fetchall()
    con.close()
    assert after[:2] == before and len(after) == len(configs) and len({k for k, _ in after}) == len(configs)
    assert set(samples) <= set(now)  # every sample measured before the disk filled, unchanged


def _as_root_in_a_mount_namespace(script: str, *args: str) -> subprocess.CompletedProcess:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) for a private tmpfs")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("cannot make a private mount namespace here")
    return subprocess.run(["unshare", "-m", "sh", "-c", script, *args], capture_output=True, text=True, timeout=600)


def test_a_full_file_system_is_one_sentence_in_every_writing_command(tmp_path):
    """A real full disk: a small tmpfs, the database created on it, then filled to the last block. The commands are
    processes of their own, one after another, forked after one import (conftest.py's tuner_processes, started
    under the mount)."""
    from tests.conftest import tuner_processes

    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if _as_root_in_a_mount_namespace('mount -t tmpfs -o size=4m tmpfs "$0"', str(mnt)).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    db = f"sqlite:///{mnt}/t.db"
    script = (
        'mount -t tmpfs -o size=4m tmpfs "$0" && "$1" -c "from sparse_mla_tuner.db.store import Store; Store(\'$2\')" '
        '&& { dd if=/dev/zero of="$0/filler" bs=4k 2>/dev/null; shift 2; exec "$@"; }'
    )
    search, check, studies = tuner_processes(
        [
            ["search", SMOKE, "-q", "--backend", "interpreter", "--db", db],
            ["check", SMOKE, "-q", "--db", db],
            ["studies", "--db", db],
        ],
        prefix=["unshare", "-m", "sh", "-c", script, str(mnt), sys.executable, db],
    )
    for proc in (search, check):
        assert proc.returncode == 2, (proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr, proc.stderr
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
        assert len(errors) == 1 and f"cannot write {db}: the disk is full" in errors[0], proc.stderr
    assert studies.returncode == 0 and "Traceback" not in studies.stderr, studies.stderr
