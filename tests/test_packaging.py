"""What a user who installs the wheel gets: the shipped spaces by name, optional matplotlib, a true Python floor."""

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent
SPACES = sorted(p.stem for p in (ROOT / "search_spaces").glob("*.yaml"))


@pytest.fixture(scope="module")
def wheel_install(tmp_path_factory):
    """The project's wheel, built here and installed alone into a folder (dependencies come from this
    interpreter): what ``pip install sparse-mla-tuner`` puts on a machine, without the checkout."""
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(ROOT), "-w", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=out,
    )
    if build.returncode != 0:
        pytest.skip(f"cannot build the wheel here: {build.stderr.strip()[-300:]}")
    wheel = next(out.glob("*.whl"))
    target = out / "site"
    inst = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert inst.returncode == 0, inst.stderr
    return wheel, target


def _run(target, *args, cwd):
    env = {**os.environ, "PYTHONPATH": str(target)}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600, cwd=cwd, env=env)


def test_the_wheel_carries_the_shipped_spaces(wheel_install):
    wheel, _ = wheel_install
    names = zipfile.ZipFile(wheel).namelist()
    spaces = "sparse_mla_tuner/tuner/search_spaces/"
    assert sorted(n for n in names if n.startswith(spaces)) == [f"{spaces}{s}.yaml" for s in SPACES]
    assert not any(n.startswith("search_spaces/") for n in names)  # no top-level package of that name


def test_the_wheel_adds_one_top_level_package(wheel_install):
    """kernels/, db/ and tuner/ install under sparse_mla_tuner: no top-level `kernels` (a Hugging Face package's
    name) or `db` to collide with another install, and the console script and plugin point inside it."""
    wheel, _ = wheel_install
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"sparse_mla_tuner"}, top
    for pkg in ("kernels", "db", "tuner"):
        assert f"sparse_mla_tuner/{pkg}/__init__.py" in names
    meta = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    entry = zipfile.ZipFile(wheel).read(meta).decode()
    assert "tuner = sparse_mla_tuner.tuner.cli:main" in entry
    assert "sparse_mla_tuner.kernels.sglang_plugin:register" in entry
    assert "sparse_mla_tuner.kernels.vllm_plugin:register" in entry


def test_a_shipped_space_by_name_from_a_wheel_install(wheel_install, tmp_path):
    """Outside the checkout, `tuner check smoke` and `load_space("v4_flash_tp4")` find the installed spaces."""
    _, target = wheel_install
    code = (
        "import sparse_mla_tuner.tuner.space as s, json; "
        f"print(json.dumps({{n: [s.load_space(n).name, s.resolve_space(n)] for n in {SPACES!r}}}))"
    )
    proc = _run(target, "-c", code, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    import json

    got = json.loads(proc.stdout)
    for name, (space_name, path) in got.items():
        assert Path(path).is_relative_to(target) and Path(path).name == f"{name}.yaml"
        assert space_name == name  # each shipped space is named as its file
    proc = _run(target, "-m", "sparse_mla_tuner.tuner", "check", "smoke", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"\d+ feasible / \d+ infeasible for sm_120", proc.stdout + proc.stderr)


def test_an_unknown_space_name_is_one_sentence_naming_the_shipped_ones(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "sparse_mla_tuner.tuner", "check", "v4_flash"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    msg = proc.stderr.strip()
    assert "no shipped space of that name" in msg and "v4_flash_tp4" in msg and len(msg.splitlines()) == 1


def test_a_file_beats_a_shipped_name(tmp_path, monkeypatch):
    from sparse_mla_tuner.tuner.space import resolve_space

    monkeypatch.chdir(tmp_path)
    (tmp_path / "smoke").write_text("name: mine\n")
    assert resolve_space("smoke") == "smoke"
    assert resolve_space("v32_tp8") == str(ROOT / "search_spaces" / "v32_tp8.yaml")
    assert resolve_space("v32_tp8.yaml") == str(ROOT / "search_spaces" / "v32_tp8.yaml")
    assert resolve_space("some/dir/x.yaml") == "some/dir/x.yaml"  # a path is a path: its error says so


def test_report_plots_without_matplotlib_say_how_to_get_it(tmp_path):
    """matplotlib is the [report] extra: without it, `tuner report --plots` is one sentence, and the report itself
    still works."""
    db = ROOT / "results" / "h200.db"
    if not db.exists():
        pytest.skip("no committed results database")
    from sparse_mla_tuner.db.store import Store
    from tests.recorded import make_results

    copy = make_results(tmp_path / "h200.db")  # the committed results' three workloads, two levels each
    Store(f"sqlite:///{copy}", upgrade=True)
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text("import sys\nsys.modules['matplotlib'] = None\n")
    from tests.conftest import tuner_processes

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker), str(ROOT)])}
    cmd = ["report", "--db", f"sqlite:///{copy}"]
    # the two commands as processes forked from one that started with matplotlib blocked (one interpreter start)
    plots, report = tuner_processes([[*cmd, "--plots", str(tmp_path / "plots")], cmd], env=env)
    assert plots.returncode != 0 and "Traceback" not in plots.stderr, plots.stderr
    assert "needs matplotlib" in plots.stderr and "sparse-mla-tuner[report]" in plots.stderr
    assert report.returncode == 0 and "## " in report.stdout, report.stderr


def test_the_declared_versions_are_the_tested_ones():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["requires-python"] == ">=3.11"  # db/verdicts.py uses enum.StrEnum (3.11)
    assert "StrEnum" in (ROOT / "db" / "verdicts.py").read_text()
    from packaging.requirements import Requirement

    deps = {r.name: r.specifier for r in map(Requirement, meta["dependencies"])}
    ci = (ROOT / ".ci" / "run").read_text()
    tested = {name: set(re.findall(rf"\b{name}==([0-9.]+)", ci)) for name in ("torch", "triton")}
    assert tested == {"torch": {"2.13.0"}, "triton": {"3.6.0", "3.9.0"}}, tested  # .ci/run's pairs
    for name, versions in tested.items():  # every tested version allowed, every untested release excluded
        assert all(deps[name].contains(v) for v in versions), (name, deps[name])
    assert deps["torch"].contains("2.11.0")  # the H200 runs' torch (docs/benchmarks.md)
    assert "torch 2.11.0" in (ROOT / "docs" / "benchmarks.md").read_text().replace("\n", " ")
    for untested in ("2.10.0", "2.12.0", "2.14.0", "2.14.1"):
        assert not deps["torch"].contains(untested), untested
    for untested in ("3.5.0", "3.7.0", "3.8.0", "3.10.0"):
        assert not deps["triton"].contains(untested), untested
    assert not any(d.startswith("matplotlib") for d in meta["dependencies"])
    assert meta["optional-dependencies"]["report"] == ["matplotlib>=3.7"]
