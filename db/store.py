"""Opening the results database: URL checks, SQLite tuning, schema migrations, sessions.

One URL for everything (``sqlite:///tuner.db`` by default, any SQLAlchemy URL such as
``postgresql+psycopg://...``); Optuna's tables live in the same database. Our Alembic history
uses its own version table, ``tuner_alembic_version`` (Optuna's Alembic already owns
``alembic_version``).
"""

from __future__ import annotations

import contextlib
import os
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
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session
from sqlalchemy.orm import sessionmaker

from db.errors import DatabaseError

VERSION_TABLE = "tuner_alembic_version"
MIGRATIONS = Path(__file__).parent / "migrations"
SCHEMES = ("sqlite", "postgresql")
DEFAULT_URL = "sqlite:///tuner.db"


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


def _check_url(url: str) -> None:
    try:
        u = make_url(url)
    except ArgumentError:
        raise DatabaseError(
            f"{url!r} is not a database URL; use e.g. sqlite:///tuner.db or postgresql://host/db"
        ) from None
    if u.get_backend_name() not in SCHEMES:
        raise DatabaseError(f"unsupported database URL scheme {u.drivername!r} in {url!r}; allowed: sqlite, postgresql")
    if u.get_backend_name() == "sqlite":
        if not u.database or u.database == ":memory:":
            raise DatabaseError(f"{url!r} names no file; an in-memory SQLite database would lose every result")
        path = Path(u.database)
        if path.is_dir():
            raise DatabaseError(f"{path} is a directory, not a database file")
        if path.exists():
            with open(path, "rb") as f:
                head = f.read(16)
            if path.stat().st_size and head != b"SQLite format 3\x00":
                raise DatabaseError(f"{path} is not a SQLite database")
        else:
            parent = path.parent if str(path.parent) else Path(".")
            if not parent.is_dir():
                raise DatabaseError(f"cannot create {path}: directory {parent} does not exist")
            if not os.access(parent, os.W_OK):
                raise DatabaseError(f"cannot create {path}: directory {parent} is not writable")


def _sqlite_pragmas(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_con, _record):  # several local writers: WAL + a generous busy timeout
        cur = dbapi_con.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA busy_timeout=60000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()


class Store:
    """The results database at ``url``; created at the head schema if new.

    ``Store(url)`` refuses (with one sentence) a file that is not a database, a schema newer than
    this code, and an older schema (``tuner db upgrade`` migrates it).
    """

    def __init__(self, url: str | None = None, *, upgrade: bool = False) -> None:
        self.url = url or default_url()
        _check_url(self.url)
        try:
            self.engine = create_engine(self.url, future=True)
            if self.engine.dialect.name == "sqlite":
                _sqlite_pragmas(self.engine)
            self._sessions = sessionmaker(self.engine, expire_on_commit=False)
            self._prepare_schema(upgrade)
        except SQLAlchemyError as e:
            raise DatabaseError(f"cannot open {self._safe_url()}: {_short(e)}") from None

    def _safe_url(self) -> str:
        return make_url(self.url).render_as_string(hide_password=True)

    def revision(self) -> str | None:
        with self.engine.connect() as con:
            return MigrationContext.configure(con, opts={"version_table": VERSION_TABLE}).get_current_revision()

    def _prepare_schema(self, upgrade: bool) -> None:
        current = self.revision()
        script = ScriptDirectory.from_config(alembic_config(self.url))
        head = script.get_current_head()
        if current == head:
            return
        if current is None:
            tables = set(inspect(self.engine).get_table_names())
            if any(t.startswith("tuner_") for t in tables):
                raise DatabaseError(f"{self._safe_url()} has tuner tables but no schema version; it cannot be used")
            self._upgrade()
            return
        known = {rev.revision for rev in script.walk_revisions()}
        if current not in known:
            raise DatabaseError(
                f"{self._safe_url()} has schema {current}, newer than this sparse-mla-tuner knows (head {head}); "
                "upgrade sparse-mla-tuner to read it"
            )
        if not upgrade:
            raise DatabaseError(
                f"{self._safe_url()} has the older schema {current} (current {head}); run `tuner db upgrade` first"
            )
        self._upgrade()

    def _upgrade(self) -> None:
        cfg = alembic_config(self.url)
        with self.engine.begin() as con:
            cfg.attributes["connection"] = con
            command.upgrade(cfg, "head")

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        """Commit on success, roll back on error; SQLAlchemy errors become :class:`DatabaseError`."""
        session = self._sessions()
        try:
            yield session
            session.commit()
        except SQLAlchemyError as e:
            session.rollback()
            raise DatabaseError(f"database error on {self._safe_url()}: {_short(e)}") from None
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()


def _short(e: Exception) -> str:
    text = str(getattr(e, "orig", None) or e).strip().splitlines()
    return text[0] if text else type(e).__name__
