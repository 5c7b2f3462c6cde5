"""A kernel the tuner was not written for goes the whole way: the example row softmax (examples/row_softmax/) is
searched under the interpreter, exported, replayed from its recorded samples and reported, through its adapter alone
(tuner/adapter.py): each step's output is checked against what the one before it recorded."""

import json
import sqlite3
from pathlib import Path

from sparse_mla_tuner.db import queries
from sparse_mla_tuner.db.store import Store
from sparse_mla_tuner.tuner.space import load_space
from tests.conftest import tuner_in_process
from tests.conftest import tuner_processes

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = "examples/row_softmax/space.yaml"
KERNEL = "examples.row_softmax.adapter:RowSoftmaxAdapter"


def _samples(db: Path) -> list[tuple[float, float]]:
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT candidate_us, baseline_us FROM tuner_samples").fetchall()
    finally:
        con.close()


def test_the_example_is_searched_exported_replayed_and_reported(tmp_path):
    measured, replayed, tables = tmp_path / "m.db", tmp_path / "r.db", tmp_path / "tables"
    space = load_space(ROOT / EXAMPLE)
    configs = {str(c): c.as_dict() for c in space.configs()}

    # search: measured under the interpreter, every distinct launch of the level
    [search] = tuner_processes(
        [["search", EXAMPLE, "--backend", "interpreter", "--concurrency", "2", "--db", f"sqlite:///{measured}", "-q",
          "-f", "json"]]
    )  # fmt: skip
    assert search.returncode == 0, search.stderr[-2000:]
    [row] = json.loads(search.stdout)
    assert (row["workload"], row["C"], row["ok"], row["duplicate"]) == ("row_500", 2, 6, 2)
    best = row["best"]
    assert best in configs

    # export: the tuner's own JSON table of the adapter's export_table(), the search's pick at its level (the best,
    # or the baseline where it is tied with the best: a change must beat the noise to be deployed)
    with Store(f"sqlite:///{measured}").session() as s:
        deployed = queries.pick(queries.trials(s, concurrency=2)).config_key
    assert deployed in (best, str(space.baseline))
    export = tuner_in_process("export", "--kernel", KERNEL, "--db", f"sqlite:///{measured}", "--out", str(tables))
    assert export.returncode == 0, export.stderr
    table_path, side_path = (Path(p) for p in export.stdout.split())
    assert table_path.name == "row_500,device_name=cpu-interpreter,triton=" + table_path.name.split("triton=")[1]
    assert json.loads(table_path.read_text()) == {"2": configs[deployed]}
    side = json.loads(side_path.read_text())
    assert side["kernel"] == KERNEL and side["device"] == "cpu-interpreter"
    assert side["workload"] == {"name": "row_500", "cols": 500, "dtype": "fp16"}
    assert side["entries"]["2"]["config"] == deployed and side["entries"]["2"]["median_us"] > 0
    # the built-in kernel's formats are not this kernel's: one sentence
    wrong = tuner_in_process("export", "--kernel", KERNEL, "--format", "sglang", "--db", f"sqlite:///{measured}")
    assert wrong.returncode == 2 and wrong.stderr.strip().splitlines() == [
        "error: --format sglang: the row_softmax kernel's formats are json"
    ]

    # replay: the same level searched again from the recorded samples, on no device (the replay backend opens its
    # source immutable, so what the search left in SQLite's write-ahead log is checkpointed into the file first)
    con = sqlite3.connect(measured)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    replay = tuner_in_process(
        "search", EXAMPLE, "--backend", "replay", "--replay-db", f"sqlite:///{measured}", "--concurrency", "2",
        "--db", f"sqlite:///{replayed}", "-q", "-f", "json",
    )  # fmt: skip
    assert replay.returncode == 0, replay.stderr[-2000:]
    [again] = json.loads(replay.stdout)
    assert (again["ok"], again["duplicate"], again["stopped"]) == (6, 2, row["stopped"])
    assert again["best"] in configs
    assert set(_samples(replayed)) <= set(_samples(measured))  # every replayed round is a recorded one
    con = sqlite3.connect(replayed)
    (adapter,) = con.execute("SELECT DISTINCT adapter FROM tuner_workloads").fetchone()
    con.close()
    assert adapter == KERNEL

    # report: the A/B report of the example's kernel, its parameters and its workload as its adapter describes them
    report = tuner_in_process("report", "--kernel", KERNEL, "--db", f"sqlite:///{measured}")
    assert report.returncode == 0, report.stderr
    text = report.stdout
    assert "## row_softmax_example / row_500 on cpu-interpreter (interpreter)" in text
    assert "- Workload: `row_500`, cols `500`, dtype `fp16`." in text
    assert "| 2 | " in text and f"`{best}`" in text  # the summary row of the level names the pick
    assert "BLOCK_N = 64" in text and "num_warps = 2" in text  # its levers, one parameter from the baseline
    assert "BLOCK_T" not in text and "TARGET_CTAS" not in text  # nothing of the built-in kernel
    # the built-in kernel's report of this database: nothing of its own, said in one sentence
    none = tuner_in_process("report", "--db", f"sqlite:///{measured}")
    assert none.returncode == 2 and "--kernel NAME" in none.stderr and "\n" not in none.stderr.strip()


def test_what_only_a_kernel_with_engine_tables_has_is_refused_for_the_example_in_one_sentence():
    """The adapter's defaults of the commands only the built-in kernel has (model presets, served shapes, an engine's
    tables folder), and of export and report: the tuner's own JSON tables, the generic report sections."""
    import pytest

    from sparse_mla_tuner.tuner.adapter import load_adapter
    from sparse_mla_tuner.tuner.errors import TunerError
    from sparse_mla_tuner.tuner.export import formats
    from sparse_mla_tuner.tuner.export import json_tables
    from sparse_mla_tuner.tuner.report import ReportSections
    from sparse_mla_tuner.tuner.report import sections_of

    example = load_adapter(KERNEL)
    with pytest.raises(TunerError, match="^the row_softmax kernel has no model presets; give a SPACE_FILE$"):
        example.model_space("glm-5", 8)
    with pytest.raises(TunerError, match="^the row_softmax kernel serves no engine shapes$"):
        example.served_shapes("cpu-interpreter")
    assert example.export_dir() is None and formats(example) == {"json": json_tables}
    assert type(sections_of(example)) is ReportSections
    builtin = load_adapter("sparse_mla")
    assert list(formats(builtin)) == ["engine", "sglang", "triton"] and builtin.export_dir() is not None
    assert type(sections_of(builtin)).__name__ == "SparseMlaSections"
