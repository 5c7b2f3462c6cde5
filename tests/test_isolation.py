"""No code from the working folder runs: the tool's children start isolated from the caller's ``sys.path``.

A ``json.py``, ``yaml.py`` and ``torch.py`` planted where ``tuner`` runs (an unpacked results bundle, say) must never
be imported, by the command itself or by any process it starts (the compile process, the measurement process, the
surrogate's optimization worker)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT
from conftest import cheap_smoke

PLANTED = ("json", "yaml", "torch")


def _plant(folder: Path) -> None:
    for name in PLANTED:
        (folder / f"{name}.py").write_text(f"open({str(folder / ('RAN_' + name))!r}, 'w').write('ran')\n")


def _ran(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("RAN_*"))


def _tuner(folder: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "tuner"  # the console script, as a user runs it
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    return subprocess.run(
        [str(exe), *args], cwd=folder, capture_output=True, text=True, env=env, timeout=timeout
    )  # fmt: skip  # the limit only guards against a hang


def test_child_env_keeps_the_working_folder_off_sys_path(tmp_path):
    from sparse_mla_tuner import child_argv
    from sparse_mla_tuner import child_env

    _plant(tmp_path)
    env = child_env({**os.environ, "PYTHONPATH": ""})
    proc = subprocess.run(
        [sys.executable, "-c", "import json, sys; print(sys.path[0])"],
        cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert _ran(tmp_path) == [] and proc.stdout.strip() != str(tmp_path)
    assert child_argv("m")[1:] == ["-P", "-m", "m"]
    assert env["PYTHONSAFEPATH"] == "1" and env["PYTHONPATH"].split(os.pathsep)[0] == str(ROOT)


def test_planted_modules_never_run_in_check_search_calibrate_export_report(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    space = cheap_smoke(work)
    _plant(work)
    db = f"sqlite:///{tmp_path / 'iso.db'}"
    runs = [
        ("check", space, "--db", db, "-f", "json"),
        ("search", space, "--db", db, "-q", "--concurrency", "4"),
        ("calibrate", space, "--db", db, "-q", "--concurrency", "4", "--pairs", "3"),
        ("export", "--db", db, "--out", str(tmp_path / "tables")),
        ("report", "--db", db, "--output", str(tmp_path / "report.md")),
    ]
    for args in runs:
        proc = _tuner(work, *args)
        assert proc.returncode == 0, (args, proc.stderr[-2000:])
        assert _ran(work) == [], (args[0], _ran(work))
