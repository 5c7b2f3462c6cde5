"""Output people can read: every default table sized to the terminal ($COLUMNS) with the config key, median,
CI, effect, band, kernel and ties, and no cell ever cut (free text wraps, less important columns are left out);
piped output keeps full values; `--wide`, json and csv with every field; a missing level names the ones
there."""

import csv
import io
import json
import shutil
from pathlib import Path

import pytest

from sparse_mla_tuner.tuner.output import WIDTH
from sparse_mla_tuner.tuner.output import table
from tests.conftest import tuner_in_process as tuner  # read-only queries: no interpreter start per call

ROOT = Path(__file__).resolve().parent.parent
H200_DB = ROOT / "results" / "h200.db"


@pytest.fixture(autouse=True)
def _no_inherited_width(monkeypatch):
    """Each test sets the width it means; none inherits a $COLUMNS from the shell or an earlier test."""
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture(scope="module")
def h200(tmp_path_factory):
    """A copy of the committed H200 results (the original is never opened for writing)."""
    path = tmp_path_factory.mktemp("h200") / "h200.db"
    shutil.copy(H200_DB, path)
    return f"sqlite:///{path}"


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """The committed results' three workloads at two levels each (tests/recorded.py's make_results: every kind of
    row, reason and key the whole record has, 2 000 trials instead of 55 000), for the listings' tables: how a
    table fits the terminal does not depend on how many rows it has, and rendering 27 000 infeasible trials at
    three widths took most of this file's time."""
    from tests.recorded import make_results

    return f"sqlite:///{make_results(tmp_path_factory.mktemp('results') / 'results.db')}"


@pytest.fixture(scope="module")
def as_json(results):
    """A listing's rows (``-f json``), asked once per command line for the whole module: json carries every field
    whatever the terminal's width."""
    rows = {}

    def get(*args):
        if args not in rows:
            proc = tuner(*args, "--db", results, "-f", "json")
            assert proc.returncode == 0, proc.stderr
            rows[args] = json.loads(proc.stdout)
        return rows[args]

    return get


