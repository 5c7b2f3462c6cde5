"""Opening the results database: URL checks, SQLite tuning, schema migrations, sessions.

One URL for everything (``sqlite:///tuner.db`` by default, any SQLAlchemy URL such as
``postgresql+psycopg://...``); Optuna's tables live in the same database. Our Alembic history
uses its own version table, ``tuner_alembic_version`` (Optuna's Alembic already owns
``alembic_version``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import sqlite3
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine
from sqlalchemy import event
from sqlalchemy import inspect
from sqlalchemy.engine import Engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.exc import NoSuchModuleError
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session
from sqlalchemy.orm import sessionmaker

from .errors import QUOTE_MAX
from .errors import DatabaseError
from .errors import DatabaseGoneError
from .errors import DatabaseReadOnlyError
from .errors import quote
from .paths import PathError
from .paths import kind
from .paths import regular_or_missing

VERSION_TABLE = "tuner_alembic_version"
MIGRATIONS = Path(__file__).parent / "migrations"
SCHEMES = ("sqlite", "postgresql")
DEFAULT_URL = "sqlite:///tuner.db"
# the pip package that provides each DBAPI module SQLAlchemy may ask for
DRIVER_PACKAGES = {
    "psycopg": "psycopg[binary]",
    "psycopg2": "psycopg2-binary",
    "pg8000": "pg8000",
    "asyncpg": "asyncpg",
    "MySQLdb": "mysqlclient",
    "pymysql": "PyMySQL",
}
_SCHEMA_LOCK_KEY = 0x7475_6E65  # "tune": PostgreSQL advisory lock held while the schema is created
_USERINFO = re.compile(r"(//[^/:@\s]*:)\S*@")
_BARE_USERINFO = re.compile(r"(\b[\w.%+-]+:)[^\s@/:]+@")  # user:password@host without a scheme
_QUERY_SECRET = re.compile(r"([?&;](?:password|passwd|pwd|sslpassword)=)[^&;#\s]*", re.IGNORECASE)


# errno values that mean "this file system cannot take the write", and SQLite's and PostgreSQL's words for them
_RESOURCE_ERRNOS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only",
    errno.ENAMETOOLONG: "the file name is too long",
}
_RESOURCE_TEXTS = (
    ("database or disk is full", "the disk is full"),
    ("no space left on device", "the disk is full"),
    ("could not extend file", "the disk is full"),
    ("disk quota exceeded", "the disk quota is exceeded"),
    ("attempt to write a readonly database", "the database file or its directory is read-only"),
    ("read-only file system", "the file system is read-only"),
    ("in a read-only transaction", "the database is read-only"),  # PostgreSQL: "cannot execute INSERT in a ..."
    ("disk i/o error", "the disk failed a read or write"),  # a full disk, as SQLite grows its -shm or -wal
    ("file name too long", "the file name is too long"),
)


def _chain(e: BaseException):
    """``e``, what it wraps (SQLAlchemy's ``orig``) and what caused it, each once."""
    seen, todo = set(), [e]
    while todo:
        x = todo.pop(0)
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        yield x
        todo += [getattr(x, "orig", None), x.__cause__, x.__context__]


def resource_error(e: BaseException, where: str) -> DatabaseError | None:
    """``e`` as one sentence naming ``where`` when it says the storage cannot take the write (disk
    full, quota, read-only, name too long), at any depth of its chain (Optuna's StorageInternalError
    wraps SQLAlchemy's error, which wraps the driver's); None for anything else."""
    for x in _chain(e):
        why = _RESOURCE_ERRNOS.get(x.errno) if isinstance(x, OSError) else None
        if why is None:
            text = str(x).lower()
            why = next((w for t, w in _RESOURCE_TEXTS if t in text), None)
        if why is not None and why.startswith("the disk failed"):  # an I/O error is ours only on a full disk
            why = "the disk is full" if _full(where) else None
        if why is not None:
            shown = redact_url(where)
            if isinstance(x, OSError) and x.filename and why == "the file name is too long":
                shown = quote(x.filename)
            said = (x.strerror if isinstance(x, OSError) else None) or str(x)
            said = redact_url(" ".join(said.split()))[:120]
            return DatabaseError(
                f"cannot write {shown}: {why} ({said}); everything recorded before this stays in the database "
                "(make room or fix it, then run the command again: a search resumes)"
            )
    return None


def _full(url: str) -> bool:
    """Whether the file system of a sqlite:/// URL's file has no space left (SQLite reports a full disk
    while it grows its -shm or -wal file as a plain "disk I/O error")."""
    try:
        u = make_url(url)
        if u.get_backend_name() != "sqlite" or not u.database:
            return False
        st = os.statvfs(os.path.dirname(os.path.abspath(u.database)))
    except (ArgumentError, OSError, ValueError):
        return False
    return st.f_bavail * st.f_frsize < 64 * 1024


def file_identity(path: str | os.PathLike) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path``; None when nothing is there."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return st.st_dev, st.st_ino


def redact_url(url: str) -> str:
    """``url`` with its password replaced by ``***``, for every message, log line, row and file.

    Works on any string, parsable or not: the ``//user:password@`` part and ``password=`` query
    arguments are masked.
    """
    text = _BARE_USERINFO.sub(r"\1***@", _USERINFO.sub(r"\1***@", str(url)))
    return _QUERY_SECRET.sub(r"\1***", text)


def default_url() -> str:
    return os.environ.get("TUNER_DB") or DEFAULT_URL


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.set_main_option("version_table", VERSION_TABLE)
    return cfg


def head_revision() -> str:
    return ScriptDirectory.from_config(alembic_config(DEFAULT_URL)).get_current_head()


OPTUNA_VERSION_TABLE = "alembic_version"  # Optuna's own Alembic history, beside ours


def check_optuna_schema(engine: Engine, shown_url: str) -> None:
    """DatabaseError in one sentence when Optuna's tables in this database are at a schema that the installed
    Optuna cannot use: its version table holding several rows or a revision Optuna does not know (a damaged
    table, or a newer Optuna's), or an older Optuna's schema. Optuna itself would stop with a RuntimeError or
    Alembic's "more than one head"; a database without Optuna's tables passes (Optuna creates them)."""
    with engine.connect() as con:
        if not inspect(con).has_table(OPTUNA_VERSION_TABLE):
            return
        heads = MigrationContext.configure(con, opts={"version_table": OPTUNA_VERSION_TABLE}).get_current_heads()
    if not heads:
        return
    import optuna
    from optuna.storages import _rdb

    script = ScriptDirectory(str(Path(_rdb.__file__).parent / "alembic"))
    head = script.get_current_head()
    shown = ", ".join(quote(h, 40) for h in heads[:5]) + (", ..." if len(heads) > 5 else "")
    where = f"{shown_url}: Optuna's schema version table {OPTUNA_VERSION_TABLE}"
    if len(heads) > 1:
        raise DatabaseError(
            f"{where} is damaged: it holds {len(heads)} rows ({shown}) where a database holds one; restore the "
            "file from a copy, or delete every row but the right one"
        )
    if heads[0] == head:
        return
    if heads[0] in {r.revision for r in script.walk_revisions()}:
        raise DatabaseError(
            f"{where} holds {shown}, an older Optuna's schema than optuna {optuna.__version__} uses ({head}); "
            "run `optuna storage upgrade --storage URL` with this database's URL first"
        )
    raise DatabaseError(
        f"{where} holds {shown}, which optuna {optuna.__version__} does not know (its newest is {head}): a damaged "
        "table or a newer Optuna's schema; restore the file from a copy, or upgrade optuna"
    )


def check_url(url: str, create: bool, option: str = "--db", write: bool | None = None) -> None:
    """The one check of a database URL, shared by ``--db`` and ``--replay-db`` (``option`` names it): parsable,
    sqlite or postgresql, a port in 1..65535, a synchronous driver, and for SQLite a file path whose file (when
    there) is a regular SQLite file, and one this process can write when ``write`` (default: ``create``);
    DatabaseError in one sentence otherwise (:class:`DatabaseReadOnlyError` for a file that cannot be written).
    Opens nothing that could block."""
    shown = redact_url(url)
    try:
        u = make_url(url)
        port = u.port
    except (ArgumentError, ValueError):
        raise DatabaseError(
            f"{option} {quote(shown)} is not a database URL; use e.g. sqlite:///tuner.db or postgresql+psycopg://host/db"
        ) from None
    if u.get_backend_name() not in SCHEMES:
        raise DatabaseError(
            f"{option}: unsupported database URL scheme {u.drivername!r} in {quote(shown)}; allowed: sqlite, postgresql"
        )
    if port is not None and not 1 <= port <= 65535:
        raise DatabaseError(f"{option} {quote(shown)} has the port {port}; a port is a number from 1 to 65535")
    try:  # the driver first: a missing one is named with its package, as opening would name it
        dialect = u.get_dialect()
        dialect.import_dbapi()
    except (ModuleNotFoundError, NoSuchModuleError) as e:
        raise _missing_driver(url, e) from None
    if getattr(dialect, "is_async", False):
        raise DatabaseError(
            f"{option} {quote(shown)} uses the async driver {u.get_driver_name()!r}; "
            "use a synchronous one such as sqlite:/// or postgresql+psycopg://"
        )
    if u.get_backend_name() == "sqlite":
        if not u.database or u.database == ":memory:" or u.database.startswith("file:"):
            raise DatabaseError(
                f"{quote(shown)} names no file path; use sqlite:///PATH (an in-memory database would lose every result)"
            )
        path = Path(u.database)
        try:
            _check_sqlite_path(path, create, create if write is None else write)
        except OSError as e:  # a name too long for the file system (Errno 36), a loop of links, ...
            raise DatabaseError(f"cannot use the database file {quote(path)}: {e.strerror}") from None


_check_url = check_url


def _shown_path(path) -> str:
    """A path as a message shows it: whole when it is of a sane length, else cut (see :func:`quote`)."""
    text = str(path)
    return text if len(text) <= QUOTE_MAX else quote(text)


def _check_sqlite_path(path: Path, create: bool, write: bool) -> None:
    """The file checks of a sqlite:/// URL; OSError from the file system passes through."""
    shown = _shown_path(path)
    try:  # a FIFO, a device or a directory is refused before anything opens it (a FIFO would block)
        st = regular_or_missing(path, "database file")
        head = _head(path) if st is not None else None
    except PathError as e:
        raise DatabaseError(str(e)) from None
    if st is not None:
        # what was read decides, not a later size: another process may be creating the file right now
        # (its first bytes are SQLite's header, or a part of it, or nothing yet)
        if not b"SQLite format 3\x00".startswith(head):
            raise DatabaseError(f"{shown} is not a SQLite database")
        parent = path.parent if str(path.parent) else Path(".")
        if write and not (os.access(path, os.W_OK) and os.access(parent, os.W_OK)):
            raise DatabaseReadOnlyError(
                f"cannot write {shown}: it or its directory is read-only (SQLite writes its -wal and -shm "
                "files there); the query commands can still read it"
            )
    elif not create:
        raise DatabaseError(f"no database at {shown}; run `tuner search` first")
    else:
        parent = path.parent if str(path.parent) else Path(".")
        if not parent.is_dir():
            why = "is not a directory" if os.path.lexists(parent) else "does not exist"
            raise DatabaseError(f"cannot create {shown}: {_shown_path(parent)} {why}")
        if not os.access(parent, os.W_OK):
            raise DatabaseError(f"cannot create {shown}: directory {_shown_path(parent)} is not writable")


def _head(path: Path, n: int = 16) -> bytes:
    """The first ``n`` bytes of a regular file, opened without blocking; PathError for anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as e:
        raise PathError(f"cannot read {_shown_path(path)}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PathError(f"{_shown_path(path)} is {kind(st.st_mode)}, not a regular file; the database must be one")
        return os.read(fd, n)
    finally:
        os.close(fd)


def _missing_driver(url: str, e: Exception) -> DatabaseError:
    """A DBAPI module or dialect that is not installed, as one sentence naming what to install."""
    shown, scheme = redact_url(url), url.split(":", 1)[0]
    name = getattr(e, "name", None)
    if isinstance(e, ModuleNotFoundError) and name:
        module = name.split(".")[0]
        package = DRIVER_PACKAGES.get(module, module)
        return DatabaseError(
            f"the database driver {module!r} for {scheme}:// URLs ({shown}) is not installed; "
            f"install it with `pip install '{package}'` or use postgresql+psycopg://"
        )
    return DatabaseError(
        f"SQLAlchemy has no dialect or driver {scheme!r} ({shown}); use sqlite:///PATH or postgresql+psycopg://"
    )


def _sqlite_pragmas(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_con, _record):  # several local writers: WAL + a generous busy timeout
        cur = dbapi_con.cursor()
        cur.execute("PRAGMA busy_timeout=60000")  # first, so that switching to WAL waits for other starters
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")  # WAL stays consistent; a commit no longer waits for fsync
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()


def _sqlite_readonly_connect(path: Path):
    """Open ``path`` read-only, never creating it; on a read-only directory a WAL database's -shm
    cannot be created, so that case falls back to ``immutable=1`` (nobody can be writing it there)."""
    uri = path.resolve().as_uri()
    con = sqlite3.connect(f"{uri}?mode=ro", uri=True, check_same_thread=False)
    try:
        con.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
    except sqlite3.OperationalError:
        con.close()
        con = sqlite3.connect(f"{uri}?mode=ro&immutable=1", uri=True, check_same_thread=False)
    con.execute("PRAGMA busy_timeout=60000")
    con.execute("PRAGMA query_only=ON")
    return con


_AT_EXIT: dict[str, list] = {}  # SQLite files written in this process: their engines, checkpointed at exit


def _checkpoint_at_exit(engine: Engine, database: str | None) -> None:
    """At this process's exit, however it ends (the executable ends with ``os._exit`` after its atexit callbacks,
    before the interpreter would close the connections): close ``engine``'s connections and fold the write-ahead log
    into the database file, so that the file alone holds everything measured (a user may copy just ``tuner.db``)."""
    if not database or database == ":memory:":
        return
    if not _AT_EXIT:
        import atexit

        atexit.register(_checkpoint_all)
    _AT_EXIT.setdefault(os.path.abspath(database), []).append(engine)


def _checkpoint_all() -> None:
    for path, engines in list(_AT_EXIT.items()):
        for engine in engines:
            with contextlib.suppress(Exception):
                engine.dispose()
        with contextlib.suppress(Exception):  # another process may hold it: its own exit folds the log in
            con = sqlite3.connect(path, timeout=0.1)  # never waits long: an exit stays prompt
            try:
                con.execute("PRAGMA wal_checkpoint(PASSIVE)")
            finally:
                con.close()
    _AT_EXIT.clear()


class Store:
    """The results database at ``url``; created at the head schema if new.

    ``Store(url)`` refuses (with one sentence) a file that is not a database, a schema newer than
    this code, and an older schema (``tuner db upgrade`` migrates it). ``readonly=True`` (the query
    commands) opens an existing database without writing anything, SQLite files read-only;
    ``create=False`` writes but never creates a database. Messages show the URL through
    :func:`redact_url`; :attr:`url` keeps the password for the connection itself.
    """

    def __init__(
        self, url: str | None = None, *, upgrade: bool = False, readonly: bool = False, create: bool = True
    ) -> None:
        self.url = url or default_url()
        self.readonly = readonly
        create = create and not readonly
        _check_url(self.url, create, write=not readonly)
        try:
            u = make_url(self.url)
            if u.get_backend_name() == "sqlite" and readonly:
                path = Path(u.database)
                self.engine = create_engine("sqlite://", creator=lambda: _sqlite_readonly_connect(path))
            else:
                self.engine = create_engine(self.url)
                if self.engine.dialect.name == "sqlite":
                    _sqlite_pragmas(self.engine)
                    _checkpoint_at_exit(self.engine, u.database)
            if self.engine.dialect.is_async:
                raise DatabaseError(
                    f"{self.shown_url} uses the async driver {self.engine.dialect.driver!r}; "
                    "use a synchronous one such as postgresql+psycopg://"
                )
            self._sessions = sessionmaker(self.engine, expire_on_commit=False)
            self._prepare_schema_retrying(upgrade, create)
        except (ModuleNotFoundError, NoSuchModuleError) as e:
            raise _missing_driver(self.url, e) from None
        except SQLAlchemyError as e:
            raise resource_error(e, self.url) or DatabaseError(
                f"cannot open {self.shown_url}: {self._short(e)}"
            ) from None
        # the file this handle opened: verify() notices when the path no longer leads to it
        self.path = os.path.abspath(u.database) if u.get_backend_name() == "sqlite" else None
        self.identity = file_identity(self.path) if self.path else None

    def verify(self) -> None:
        """Raise :class:`DatabaseGoneError` (a :class:`DatabaseError`) when the SQLite file at this store's
        path is no longer the file it opened (deleted, moved away or replaced): what was written since
        went to a file nobody can open, so no command may report results "in" the path. Also checked
        before every commit of a writing store (:meth:`session`). A no-op for PostgreSQL."""
        if self.path is None:
            return
        try:
            now = file_identity(self.path)
        except OSError as e:
            raise DatabaseError(f"cannot check {self.shown_url}: {e.strerror}") from None
        if now == self.identity:
            return
        what = "was deleted or moved away" if now is None else "was replaced by another file"
        raise DatabaseGoneError(
            f"{_shown_path(self.path)} {what} while this command ran, so what it wrote after that is in no file "
            "at that path; stopped (put the database back and run again: a search measures what is missing)"
        )

    @property
    def shown_url(self) -> str:
        """The URL as messages, logs, rows and files may show it (password masked)."""
        return redact_url(self.url)

    def _short(self, e: BaseException) -> str:
        text = redact_url(_short(e))
        password = make_url(self.url).password if "://" in self.url else None
        if password and len(password) >= 4:  # a driver may echo it; shorter ones would mangle the text
            text = text.replace(str(password), "***")
        return text

    def revision(self, con=None) -> str | None:
        """The schema revision in :data:`VERSION_TABLE` (None when it has none); DatabaseError when it holds
        several (a damaged table: Alembic itself would stop with "more than one head")."""
        if con is None:
            with self.engine.connect() as con:
                return self.revision(con)
        heads = MigrationContext.configure(con, opts={"version_table": VERSION_TABLE}).get_current_heads()
        if len(heads) > 1:
            shown = ", ".join(quote(h, 40) for h in heads[:5]) + (", ..." if len(heads) > 5 else "")
            raise DatabaseError(
                f"{self.shown_url} is damaged: its schema version table {VERSION_TABLE} holds {len(heads)} rows "
                f"({shown}) where a database holds one; restore the file from a copy, or delete every row but "
                "the right one"
            )
        return heads[0] if heads else None

    def _prepare_schema(self, upgrade: bool, create: bool) -> None:
        script = ScriptDirectory.from_config(alembic_config(self.url))
        head = script.get_current_head()
        current = self.revision()
        if current == head:
            return
        self._check_revision(current, head, script, upgrade, create)
        if self.readonly:
            return
        with self._schema_lock() as con:  # check again: another process may have been first
            current = self.revision(con)
            if current == head:
                return
            self._check_revision(current, head, script, upgrade, create)
            if current is None and any(t.startswith("tuner_") for t in inspect(con).get_table_names()):
                raise DatabaseError(f"{self.shown_url} has tuner tables but no schema version; it cannot be used")
            cfg = alembic_config(self.url)
            cfg.attributes["connection"] = con
            command.upgrade(cfg, "head")

    def _prepare_schema_retrying(self, upgrade: bool, create: bool, patience_s: float = 120.0) -> None:
        """:meth:`_prepare_schema`, again while SQLite answers "database is locked" (up to ``patience_s``).

        The busy timeout covers ordinary waits, but SQLite returns that error without waiting in some
        WAL cases (another process switching a new file to WAL, or closing the last connection and
        checkpointing, while this one opens it). Four searches started at once on a new file under
        load met it. Every step is a check followed by an idempotent, locked creation, so a retry is safe.
        """
        deadline, pause = time.monotonic() + patience_s, 0.05
        while True:
            try:
                return self._prepare_schema(upgrade, create)
            except OperationalError as e:
                locked = self.engine.dialect.name == "sqlite" and "database is locked" in str(e.orig)
                if not locked or time.monotonic() + pause > deadline:
                    raise
            self.engine.dispose()  # fresh connections: a connection that saw the lock may keep a stale view
            time.sleep(pause)
            pause = min(2 * pause, 2.0)

    def _check_revision(self, current, head, script, upgrade: bool, create: bool) -> None:
        if current is None:
            with self.engine.connect() as con:
                ours = [t for t in inspect(con).get_table_names() if t.startswith("tuner_") and t != VERSION_TABLE]
                if ours and self.revision(con) is not None:  # another process created the schema between the reads
                    return
            if ours:  # the version row is gone (a damaged table): nothing may guess the schema
                raise DatabaseError(
                    f"{self.shown_url} is damaged: it has tuner tables but no schema version (its table "
                    f"{VERSION_TABLE} is empty or missing); restore the file from a copy"
                )
            if not create:
                raise DatabaseError(f"{self.shown_url} holds no tuner results; run `tuner search` first")
            return
        known = {rev.revision for rev in script.walk_revisions()}
        if current not in known:
            if re.fullmatch(r"[0-9]{4}", current) and current > head:  # our revisions are numbered 0001, 0002, ...
                raise DatabaseError(
                    f"{self.shown_url} has schema {current}, newer than this sparse-mla-tuner knows (head {head}); "
                    "upgrade sparse-mla-tuner to read it"
                )
            raise DatabaseError(
                f"{self.shown_url} is damaged: its schema version table {VERSION_TABLE} holds {quote(current, 40)}, "
                f"which is no revision of sparse-mla-tuner's schema (0001 to {head}); restore the file from a copy"
            )
        if not upgrade:
            raise DatabaseError(
                f"{self.shown_url} has the older schema {current} (current {head}); run `tuner db upgrade` first"
            )

    @contextlib.contextmanager
    def _schema_lock(self):
        """A connection in a transaction that no other process can enter until it ends: creating the
        schema and stamping its version is one step, safe when several processes start at once."""
        if self.engine.dialect.name == "sqlite":
            engine = create_engine(self.url)

            @event.listens_for(engine, "connect")
            def _on_connect(dbapi_con, _record):
                dbapi_con.isolation_level = None  # the driver's implicit BEGIN would be DEFERRED
                dbapi_con.execute("PRAGMA busy_timeout=60000")
                dbapi_con.execute("PRAGMA journal_mode=WAL")

            @event.listens_for(engine, "begin")
            def _on_begin(con):
                con.exec_driver_sql("BEGIN EXCLUSIVE")

            try:
                with engine.begin() as con:
                    yield con
            finally:
                engine.dispose()
            return
        with self.engine.begin() as con:
            if self.engine.dialect.name == "postgresql":
                con.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_SCHEMA_LOCK_KEY})")
            yield con

    def file_bytes(self) -> int:
        """The size of an SQLite store's file with its write-ahead log (what a copy of it would take)."""
        wal = Path(f"{self.path}-wal")
        return os.path.getsize(self.path) + (wal.stat().st_size if wal.exists() else 0)

    def vacuum(self) -> None:
        """Rewrite an SQLite store's file without its free pages, the log checkpointed into it (a copy of the
        file alone then holds everything)."""
        try:
            with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as con:
                con.exec_driver_sql("VACUUM")
                con.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        except SQLAlchemyError as e:
            raise resource_error(e, self.url) or DatabaseError(
                f"cannot compact {self.shown_url}: {self._short(e)}"
            ) from None
        self.engine.dispose()

    def copy_to(self, path: Path) -> str:
        """A consistent copy of an SQLite store at ``path`` (SQLite's backup, log included); its URL. The file and
        its write-ahead log are only read, never checkpointed or changed."""
        wal = Path(f"{self.path}-wal")
        if not os.access(Path(self.path).parent, os.W_OK):
            # a read-only directory: nobody can be writing here, and SQLite could read the database only as
            # immutable, without the log a killed writer left (no -shm can be made beside it): copy both as bytes
            try:
                have_wal = regular_or_missing(wal, "write-ahead log") is not None
            except PathError as e:
                raise DatabaseError(str(e)) from None
            if have_wal:
                shutil.copyfile(self.path, path)
                shutil.copyfile(wal, f"{path}-wal")
                con = sqlite3.connect(path)  # the copy recovers the log
                try:
                    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                finally:
                    con.close()
                return f"sqlite:///{path}"
        src, dst = _sqlite_readonly_connect(Path(self.path)), sqlite3.connect(path)
        try:
            src.backup(dst)
        finally:
            src.close(), dst.close()
        return f"sqlite:///{path}"

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        """Commit on success, roll back on error; SQLAlchemy errors become :class:`DatabaseError`."""
        session = self._sessions()
        try:
            yield session
            if not self.readonly:
                self.verify()  # never commit to a file that is no longer the database's path
            session.commit()
        except SQLAlchemyError as e:
            session.rollback()
            raise resource_error(e, self.url) or DatabaseError(
                f"database error on {self.shown_url}: {self._short(e)}"
            ) from None
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()


def _short(e: BaseException) -> str:
    text = str(getattr(e, "orig", None) or e).strip().splitlines()
    return text[0] if text else type(e).__name__
