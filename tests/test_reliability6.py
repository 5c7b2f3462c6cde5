"""Reliability, round six: the cases of round five (tests/test_reliability5.py) once more, each in a neighbouring form.
A relative or empty `$PYTHONPATH` entry names the working folder, which the command itself never imports from either;
a numeric variable holds only ASCII digits; a space's `kernel:` never names a `__main__` module (a program, whose
import runs it); `python -m sparse_mla_tuner` guards Ctrl-C as the console script does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.conftest import tuner_in_process as tuner
from tests.test_reliability5 import SMOKE
from tests.test_reliability5 import _after_mapped
from tests.test_reliability5 import _copy
from tests.test_reliability5 import _ctrl_c
from tests.test_reliability5 import _interrupted_cleanly
from tests.test_reliability5 import _one_sentence
from tests.test_reliability5 import _space_with_kernel
from tests.test_reliability5 import fresh_db  # noqa: F401 - a fixture
from tests.test_reliability5 import results_db  # noqa: F401 - a fixture

PLANTED = ("json", "yaml", "sqlalchemy", "numpy")


def _plant(folder: Path) -> None:
    """Modules that leave ``RAN_<name>`` in ``folder`` when imported, and a package ``optuna/`` that does too."""
    for name in PLANTED:
        (folder / f"{name}.py").write_text(f"open({str(folder / ('RAN_' + name))!r}, 'w')\n")
    (folder / "optuna").mkdir()
    (folder / "optuna" / "__init__.py").write_text(f"open({str(folder / 'RAN_optuna')!r}, 'w')\n")


@pytest.mark.parametrize("pythonpath", [".", f"{os.pathsep}/no-such-dir", "lib"], ids=["dot", "empty", "relative"])
def test_a_relative_pythonpath_entry_is_not_imported_by_the_command(tmp_path, pythonpath):
    """`PYTHONPATH=.`, an empty entry (what `export PYTHONPATH=$PYTHONPATH:/x` leaves) or `lib`: the console script
    imports none of the planted modules, as the processes it starts do not (tests/test_isolation.py)."""
    work = tmp_path / "work"
    (work / "lib").mkdir(parents=True)
    _plant(work)
    _plant(work / "lib")
    exe = Path(sys.executable).parent / "tuner"
    env = {**os.environ, "PYTHONPATH": pythonpath}
    env.pop("PYTHONSAFEPATH", None)
    db = f"sqlite:///{tmp_path / 'c.db'}"
    proc = subprocess.run(
        [str(exe), "check", SMOKE, "-f", "json", "--db", db], cwd=work, capture_output=True, text=True, env=env,
        timeout=300,
    )  # fmt: skip  # the limit only guards against a hang
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(p.name for p in work.rglob("RAN_*")) == []


def test_a_relative_pythonpath_entry_is_not_imported_by_a_search_or_its_helpers(tmp_path):
    """A search under `PYTHONPATH=.` starts the surrogate's worker and multiprocessing's resource tracker (`python -c`
    with the environment inherited): none imports the planted `pickle.py` or `select.py` (they used to, with a
    traceback each)."""
    from tests.conftest import cheap_smoke

    work = tmp_path / "work"
    work.mkdir()
    space = cheap_smoke(work)
    _plant(work)
    for name in ("pickle", "select"):
        (work / f"{name}.py").write_text(f"open({str(work / ('RAN_' + name))!r}, 'w')\n")
    exe = Path(sys.executable).parent / "tuner"
    env = {**os.environ, "PYTHONPATH": "."}
    env.pop("PYTHONSAFEPATH", None)
    args = [str(exe), "search", space, "-q", "--concurrency", "4", "--db", f"sqlite:///{tmp_path / 's.db'}"]
    proc = subprocess.run(args, cwd=work, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert sorted(p.name for p in work.glob("RAN_*")) == []


def test_only_the_relative_pythonpath_entries_leave_sys_path(tmp_path, monkeypatch):
    from sparse_mla_tuner.tuner import drop_relative_pythonpath

    stdlib = os.path.dirname(os.__file__)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([".", "lib", "/abs", ""]))
    monkeypatch.setattr(sys, "flags", type("F", (), {"safe_path": False})())
    path = ["/script", str(tmp_path), str(tmp_path / "lib"), "/abs", "", stdlib, str(tmp_path), "/site"]
    monkeypatch.setattr(sys, "path", list(path))
    drop_relative_pythonpath()
    assert sys.path == ["/script", "/abs", stdlib, str(tmp_path), "/site"]  # after the standard library: not its
    assert os.environ["PYTHONPATH"] == "/abs"  # what the processes it starts inherit
    monkeypatch.setenv("PYTHONPATH", "")
    monkeypatch.setattr(sys, "path", list(path))
    drop_relative_pythonpath()
    assert sys.path == path
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([".", str(tmp_path)]))  # also named by its absolute path
    monkeypatch.setattr(sys, "path", ["/script", str(tmp_path), stdlib])
    drop_relative_pythonpath()
    assert sys.path == ["/script", str(tmp_path), stdlib] and os.environ["PYTHONPATH"] == str(tmp_path)


NON_ASCII_DIGITS = [("TUNER_COMPILE_JOBS", "²"), ("TUNER_COMPILE_JOBS", "٣"), ("COLUMNS", "²"), ("COLUMNS", "١٢٠")]


@pytest.mark.parametrize("name, value", NON_ASCII_DIGITS, ids=[f"{n}={v}" for n, v in NON_ASCII_DIGITS])
def test_a_number_in_other_digits_is_one_sentence_naming_the_variable(tmp_path, results_db, monkeypatch, name, value):  # noqa: F811
    """`str.isdigit` passes a superscript two (which `int` refuses: a traceback) and Arabic-Indic digits."""
    monkeypatch.setenv(name, value)
    _one_sentence(tuner("studies", "--db", f"sqlite:///{results_db}"), f"${name}")
    _one_sentence(tuner("check", SMOKE, "--db", f"sqlite:///{tmp_path / 'c.db'}"), f"${name}")


def test_the_table_width_reads_only_ascii_digits(monkeypatch):
    from sparse_mla_tuner.tuner.output import terminal_width

    monkeypatch.setenv("COLUMNS", "²")
    assert terminal_width() is None or terminal_width() > 0  # the terminal's, or none: not a ValueError
    monkeypatch.setenv("COLUMNS", "120")
    assert terminal_width() == 120


def test_an_owner_tag_with_other_digits_is_another_machines():
    from sparse_mla_tuner.tuner.heartbeat import _machine
    from sparse_mla_tuner.tuner.heartbeat import owner_alive

    assert owner_alive(f"{_machine()}|²|1") is None


@pytest.mark.parametrize("kernel", ["sparse_mla_tuner.tuner.__main__:X", "sparse_mla_tuner.__main__:Adapter"])
def test_a_main_module_is_never_imported_as_an_adapter(tmp_path, kernel, monkeypatch):
    """This package's own modules may be named, but not its programs: importing one runs the command line again."""
    module = kernel.split(":")[0]
    monkeypatch.delitem(sys.modules, module, raising=False)
    space = _space_with_kernel(tmp_path, kernel)
    _one_sentence(tuner("check", str(space), "--db", f"sqlite:///{tmp_path / 'c.db'}"), "is a program")
    assert module not in sys.modules


