"""Small excerpts of the committed H200 results: a recorded database for replayed searches, and results to export.

:func:`make_recorded` copies, from ``results/h200.db``, the v4_flash trials of the newest kernel that measured
v4_flash at C=1 and C=8 (full grids: every config of :data:`SMALL_SPACE` is recorded there, with its verdict, its
duplicate's original and its samples) and those studies' A/A samples: what :mod:`tuner.replay` reads, in a file of a
few hundred kilobytes that loads at once. :data:`SMALL_SPACE` is 12 configs: 4 infeasible and at each level
at most 8 distinct launches, so a search measures every launch whatever its strategy and order.

:func:`make_results` copies the whole schema and the studies of two levels of each workload's newest kernel: what
export and report read, at a fraction of their cost on the whole record.
"""

import os
import sqlite3
from pathlib import Path

H200 = Path(__file__).resolve().parent.parent / "results" / "h200.db"
LEVELS = (1, 8)

SMALL_SPACE = """\
name: small
target: sm_120
workloads:
  - {name: v4_flash, kv_format: fp8_model1, heads: 64, tp: 4, topk: 512, page_size: 64, context: 8192}
concurrency: [1, 8]
parameters:
  BLOCK_T: [16, 32]
  num_warps: [4]
  num_stages: [1, 2, 3]
  TARGET_CTAS: [128, 256]
  PREFETCH: [0]
  BALANCED: [0]
constraints: []
baseline: {BLOCK_T: 16, num_warps: 4, num_stages: 2, TARGET_CTAS: 256}
measurement: {rounds: 10, finalists: 2, finalist_rounds: 30, trial_timeout_s: 60}
sampler: {name: surrogate, seed: 0}
"""

_TABLES = {  # table -> the rows kept (the trials: workload v4_flash, the newest kernel, LEVELS)
    "tuner_environments": "1",
    "tuner_kernels": "1",
    "tuner_workloads": "1",
    "tuner_trials": "id IN (SELECT id FROM keep)",
    "tuner_samples": "trial_id IN (SELECT id FROM keep)",
    "tuner_studies": "id IN (SELECT study_id FROM keep)",
    "tuner_noise": "study_id IN (SELECT study_id FROM keep)",
}


def make_recorded(path: Path) -> Path:
    """Write the small recorded database to ``path`` (read-only source: results/h200.db) and return it."""
    if path.exists():
        os.remove(path)
    con = sqlite3.connect(f"file:{path}", uri=True)  # URIs in ATTACH too: the source opens read-only
    try:
        con.execute("ATTACH DATABASE ? AS h", (f"file:{H200}?mode=ro&immutable=1",))
        levels = ",".join(map(str, LEVELS))
        con.execute(
            "CREATE TEMP TABLE keep AS SELECT t.id, t.study_id FROM h.tuner_trials t "
            "JOIN h.tuner_workloads w ON t.workload_id = w.id WHERE w.name = 'v4_flash' "
            f"AND t.concurrency IN ({levels}) AND t.kernel_id = (SELECT MAX(t2.kernel_id) FROM h.tuner_trials t2 "
            "JOIN h.tuner_workloads w2 ON t2.workload_id = w2.id WHERE w2.name = 'v4_flash' "
            f"AND t2.concurrency IN ({levels}))"
        )
        for table, where in _TABLES.items():
            con.execute(f"CREATE TABLE {table} AS SELECT * FROM h.{table} WHERE {where}")
        con.commit()
    finally:
        con.close()
    return path


RESULT_LEVELS = (1, 96)
RESULT_WORKLOADS = ("v4_flash", "v32", "v4_flash_layer")  # the three shipped spaces' workloads (not the newer formats')

_RESULT_ROWS = {  # table -> the rows kept (``keep``: the studies of RESULT_LEVELS of each workload's newest kernel)
    "tuner_studies": "id IN (SELECT id FROM keep)",
    "tuner_trials": "study_id IN (SELECT id FROM keep)",
    "tuner_samples": "trial_id IN (SELECT id FROM h.tuner_trials WHERE study_id IN (SELECT id FROM keep))",
    "tuner_statistics": "trial_id IN (SELECT id FROM h.tuner_trials WHERE study_id IN (SELECT id FROM keep))",
    "tuner_noise": "study_id IN (SELECT id FROM keep)",
    "studies": "study_id IN (SELECT study_id FROM optuna_keep)",  # Optuna's tables: those studies' rows
    "trials": "study_id IN (SELECT study_id FROM optuna_keep)",
    **{
        f"study_{x}": "study_id IN (SELECT study_id FROM optuna_keep)"
        for x in ("directions", "system_attributes", "user_attributes")
    },
    **{
        f"trial_{x}": "trial_id IN (SELECT trial_id FROM h.trials WHERE study_id IN (SELECT study_id FROM optuna_keep))"
        for x in ("heartbeats", "intermediate_values", "params", "system_attributes", "user_attributes", "values")
    },
}  # every other table is copied whole (environments, kernels, workloads, spaces, calibrations, exports, ...)


def make_results(path: Path) -> Path:
    """Write a small copy of the committed results to ``path`` and return it: ``results/h200.db``'s schema (at
    head, Optuna's tables included) with every study of :data:`RESULT_LEVELS` of each workload's newest kernel
    (V4, V3.2 and the V4 layer call: three tables to export, three report sections), a few thousand trials
    instead of 55 000. For the tests of what export and report do with paths, names and bad rows, which do not
    depend on how much was measured; whatever reads the whole committed record uses results/h200.db itself."""
    if path.exists():
        os.remove(path)
    con = sqlite3.connect(f"file:{path}", uri=True)
    try:
        con.execute("ATTACH DATABASE ? AS h", (f"file:{H200}?mode=ro&immutable=1",))
        levels = ",".join(map(str, RESULT_LEVELS))
        con.execute(
            "CREATE TEMP TABLE keep AS SELECT s.id, s.name FROM h.tuner_studies s WHERE s.concurrency IN "
            f"({levels}) AND s.kernel_id = (SELECT MAX(s2.kernel_id) FROM h.tuner_studies s2 "
            "WHERE s2.workload_id = s.workload_id) AND s.workload_id IN "
            f"(SELECT id FROM h.tuner_workloads WHERE name IN ({','.join(repr(w) for w in RESULT_WORKLOADS)}))"
        )
        con.execute(
            "CREATE TEMP TABLE optuna_keep AS SELECT study_id FROM h.studies WHERE study_name IN "
            "(SELECT DISTINCT optuna_study FROM h.tuner_trials WHERE study_id IN (SELECT id FROM keep))"
        )
        schema = con.execute(
            "SELECT type, name, sql FROM h.sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%' "
            "ORDER BY type = 'index'"  # the tables first
        ).fetchall()
        for kind, name, sql in schema:
            con.execute(sql)
            if kind == "table":
                where = _RESULT_ROWS.get(name, "1")
                con.execute(f"INSERT INTO main.{name} SELECT * FROM h.{name} WHERE {where}")
        con.commit()
    finally:
        con.close()
    return path
