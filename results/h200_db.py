"""results/h200.db, built from a base that never changes and per-run deltas that are only ever added.

The committed H200 results database is 59 MiB; committed again at every re-tune, each version stayed in every clone's
pack. Now git holds ``results/h200_db/base.sqlite`` (the database as it was when this file came, never rewritten)
and one small xz'd JSON delta per run (``results/h200_db/deltas/NNNN-DATE.json.xz``: the rows that run added or
changed, column by column, and the rows it removed), and ``results/h200.db`` is a build product, ignored by git::

    python results/h200_db.py build              # results/h200.db from the base and every delta (a no-op when current)
    python results/h200_db.py delta NEW.db       # a returned database's changes as the next delta, then build

A GPU run (``results/h200.sh``) writes into ``results/h200.db``; ``delta`` turns the database it returns into the
next delta file (commit that file). A migration's schema change is a delta too (its changed tables whole). Only
the standard library is used.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import lzma
import os
import shutil
import sqlite3
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PARTS = HERE / "h200_db"
BASE = PARTS / "base.sqlite"
DELTAS = PARTS / "deltas"
DB = HERE / "h200.db"
# the base's bytes, which never change (tests/test_results_db.py): a new base is a schema change's, and a new name
BASE_SHA256 = "a1371ba34909ddb890df4105592268a1962791ac3b2aa279d2a5fbe49c8f09ac"
STAMP = HERE / "h200.db.built"  # which base and deltas the built database holds (ignored by git, as the database)


class DeltaError(Exception):
    """A database that cannot be written as a delta of the built one, in one sentence."""


def _parts() -> list[Path]:
    return [BASE, *sorted(DELTAS.glob("*.json.xz"))]


def _stamp() -> str:
    return json.dumps([[p.name, p.stat().st_size] for p in _parts()])


def is_current(db: Path = DB) -> bool:
    """Whether ``db`` was built from the base and exactly the deltas there are now."""
    return db.is_file() and STAMP.is_file() and STAMP.read_text() == _stamp()


def _tables(con: sqlite3.Connection) -> dict[str, str]:
    rows = con.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
    return dict(rows)


def _indexes(con: sqlite3.Connection) -> dict[str, tuple[str, str]]:
    """Every index made by a statement: its table and its SQL, by name."""
    rows = con.execute("SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL")
    return {name: (table, sql) for name, table, sql in rows}


def _rows(con: sqlite3.Connection, table: str) -> tuple[list[str], dict[int, tuple]]:
    cur = con.execute(f'SELECT rowid, * FROM "{table}"')
    columns = [d[0] for d in cur.description][1:]
    return columns, {row[0]: row[1:] for row in cur}


def _plain(value):
    if isinstance(value, bytes):
        raise DeltaError("a BLOB value: the results database holds none, and a delta is JSON")
    return value


def make_delta(old: sqlite3.Connection, new: sqlite3.Connection) -> dict:
    """What turns ``old`` into ``new``: per table the rows added or changed (whole: their rowids, and their values
    column by column, which compress twice as well as rows) and the rowids removed; and the schema's changes (a
    migration): a new or changed table is made anew from its statement, a table gone is dropped, and an index new,
    changed or on a table made anew is made again. A table made anew holds all its rows in the delta, but a column
    whose every value is the old table's (a migration that adds a column keeps the others) is named in ``reuse``
    and read back from the old table instead."""
    old_tables, new_tables = _tables(old), _tables(new)
    old_indexes, new_indexes = _indexes(old), _indexes(new)
    remade = {t for t, sql in new_tables.items() if old_tables.get(t) != sql}
    delta = {
        "drop": sorted(old_tables.keys() - new_tables.keys()),
        "tables": {t: new_tables[t] for t in sorted(remade)},
        "drop_indexes": sorted(i for i in old_indexes if i not in new_indexes and old_indexes[i][0] in new_tables),
        "indexes": {
            i: sql for i, (t, sql) in sorted(new_indexes.items()) if t in remade or old_indexes.get(i) != (t, sql)
        },
        "rows": {},
    }
    for table in sorted(new_tables):
        columns, now = _rows(new, table)
        old_columns, before = _rows(old, table) if table in old_tables else ([], {})
        reuse = []
        if table in remade:  # every row is written anew; a column the old table holds whole is read back from it
            same_rows = before.keys() == now.keys()
            for i, c in enumerate(columns):
                if same_rows and c in old_columns:
                    j = old_columns.index(c)
                    if all(before[r][j] == row[i] for r, row in now.items()):
                        reuse.append(c)
            before = {}
        upsert = [(rowid, row) for rowid, row in now.items() if before.get(rowid) != row]
        delete = sorted(rowid for rowid in before if rowid not in now)
        if upsert or delete:
            values = [[] if c in reuse else [_plain(row[i]) for _, row in upsert] for i, c in enumerate(columns)]
            rowids = [rowid for rowid, _ in upsert]
            d = {"columns": columns, "rowids": rowids, "values": values, "delete": delete}
            delta["rows"][table] = {**d, "reuse": reuse} if reuse else d
    return delta


def apply_delta(con: sqlite3.Connection, delta: dict) -> None:
    kept = {}  # a remade table's reused columns, read before it is dropped: {table: {rowid: {column: value}}}
    for table, d in delta["rows"].items():
        if d.get("reuse"):
            names = ", ".join(f'"{c}"' for c in d["reuse"])
            cur = con.execute(f'SELECT rowid, {names} FROM "{table}"')
            kept[table] = {r[0]: dict(zip(d["reuse"], r[1:], strict=True)) for r in cur}
    for table in delta.get("drop", []):
        con.execute(f'DROP TABLE IF EXISTS "{table}"')
    for index in delta.get("drop_indexes", []):
        con.execute(f'DROP INDEX IF EXISTS "{index}"')
    for table, sql in delta["tables"].items():  # made anew (its indexes go with it, and come back below)
        con.execute(f'DROP TABLE IF EXISTS "{table}"')
        con.execute(sql)
    for table, d in delta["rows"].items():
        con.executemany(f'DELETE FROM "{table}" WHERE rowid = ?', [(r,) for r in d["delete"]])
        names = ", ".join(f'"{c}"' for c in ["rowid", *d["columns"]])
        marks = ", ".join("?" * (len(d["columns"]) + 1))
        if table in kept:
            old = kept[table]
            values = [
                [old[r][c] for r in d["rowids"]] if c in old.get(d["rowids"][0], {}) else v
                for c, v in zip(d["columns"], d["values"], strict=True)
            ] if d["rowids"] else d["values"]  # fmt: skip
        else:
            values = d["values"]
        rows = zip(d["rowids"], *values, strict=True) if values else ((r,) for r in d["rowids"])
        con.executemany(f'INSERT OR REPLACE INTO "{table}" ({names}) VALUES ({marks})', rows)
    for index, sql in delta["indexes"].items():
        con.execute(f'DROP INDEX IF EXISTS "{index}"')
        con.execute(sql)


def build(db: Path = DB, force: bool = False) -> bool:
    """Write ``db`` from the base and the deltas, atomically (a reader never sees half a database); False when it
    was current already."""
    if not force and is_current(db):
        return False
    tmp = db.with_name(f".{db.name}.{os.getpid()}.tmp")
    try:
        shutil.copyfile(BASE, tmp)
        con = sqlite3.connect(tmp, isolation_level=None)
        try:
            con.execute("BEGIN")
            for path in _parts()[1:]:
                apply_delta(con, json.loads(lzma.decompress(path.read_bytes())))
            con.execute("COMMIT")
        finally:
            con.close()
        os.replace(tmp, db)
    finally:
        tmp.unlink(missing_ok=True)
    STAMP.write_text(_stamp())
    return True


def write_delta(new_db: Path, date: str | None = None) -> Path | None:
    """The changes of ``new_db`` against the built database, as the next delta file (None: nothing changed)."""
    if not new_db.is_file():
        raise DeltaError(f"{new_db} is not a file (the database a run returned, e.g. gunzip'd h200.db.gz.part*)")
    build()
    old = sqlite3.connect(f"file:{DB}?mode=ro", uri=True)
    new = sqlite3.connect(f"file:{new_db}?mode=ro", uri=True)
    try:
        delta = make_delta(old, new)
    finally:
        old.close()
        new.close()
    if not any(delta[k] for k in ("rows", "tables", "indexes", "drop", "drop_indexes")):
        return None
    DELTAS.mkdir(parents=True, exist_ok=True)
    number = 1 + max((int(p.name[:4]) for p in DELTAS.glob("*.json.xz")), default=0)
    path = DELTAS / f"{number:04d}-{date or dt.date.today().isoformat()}.json.xz"
    path.write_bytes(lzma.compress(json.dumps(delta, separators=(",", ":")).encode(), preset=9))
    build()
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python results/h200_db.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="results/h200.db from the base and every delta (a no-op when current)")
    b.add_argument("--force", action="store_true", help="build even when current")
    d = sub.add_parser("delta", help="NEW_DB's changes against the built database as the next delta file")
    d.add_argument("new_db", type=Path, help="the database a run returned")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            print(f"{DB} {'built' if build(force=args.force) else 'is current'}", file=sys.stderr)
        else:
            path = write_delta(args.new_db)
            print(path or f"{args.new_db} holds nothing new", file=sys.stderr if path is None else sys.stdout)
    except (DeltaError, sqlite3.DatabaseError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