@pytest.mark.parametrize("main", ["sparse_mla_tuner.__main__", "sparse_mla_tuner.tuner.__main__", "elsewhere"])
def test_python_m_sparse_mla_tuner_is_the_executable(monkeypatch, main):
    """`python -m sparse_mla_tuner` (results/h200.sh's form) is the executable as the console script is: it guards
    Ctrl-C from its first import (it used to print the KeyboardInterrupt's traceback in its first tenth of a second)
    and keeps a relative `$PYTHONPATH` off `sys.path`."""
    from importlib.machinery import ModuleSpec
    from types import ModuleType

    from sparse_mla_tuner.tuner import is_executable

    module = ModuleType("__main__")
    module.__spec__ = ModuleSpec(main, None)
    monkeypatch.setitem(sys.modules, "__main__", module)
    assert is_executable() == (main != "elsewhere")


def test_ctrl_c_while_python_m_runs_is_130_and_one_line(tmp_path):
    args = ["check", SMOKE, "-q", "--db", f"sqlite:///{tmp_path / 'c.db'}"]
    env = {"PYTHONPATH": str(ROOT)}  # a checkout without an install finds the package so too
    command = [sys.executable, "-m", "sparse_mla_tuner"]
    rc, _, err, alive = _ctrl_c(args, tmp_path, _after_mapped("sqlalchemy"), env=env, command=command)
    assert alive
    _interrupted_cleanly(rc, err, alive)


