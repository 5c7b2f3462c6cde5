"""results/ as a ledger, not a diary: one appended row per benchmark run (results/ledger.jsonl), the README's
headline generated from it, and no file named for a commit or for before and after."""

import importlib.util
import json
import re
import subprocess
import sys

from tests.conftest import ROOT

spec = importlib.util.spec_from_file_location("ledger", ROOT / "results" / "ledger.py")
ledger = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ledger)


def test_the_readmes_headline_is_the_ledgers():
    """Regenerate with `python results/ledger.py headline --write` after `python results/ledger.py add FILE`."""
    assert ledger.readme_headline((ROOT / "README.md").read_text()) == ledger.headline()


def test_the_headline_figures_are_the_raw_files():
    """The newest bench rows' figures are what their raw files say now (a file replaced without its row fails)."""
    for kind in ("bench_single", "bench_call"):
        row = ledger.newest(kind)
        again, figures, _ = ledger.figures(ROOT / row["file"])
        assert again == kind and figures == row["figures"], row["file"]
    v4 = ledger.newest("bench_single")["figures"]["fp8_model1 C=96"]
    raw = json.loads((ROOT / "results" / "bench_single_h200.json").read_text())["rows"]
    (c96,) = [r for r in raw if r["format"] == "fp8_model1" and r["C"] == 96 and r["config"] == "table"]
    assert f"{v4['us']:.1f} / {v4['flashmla_us']:.1f}" == f"{c96['us']:.1f} / {c96['flashmla_us']:.1f}"
    assert f"{c96['us']:.1f} / {c96['flashmla_us']:.1f}" in (ROOT / "README.md").read_text()


def test_every_row_says_when_where_what_and_how():
    rows = ledger.read()
    assert len(rows) >= 10
    for row in rows:
        assert {"date", "device", "commit", "kernel", "command", "file", "kind", "figures"} <= set(row), row
        assert all(row[k] for k in ("date", "device", "commit", "kernel", "command", "figures")), row


def test_every_raw_json_under_results_has_its_row():
    files = {r["file"] for r in ledger.read()}
    raw = {str(p.relative_to(ROOT)) for p in (ROOT / "results").rglob("*.json")} - {"results/out"}
    raw = {p for p in raw if not p.startswith("results/out/")}
    assert raw <= files, sorted(raw - files)


def test_no_result_is_named_for_a_commit_or_before_and_after():
    tracked = subprocess.run(["git", "ls-files", "results"], capture_output=True, text=True, cwd=ROOT).stdout.split()
    bad = [
        p
        for p in tracked
        if re.search(r"(^|[_./-])([0-9a-f]{7,40})([_./-]|$)", p)
        or re.search(r"(before|after|_old|_new|_base)\b|(before|after|old|new)[0-9]*[_.]", p)
    ]
    assert tracked and not bad, bad


def test_a_file_it_cannot_read_is_one_sentence(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"rows": [{"what": 1}]}')
    proc = subprocess.run(
        [sys.executable, str(ROOT / "results" / "ledger.py"), "add", str(bad)], capture_output=True, text=True
    )
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and len(proc.stderr.splitlines()) == 1
