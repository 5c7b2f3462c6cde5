"""`tuner db upgrade` labels the Optuna studies that older searches left bare: afterwards every study of the
tuner carries its metric name and the attributes a search writes, taken from the tuner's own rows."""

import shutil
import sqlite3
from pathlib import Path

import optuna

from tests.conftest import tuner_in_process as tuner

ROOT = Path(__file__).resolve().parent.parent


def _bare(path: Path, n: int) -> list[str]:
    """Strip the metric name and user attributes of ``n`` studies, as an older search left them."""
    con = sqlite3.connect(path)
    rows = con.execute("SELECT study_id, study_name FROM studies ORDER BY study_id LIMIT ?", (n,)).fetchall()
    ids = [r[0] for r in rows]
    marks = ",".join("?" * len(ids))
    con.execute(f"DELETE FROM study_system_attributes WHERE study_id IN ({marks})", ids)
    con.execute(f"DELETE FROM study_user_attributes WHERE study_id IN ({marks})", ids)
    con.commit()
    con.close()
    return [r[1] for r in rows]


def test_upgrade_labels_every_bare_study_once(tmp_path):
    path = tmp_path / "h200.db"
    shutil.copy(ROOT / "results" / "h200.db", path)
    names = _bare(path, 3)
    con = sqlite3.connect(path)
    (bare,) = con.execute(
        "SELECT count(*) FROM studies WHERE study_id NOT IN "
        "(SELECT study_id FROM study_system_attributes WHERE key = 'study:metric_names')"
    ).fetchone()
    con.close()
    assert bare >= 3
    url = f"sqlite:///{path}"
    proc = tuner("db", "upgrade", "--db", url)
    assert proc.returncode == 0, proc.stderr
    assert f"labelled {bare} Optuna studies" in proc.stderr
    storage = optuna.storages.RDBStorage(url)
    try:
        studies = {s.study_name: s for s in storage.get_all_studies()}
        for name in studies:
            study = optuna.load_study(study_name=name, storage=storage)
            assert study.metric_names == ["median_us"], name
        con = sqlite3.connect(path)
        for name in names:
            space, workload, level = name.split("/")[:3]
            attrs = optuna.load_study(study_name=name, storage=storage).user_attrs
            assert attrs["space"] == space and attrs["workload"] == workload and f"C{attrs['concurrency']}" == level
            assert attrs["kernel_hash"] in name and attrs["backend"] in name and "labelled" in attrs
            (n,) = con.execute(
                "SELECT count(*) FROM tuner_trials t JOIN tuner_studies s ON s.id = t.study_id "
                "WHERE s.name = ? AND t.is_baseline AND t.config_key = ?",
                (name, attrs["baseline"]),
            ).fetchone()
            assert n >= 1  # the baseline named is the study's own
        con.close()
    finally:
        storage.remove_session()
        storage.engine.dispose()
    again = tuner("db", "upgrade", "--db", url)
    assert again.returncode == 0 and "labelled" not in again.stderr  # nothing left to label