def test_a_space_on_a_closed_standard_input_is_one_sentence(tmp_path):
    """`tuner check - <&-`: descriptor 0 may since be another file's (the tool's signal pipe, a database), so it is
    not read; the message says the standard input is closed (it said "Resource temporarily unavailable")."""
    code = "import sys; from sparse_mla_tuner.tuner.cli import main; sys.argv[0] = 'tuner'; main()"
    proc = subprocess.run(
        [sys.executable, "-c", code, "check", "-", "--db", f"sqlite:///{tmp_path / 'c.db'}"],
        capture_output=True, text=True, timeout=300, preexec_fn=lambda: os.close(0),
    )  # fmt: skip
    _one_sentence(proc, "the standard input is closed")


@pytest.mark.parametrize("xdg", ["", "relative/data", "."])
def test_a_relative_xdg_data_home_is_ignored(monkeypatch, xdg):
    """The XDG rules ignore a relative `$XDG_DATA_HOME`: it would name a folder of each process's own working folder
    (the engine's, the export's), so one export would write where no engine reads."""
    from sparse_mla_tuner.kernels.table import tables_dir

    monkeypatch.delenv("SPARSE_MLA_CONFIG_DIR", raising=False)
    monkeypatch.setenv("HOME", "/home/someone")
    monkeypatch.setenv("XDG_DATA_HOME", xdg)
    assert tables_dir() == Path("/home/someone/.local/share/sparse_mla_tuner/configs")
    monkeypatch.setenv("XDG_DATA_HOME", "/data")
    assert tables_dir() == Path("/data/sparse_mla_tuner/configs")


def test_an_output_named_dash_is_the_standard_output(tmp_path, results_db, monkeypatch):  # noqa: F811
    """`-o -` and `--out -` (triton) write to stdout, as a space's `-` is read from stdin; the tables' folder cannot
    be the standard output: one sentence. Never a file or folder named "-" (both used to make one)."""
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{results_db}"
    report = tuner("report", "-o", "-", "--db", url)
    assert report.returncode == 0 and report.stdout.startswith("# "), report.stderr
    module = tuner("export", "--format", "triton", "--out", "-", "--db", url)
    assert module.returncode == 0 and "triton.Config" in module.stdout, module.stderr
    _one_sentence(tuner("export", "--out", "-", "--db", url), "--out -: the tables are files in a folder")
    _one_sentence(tuner("export", "--engine", "vllm", "--out", "-", "--db", url), "--out -")
    assert not (tmp_path / "-").exists()


def test_a_dry_run_names_the_database_not_its_passing_copy(tmp_path, fresh_db):  # noqa: F811
    """A dry run compacts a copy in a temporary folder; a damage found there is said of the user's file (it named
    the copy, gone by the time the message is read)."""
    db = _copy(fresh_db, tmp_path, "DROP TABLE tuner_trials;")
    proc = tuner("db", "compact", "--dry-run", "--db", f"sqlite:///{db}")
    _one_sentence(proc, f"sqlite:///{db}: no such table: tuner_trials")
    assert "tuner-compact" not in proc.stderr