def _width(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


LISTINGS = [
    ["best", "--concurrency", "96"],
    ["best", "--concurrency", "1", "--space", "v32_tp8"],
    ["trials", "--concurrency", "96"],
    ["trials", "--verdict", "infeasible"],
    ["studies"],
    ["show", "OK_TRIAL"],  # an ok trial of T32-w4-s1-c512-p1 at C=96, looked up in the results
    ["compare", "T32-w4-s1-c512-p1", "T16-w4-s2-c256"],
]


@pytest.mark.parametrize("columns", [80, 100, 200])
@pytest.mark.parametrize("args", LISTINGS, ids=lambda a: "-".join(a[:2]))
def test_default_tables_fit_the_terminal_and_cut_no_cell(results, as_json, args, columns, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(columns))
    if args == ["show", "OK_TRIAL"]:  # the trial's id is the database's, so it is read, not written here
        rows = as_json("trials", "--concurrency", "96")
        ok = [r["trial"] for r in rows if r["config"] == "T32-w4-s1-c512-p1" and r["verdict"] == "ok"]
        assert ok, "the results hold no ok trial of T32-w4-s1-c512-p1 at C=96"
        args = ["show", str(ok[0])]
    proc = tuner(*args, "--db", results)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() and _width(proc.stdout) <= columns, _width(proc.stdout)
    assert "…" not in proc.stdout
    rows = as_json(*args)
    if isinstance(rows, dict):  # show: one trial
        rows = [rows]
    words = set(proc.stdout.split())
    header = proc.stdout.splitlines()[0].split()
    for r in rows:
        for key in ("config", "config_key"):  # a config key is whole wherever it is shown
            if key in r and (key in header or "value" in header):
                assert r[key] in words, r[key]
        if r.get("reason") and "reason" in header:  # a reason may wrap, but every word of it is there
            assert set(r["reason"].split()) <= words, r["reason"]


def test_piped_output_keeps_full_values(results, as_json, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    proc = tuner("trials", "--verdict", "infeasible", "--db", results)
    rows = as_json("trials", "--verdict", "infeasible")
    assert proc.returncode == 0 and "…" not in proc.stdout
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 + len(rows)  # one line per row: nothing wrapped
    assert all(r["reason"] in line for r, line in zip(rows, lines[2:], strict=True))


def test_best_names_its_config_with_median_ci_effect_band_kernel_and_ties(results):
    proc = tuner("best", "--concurrency", "96", "--db", results)
    header = proc.stdout.splitlines()[0].split()
    for column in ("config", "median_us", "CI", "effect", "band", "kernel", "ties"):
        assert column in header, header
    rows = json.loads(tuner("best", "--concurrency", "96", "--db", results, "-f", "json").stdout)
    for r in rows:  # the config key is whole in the table, and tied_with's keys are config keys
        assert r["config"] in proc.stdout
        assert all("-w" in k for k in r["tied_with"].split())


def test_wide_json_and_csv_carry_every_field(results, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    wide = tuner("best", "--concurrency", "96", "--db", results, "--wide")
    assert wide.returncode == 0 and _width(wide.stdout) > WIDTH
    rows = json.loads(tuner("best", "--concurrency", "96", "--db", results, "-f", "json").stdout)
    fields = set(rows[0])
    assert {"config", "BLOCK_T", "ci_low_us", "ratio_ci_high", "noise_band", "tied_with", "GBps", "date"} <= fields
    header = wide.stdout.splitlines()[0].split()
    assert fields <= set(header)
    text = tuner("best", "--concurrency", "96", "--db", results, "-f", "csv").stdout
    (first, *_) = list(csv.DictReader(io.StringIO(text)))
    assert set(first) == fields


def test_a_missing_level_names_the_levels_there_and_the_nearest(h200):
    proc = tuner("best", "--concurrency", "3", "--db", h200)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = proc.stderr.strip()
    assert "concurrency 3" in line and "1, 2, 4, 8, 16" in line and "(nearest: 2)" in line
    proc = tuner("best", "--concurrency", "90", "--db", h200, "--space", "v32_tp8")
    assert "(nearest: 88)" in proc.stderr and "--space 'v32_tp8'" in proc.stderr


def test_a_table_gives_way_in_its_text_columns_never_in_a_config_key():
    rows = [
        {"space": "s" * 30, "config": "T32-w4-s1-c256-p3-b1", "median_us": 33.895, "reason": "shared 102 528 B " * 6},
        {"space": "t", "config": "T16-w4-s2-c256", "median_us": 1.0, "reason": ""},
    ]
    text = table(rows)
    assert _width(text) <= WIDTH
    assert "T32-w4-s1-c256-p3-b1" in text and "33.895" in text and "…" not in text
    assert text.count("102 528 B") == 6 and "s" * 30 in text  # wrapped at spaces, a number never split
    narrow = [{"config": "T32-w4-s1-c256-p3-b1", "x": 1}]
    assert table(narrow) == table(narrow, width=1000)  # nothing changed when it fits


def test_a_column_that_cannot_wrap_is_left_out_and_said(monkeypatch):
    from sparse_mla_tuner.tuner.output import fit

    rows = [{"config": "T32-w4-s1-c256-p3-b1", "median_us": 33.895, "band": "±1.0 %", "workload": "w" * 40}]
    text, left_out = fit(rows, 60)
    assert _width(text) <= 60 and left_out == ["workload"] and "±1.0 %" in text
    assert fit(rows, None) == (fit(rows, 1000)[0], [])  # piped: as wide as the values


def test_the_search_summary_cuts_no_interval(monkeypatch):
    from sparse_mla_tuner.tuner.cli import _search_brief
    from sparse_mla_tuner.tuner.output import render

    row = {
        "workload": "v4_flash_layer",
        "C": 96,
        "best": "T32-w4-s1-c256-p3-b1",
        "median_us": "48.69",
        "ratio vs baseline (95% CI)": "0.859 [0.851, 0.866]",
        "effect": "win",
        "noise band": "±1.0 %",
        "ok": 90,
        "infeasible": 24,
        "duplicate": 260,
        "crashed": 3,
    }
    for columns in (80, 100, 200):
        monkeypatch.setenv("COLUMNS", str(columns))
        text = render([row], "table", _search_brief)
        assert _width(text) <= columns and "…" not in text
        assert "0.859 [0.851, 0.866]" in text and "T32-w4-s1-c256-p3-b1" in text
        assert "260 duplicate" in text.replace("\n", " ") or "260 duplicate" not in str(row)


def test_units_have_one_format():
    from sparse_mla_tuner.tuner.output import gbps
    from sparse_mla_tuner.tuner.output import pct
    from sparse_mla_tuner.tuner.output import us

    assert us(75.724) == "75.7 µs" and us(75.724, 2) == "75.72 µs" and us(None) == "-"
    assert pct(0.05897) == "±5.9 %" and pct(0.05897, 2, sign=False) == "5.90 %"
    assert gbps(4120.4) == "4120 GB/s"


def test_stored_strings_cannot_break_a_table_or_drive_the_terminal(tmp_path):
    """A results database may come from someone else: a device name with a newline or a terminal escape
    stays one cell of one row, shown as escapes, in the brief and the wide table alike."""
    import sqlite3

    from tests.recorded import make_results

    path = make_results(tmp_path / "hostile.db")  # the committed results' three workloads, two levels each
    con = sqlite3.connect(path)
    con.execute("UPDATE tuner_environments SET gpu_name = ?", ("GPU\n\x1b[2J\x1b[31mred\x07",))
    con.commit()
    con.close()
    studies = json.loads(tuner("studies", "--db", f"sqlite:///{path}", "-f", "json").stdout)
    for extra in ([], ["--wide"]):
        proc = tuner("studies", "--db", f"sqlite:///{path}", *extra)
        assert proc.returncode == 0, proc.stderr
        assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout
        lines = proc.stdout.splitlines()
        assert len(lines) == 2 + len(studies)
        if "device" in lines[0].split():  # the brief view shows the device only where it varies
            assert all("GPU\\n\\x1b[2J" in ln for ln in lines[2:])
        else:
            assert not extra and all("GPU" not in ln for ln in lines)


def test_best_and_trials_agree_on_the_kernel_and_show_it(h200):
    """A level measured by many kernels: `best` ranks each level's newest kernel, and `trials` lists the same
    kernel's trials by default (the fastest of every kernel's is not the best of the current one); both show the
    kernel, and --kernel picks another, in both."""

    def rows(*args):
        proc = tuner(*args, "--db", h200, "-f", "json")
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    level = ("--concurrency", "96", "--space", "v4_flash_tp4")
    (best,) = rows("best", *level)
    listed = rows("trials", *level, "--verdict", "ok", "--sort", "median_us")
    assert {r["kernel"] for r in listed} == {best["kernel"]}
    assert any(r["config"] == best["config"] and r["median_us"] == best["median_us"] for r in listed)
    every = rows("trials", *level, "--verdict", "ok", "--kernel", "all")
    kernels = {r["kernel"] for r in every}
    assert len(kernels) > 1 and len(every) > len(listed)
    old = sorted(kernels - {best["kernel"]})[0]
    (older,) = rows("best", *level, "--kernel", old[:8])
    assert older["kernel"] == old
    assert {r["kernel"] for r in rows("trials", *level, "--kernel", old)} == {old}
    proc = tuner("best", *level, "--kernel", "zzz", "--db", h200)
    assert proc.returncode == 2 and "--kernel: no kernel" in proc.stderr and len(proc.stderr.splitlines()) == 1
    table = tuner("trials", *level, "--verdict", "ok", "--kernel", "all", "--db", h200).stdout
    assert "kernel" in table.splitlines()[0].split()  # several kernels: the brief table shows the column
