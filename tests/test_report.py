"""`tuner report` tells the truth: the committed report is what the committed database gives, the
verdict definition is the statistics code's, whole-call workloads count their whole call, levers are
judged from the data, and stored strings stay data in Markdown, file names and plot labels."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import tuner_in_process

ROOT = Path(__file__).resolve().parent.parent
H200_DB = ROOT / "results" / "h200.db"
REPORT = ROOT / "docs" / "h200_report.md"
PLOTS = ROOT / "docs" / "plots"
BENCHES = ("results/bench_single_h200.json", "results/bench_call_h200.json")  # same-run FlashMLA


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory):
    """`tuner report` run as docs/benchmarks.md says, on a copy of the committed database (never the
    original), from a folder laid out like the repository so the text names the same paths."""
    d = tmp_path_factory.mktemp("regen")
    (d / "results").mkdir()
    shutil.copy(H200_DB, d / "results" / "h200.db")
    args = ["report", "--db", "sqlite:///results/h200.db", "-o", "docs/h200_report.md"]
    args += [a for f in BENCHES for a in ("--bench", str(ROOT / f))]
    (d / "docs").mkdir()
    cwd = os.getcwd()
    os.chdir(d)  # through the executable's entry point in this process (it reads and writes files only)
    try:
        proc = tuner_in_process(*args)
    finally:
        os.chdir(cwd)
    assert proc.returncode == 0, proc.stderr
    return d


def test_the_committed_report_is_what_the_committed_database_gives(regenerated):
    """Regenerate with `tuner report --db sqlite:///results/h200.db -o docs/h200_report.md
    --bench results/bench_single_h200.json --bench results/bench_call_h200.json`
    after the database changes (add `--plots docs/plots` for the plots, which are not committed)."""
    new = (regenerated / "docs" / "h200_report.md").read_text()
    assert new == REPORT.read_text(), "docs/h200_report.md is stale: regenerate it from results/h200.db"


def test_the_committed_report_links_no_plots_and_none_are_committed():
    """Plots are made by `tuner report --plots` where they are wanted (tests/test_report_plots.py draws them
    from this database), not committed: every version of a PNG would stay in every clone."""
    assert "](plots/" not in REPORT.read_text()
    assert not _tracked(PLOTS)
    assert "/docs/plots/" in (ROOT / ".gitignore").read_text().splitlines()


def _tracked(path: Path) -> bool:
    """Whether git tracks anything under ``path`` (False outside a git checkout)."""
    try:
        out = subprocess.run(["git", "ls-files", "--", str(path)], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return False
    return out.returncode == 0 and bool(out.stdout.strip())


def test_the_verdict_definition_is_the_statistics_code(regenerated):
    text = (regenerated / "docs" / "h200_report.md").read_text()
    assert "whole 95 % CI" not in text
    assert "one-sided paired t-test" in text and "Benjamini–Hochberg" in text
    assert "log(1 − noise band)" in text and "log(1 + band)" in text


def test_a_whole_call_workload_is_read_back_whole(regenerated):
    """The V4 layer call attends a second cache in the same softmax: its bytes count in % copy BW."""
    import sqlite3

    from sparse_mla_tuner.db.models import WorkloadModel
    from sparse_mla_tuner.kernels.workload import Workload
    from sparse_mla_tuner.tuner.adapters.sparse_mla.records import workload_of

    con = sqlite3.connect(regenerated / "results" / "h200.db")
    row = con.execute(
        "SELECT name, kv_format, heads, topk, page_size, context, call FROM tuner_workloads WHERE call IS NOT NULL"
    ).fetchone()
    con.close()
    name, kv_format, heads, topk, page_size, context, call = row
    w = workload_of(
        WorkloadModel(
            name=name, kv_format=kv_format, heads=heads, topk=topk, page_size=page_size, context=context, call=call
        )
    )
    plain = Workload(kv_format, heads, topk, page_size, context)
    assert w.extra is not None and w.call() is not None and w.min_bytes(96) > plain.min_bytes(96)
    text = (regenerated / "docs" / "h200_report.md").read_text()
    section = text.split(f"/ {name} on ")[1].split("\n## ")[0]
    assert "the whole call: an extra `fp8_model1` cache" in section
    # % copy BW of the best at C=96 is the whole call's bytes over its median, of the copy bandwidth
    line = next(ln for ln in section.splitlines() if ln.startswith("| 96 |"))
    cells = [c.strip() for c in line.split("|")]
    median_us, share = float(cells[4]), float(cells[5].rstrip(" %"))
    copy_gbps = float(section.split("copy bandwidth ")[1].split(" GB/s")[0])
    want = 100 * w.min_bytes(96) / (median_us * 1e-6) / (copy_gbps * 1e9)
    assert share == pytest.approx(want, abs=0.2)  # rounding of the printed median and bandwidth


def test_the_lever_heatmap_rows_are_levers_or_named_stand_ins(regenerated):
    text = (regenerated / "docs" / "h200_report.md").read_text()
    for section in text.split("\n## ")[1:]:
        unmeasured = section.split("### Not measured at any level")[1] if "### Not measured at any" in section else ""
        # a lever row that says only "not measured" at every level is a lever nothing stands in for,
        # and the report lists it as such; any other lever never tried alone shows only its stand-in
        for line in section.splitlines():
            if line.startswith("| ") and " = " in line.split("|")[1]:
                cells = [c.strip() for c in line.split("|")[2:-1]]
                if all(c == "not measured" for c in cells):
                    lever = line.split("|")[1].strip()
                    assert " via " not in lever and f"**{lever}**" in unmeasured, line[:120]


# --- stored strings are data ------------------------------------------------------------------------


HOSTILE = "GPU\n## injected\n| x | y |\n![img](http://evil/x.png) `code` $x^2$ <script> ../../etc/passwd\x00"


def test_markdown_file_names_and_plot_labels_quote_stored_strings():
    from sparse_mla_tuner.tuner.report import file_stem
    from sparse_mla_tuner.tuner.report import md
    from sparse_mla_tuner.tuner.report import md_code
    from sparse_mla_tuner.tuner.report import plot_text

    text = md(HOSTILE)
    assert "\n" not in text and "\x00" not in text
    assert "\\|" in text and "\\[img\\]" in text and "\\`code\\`" in text and "\\$" in text and "\\<script>" in text
    code = md_code("a`b\nc|d")
    assert code.count("`") == 2 and "\n" not in code
    stem = file_stem("space", HOSTILE, "cuda")
    assert "/" not in stem and "\x00" not in stem and not stem.startswith(".") and len(stem) <= 150
    label = plot_text(HOSTILE)
    assert "\n" not in label and "\\$" in label


def test_a_report_from_a_database_with_hostile_names_keeps_them_as_text(tmp_path):
    """A results database may come from someone else: a device name with a newline, Markdown, a NUL and
    a path in it neither breaks the report's structure nor writes a plot outside the plots folder."""
    import sqlite3

    from sparse_mla_tuner.db.store import Store
    from sparse_mla_tuner.tuner.report import render_report
    from tests.recorded import make_results

    src = make_results(tmp_path / "h.db")  # the three workloads of the committed results, two levels each
    con = sqlite3.connect(src)
    con.execute("UPDATE tuner_environments SET gpu_name = ?, host = ?", (HOSTILE, "h`o|st\nx"))
    con.commit()
    con.close()
    plots = tmp_path / "plots"
    text = render_report(Store(f"sqlite:///{src}", readonly=True), plots, "plots/")
    lines = text.splitlines()
    assert not any(ln.startswith(("## injected", "| x | y |")) for ln in lines)
    assert sum(ln.startswith("## ") for ln in lines) == 3  # one section per study group, as before
    assert "![img](http://evil" not in text and "<script>" not in text.replace("\\<", "")
    assert all(p.parent == plots for p in plots.rglob("*")) and list(plots.glob("*.png"))
    assert not (tmp_path / "etc").exists()


def test_plots_without_matplotlib_are_one_sentence(tmp_path, monkeypatch):
    """matplotlib is the `report` extra: without it `report --plots` says what to install, and a report
    without plots still works."""
    from click.testing import CliRunner

    from sparse_mla_tuner.db.store import Store
    from sparse_mla_tuner.tuner.cli import cli
    from tests.recorded import make_results

    url = f"sqlite:///{make_results(tmp_path / 'h.db')}"  # the committed results' three workloads, two levels each
    Store(url, readonly=True)
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    result = CliRunner().invoke(cli, ["report", "--db", url, "--plots", str(tmp_path / "plots")])
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0 and "pip install 'sparse-mla-tuner[report]'" in result.stderr
    assert not (tmp_path / "plots").exists()
    result = CliRunner().invoke(cli, ["report", "--db", url])
    assert result.exit_code == 0 and "# A/B report" in result.stdout
