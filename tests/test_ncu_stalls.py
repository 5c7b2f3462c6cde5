"""benchmarks/ncu_stalls.py: Nsight Compute's SASS source page (CSV) read per opcode, and its bad input."""

import csv
import importlib.util
import pathlib

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "ncu_stalls.py"


@pytest.fixture(scope="module")
def ncu_stalls():
    spec = importlib.util.spec_from_file_location("ncu_stalls", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _write(path, rows):
    # the layout `ncu --import R --page source --csv --print-source sass` writes: a kernel row, then the header
    header = [
        "Address",
        "Source",
        "Warp Stall Sampling (All Samples)",
        "Warp Stall Sampling (Not-issued Samples)",
        "Instructions Executed",
        "stall_barrier",
        "stall_short_sb",
        "stall_wait",
        "stall_short_sb (Not Issued)",
    ]
    with open(path, "w", newline="") as f:
        w = csv.writer(f, quoting=csv.QUOTE_ALL)
        w.writerow(["Kernel Name", "_split_kernel", ""])
        w.writerow(header)
        for r in rows:
            w.writerow(r)


def test_samples_and_reasons_add_up_per_opcode(ncu_stalls, tmp_path):
    path = tmp_path / "sass.csv"
    _write(path, [
        ["0x10", "      HMMA.16816.F32 R4, R8, R12, R4", "6", "5", "1,024", "0", "5", "1", "4"],
        ["0x20", "  @!P0 LDSM.16.M88.4 R8, [R2]", "3", "2", "512", "0", "0", "3", "0"],
        ["0x30", "      HMMA.16816.F32 R16, R8, R14, R16", "4", "4", "1,024", "0", "2", "2", "2"],
        ["0x40", "      BAR.SYNC.DEFER_BLOCKING 0x0", "1", "1", "128", "1", "0", "0", "0"],
    ])  # fmt: skip
    ops, total = ncu_stalls.read(str(path))
    assert total == 14
    assert [e["opcode"] for e in ops] == ["HMMA", "LDSM", "BAR"]
    hmma = ops[0]
    assert hmma["samples"] == 10 and hmma["executed"] == 2048
    assert hmma["reasons"]["short_sb"] == 7 and hmma["reasons"]["wait"] == 3
    assert "short_sb (Not Issued)" not in hmma["reasons"]  # the not-issued columns are a subset, not added


def test_the_printed_table(ncu_stalls, tmp_path, capsys):
    path = tmp_path / "sass.csv"
    _write(path, [["0x10", " LDG.E.128 R4, [R2.64]", "2", "2", "64", "0", "0", "2", "0"]])
    assert ncu_stalls.main([str(path), "--top", "0"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "2 warp-state samples over 1 opcodes"
    assert "LDG" in out and "100.0" in out and "wait 2" in out


@pytest.mark.parametrize("content", ["not, a, report\n1, 2, 3\n", ""])
def test_a_file_that_is_not_the_source_page_is_one_sentence(ncu_stalls, tmp_path, capsys, content):
    path = tmp_path / "other.csv"
    path.write_text(content)
    assert ncu_stalls.main([str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not Nsight Compute's SASS source page" in err


def test_a_missing_file_is_one_sentence(ncu_stalls, tmp_path, capsys):
    assert ncu_stalls.main([str(tmp_path / "missing.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot read" in err