def _huge_names(source: Path, folder: Path) -> Path:
    """A copy of ``source`` whose workloads, studies and device have names of a megabyte."""
    import shutil
    import sqlite3

    db = folder / "names.db"
    shutil.copy(source, db)
    con = sqlite3.connect(db)
    huge = "n" * 1_000_000
    con.execute("UPDATE tuner_workloads SET name = ?", (huge,))
    con.execute("UPDATE tuner_studies SET name = ? || id", (huge,))
    con.execute("UPDATE tuner_environments SET gpu_name = ?", (huge,))
    con.commit()
    con.close()
    return db


def test_a_huge_stored_name_makes_plots_of_a_bounded_title(tmp_path, results_db):  # noqa: F811
    """A plot's title names its workload and device: a megabyte of them made a figure too wide for matplotlib to draw
    (a ValueError's traceback); the title is cut."""
    db = _huge_names(results_db, tmp_path)
    plots = tmp_path / "plots"
    proc = tuner("report", "--plots", str(plots), "--output", str(tmp_path / "r.md"), "--db", f"sqlite:///{db}")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert list(plots.glob("*.png"))


@pytest.mark.parametrize(
    "cmd",
    [["best", "--concurrency", "1"], ["best", "--concurrency", "1", "--wide"], ["studies"], ["studies", "--wide"]],
    ids=" ".join,
)
def test_a_huge_stored_name_is_bounded(tmp_path, results_db, cmd, monkeypatch):  # noqa: F811
    """A space gives names of at most 64 characters, so a megabyte name is a hand-made database's: a table shows it
    cut, its length said, as it shows a stored reason (it printed each whole, megabytes for `best`)."""
    monkeypatch.delenv("COLUMNS", raising=False)
    db = _huge_names(results_db, tmp_path)
    plain = tuner(*cmd, "--db", f"sqlite:///{results_db}")
    proc = tuner(*cmd, "--db", f"sqlite:///{db}")
    assert proc.returncode == 0 and plain.returncode == 0, proc.stderr
    assert len(proc.stdout) - len(plain.stdout) < 100_000 and "characters;" in proc.stdout, len(proc.stdout)


def test_a_database_under_a_file_says_the_file_is_no_directory(tmp_path):
    """`--db sqlite:///a-file/x.db`: the parent is there, a file (it was said not to exist)."""
    (tmp_path / "a-file").write_text("")
    proc = tuner("check", SMOKE, "--db", f"sqlite:///{tmp_path / 'a-file' / 'x.db'}")
    _one_sentence(proc, "a-file is not a directory")
    _one_sentence(tuner("check", SMOKE, "--db", f"sqlite:///{tmp_path / 'none' / 'x.db'}"), "none does not exist")


def test_a_ctrl_c_python_cannot_raise_is_delivered_again_outside_the_hook(tmp_path):
    """A KeyboardInterrupt raised in a ``__del__`` (unraisable) reaches the executable's code as a Ctrl-C, and nothing
    is printed as "Exception ignored": delivered again from the hook itself, it landed in the hook and was lost."""
    script = tmp_path / "tuner"  # the executable's name: the package installs its hooks
    script.write_text(
        "import time\n"
        "import sparse_mla_tuner.tuner as t\n"
        "t.release_import_guard()\n"
        "class Bomb:\n"
        "    def __del__(self):\n"
        "        raise KeyboardInterrupt\n"
        "try:\n"
        "    Bomb()\n"
        "    time.sleep(5)\n"
        "    print('not delivered')\n"
        "except KeyboardInterrupt:\n"
        "    print('delivered')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env)
    assert proc.stdout.strip() == "delivered", proc.stdout + proc.stderr
    assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
