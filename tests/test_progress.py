"""Progress on stderr (tuner/progress.py): plain bounded lines without a TTY, bars with one, nothing when quiet;
and ``tuner check`` showing its compiles, one row per compiled binary."""

import io
import json
import os
import shutil
import subprocess
import sys

import pytest

from sparse_mla_tuner.tuner.progress import Progress
from sparse_mla_tuner.tuner.progress import duration


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def lines_progress(**kw):
    out, clock = io.StringIO(), Clock()
    return Progress(file=out, tty=False, interval_s=10.0, clock=clock, **kw), out, clock


def test_lines_mode_thousands_of_items_make_at_most_ten_lines():
    progress, out, clock = lines_progress(total_studies=1)
    st = progress.study("v4_flash C=96", total=5000)
    st.phase("A/A 12 pairs")
    st.phase("screening 5000 launches")
    for i in range(1, 5001):
        clock.t = i / 50  # 100 s in all
        st.advance(1, postfix="best T32-w4-s1-c512 48.4 µs")
    st.phase("finalists 3 x 30 rounds")
    st.close("best T32-w4-s1-c512 48.35 µs")
    text = out.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert lines[:2] == ["v4_flash C=96: A/A 12 pairs", "v4_flash C=96: screening 5000 launches"]
    counts = [ln for ln in lines if "/5000" in ln]
    assert 1 <= len(counts) <= 10
    # 500 items in 10 s: 4500 more take about 90 s at that rate
    assert counts[0] == "v4_flash C=96: 500/5000 (10 %), about 90 s left, best T32-w4-s1-c512 48.4 µs"
    assert lines[-2:] == [
        "v4_flash C=96: finalists 3 x 30 rounds",
        "v4_flash C=96: done in 100 s (best T32-w4-s1-c512 48.35 µs)",
    ]


def test_lines_mode_waits_the_interval_between_progress_lines():
    progress, out, clock = lines_progress()
    st = progress.study("C=1", total=100)
    for _ in range(100):  # all within 5 s: every 10 % step comes before the interval is up
        clock.t += 0.05
        st.advance()
    st.close()
    assert out.getvalue().splitlines() == ["C=1: done in 5 s"]


def test_compile_task_is_a_callback_and_silent_when_nothing_compiles():
    progress, out, clock = lines_progress()
    with progress.compiling("smoke/v4_tiny"):
        pass  # every verdict cached: the callback is never called
    assert out.getvalue() == ""
    with progress.compiling("smoke/v4_tiny") as task:
        task(0, 3)
        for done in (1, 2, 3):
            clock.t += 20
            task(done, 3)
    assert out.getvalue().splitlines() == [
        "smoke/v4_tiny: compile 3 configs ...",
        "smoke/v4_tiny: compiled 1/3 (33 %), about 40 s left",  # the time left at the rate so far
        "smoke/v4_tiny: compiled 2/3 (66 %), about 20 s left",
        "smoke/v4_tiny: compiled 3/3 (100 %)",
        "smoke/v4_tiny: compiled 3 in 60 s",
    ]


def test_quiet_prints_nothing_but_warnings():
    out = io.StringIO()
    progress = Progress(quiet=True, total_studies=2, file=out, tty=True)
    with progress.compiling("x") as task:
        task(0, 1)
        task(1, 1)
    st = progress.study("C=1", total=3)
    st.phase("screening")
    st.advance(3)
    st.close("best")
    progress.close()
    assert out.getvalue() == ""
    progress.warn("warning: multimodal")
    assert out.getvalue() == "warning: multimodal\n"


def test_bars_mode_keeps_phase_and_summary_lines():
    out = io.StringIO()
    with Progress(total_studies=2, file=out, tty=True) as progress:
        for c in (1, 96):
            st = progress.study(f"v4 C={c}", total=4, initial=1)
            st.phase("screening 3 launches")
            st.advance(3, postfix="best T16-w4-s1-c4 1.0 µs")
            st.close("best T16-w4-s1-c4 1.00 µs")
    text = out.getvalue()
    assert "v4 C=1: screening 3 launches\n" in text and "v4 C=96: done in 0 s (best T16-w4-s1-c4 1.00 µs)\n" in text
    assert "studies" in text  # the overall bar


def test_a_resumed_task_counts_its_rate_from_what_it_did_itself():
    progress, out, clock = lines_progress()
    st = progress.study("C=8", total=100, initial=50)  # 50 done by an earlier run
    for _ in range(10):
        clock.t += 3  # 10 items in 30 s: 40 more take about 2 min
        st.advance()
    assert out.getvalue().splitlines() == ["C=8: 60/100 (60 %), about 2 min left"]


def test_a_plain_task_shows_time_left_and_its_summary():
    progress, out, clock = lines_progress()
    with progress.task("calibrate v4_flash", total=4) as task:
        for _ in range(4):
            clock.t += 30
            task.advance(postfix="C=1")
    assert out.getvalue().splitlines() == [
        "calibrate v4_flash: 1/4 (25 %), about 90 s left, C=1",
        "calibrate v4_flash: 2/4 (50 %), about 60 s left, C=1",
        "calibrate v4_flash: 3/4 (75 %), about 30 s left, C=1",
        "calibrate v4_flash: 4/4 (100 %), C=1",
        "calibrate v4_flash: done in 2 min",
    ]


def test_duration():
    assert [duration(s) for s in (23.4, 840, 7500)] == ["23 s", "14 min", "2 h 05 min"]


# --- the compile process reports each finished compile ---------------------------------------------


def test_check_many_reports_each_compile_and_nothing_when_cached(tmp_path):
    from sparse_mla_tuner.db.store import Store
    from sparse_mla_tuner.kernels import KernelConfig
    from sparse_mla_tuner.kernels import Workload
    from sparse_mla_tuner.tuner.feasibility import check_many

    store = Store(f"sqlite:///{tmp_path / 'v.db'}")
    wl = Workload("fp8_model1", heads=16, topk=64, page_size=64, context=256)
    configs = [KernelConfig(16, 4, 1, c) for c in (4, 8)]  # one binary
    calls = []
    first = check_many(configs, wl, "sm_120", store=store, on_progress=lambda d, t: calls.append((d, t)))
    assert calls == [(0, 1), (1, 1)]
    calls.clear()
    assert check_many(configs, wl, "sm_120", store=store, on_progress=lambda d, t: calls.append((d, t))) == first
    assert calls == []


FAKE_COMPILER = """#!/bin/sh
cat > /dev/null
echo "compiled 1/2 T16-w4-s2" >&2
echo "a compiler warning" >&2
echo "compiled 2/2 T16-w4-s1" >&2
echo '[{"shared": 1, "registers": 2, "stack": 0}, {"error": "E"}]'
exit $FAKE_RC
"""


@pytest.mark.parametrize("rc", [0, 1])
def test_compile_numbers_reads_progress_while_running_and_keeps_the_error_tail(rc, tmp_path, monkeypatch):
    from sparse_mla_tuner.kernels import KernelConfig
    from sparse_mla_tuner.kernels import Workload
    from sparse_mla_tuner.tuner.errors import FeasibilityError
    from sparse_mla_tuner.tuner.feasibility import compile_numbers

    fake = tmp_path / "fake"
    fake.write_text(FAKE_COMPILER)
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake))
    monkeypatch.setenv("FAKE_RC", str(rc))
    wl = Workload("fp8_model1", heads=16, topk=64, page_size=64, context=256)
    calls = []

    def run():
        return compile_numbers([KernelConfig(16, 4, s, 4) for s in (1, 2)], wl, 120, lambda d, t: calls.append((d, t)))

    if rc:
        with pytest.raises(FeasibilityError, match="the compile-only check failed: a compiler warning"):
            run()
    else:
        assert run() == [{"shared": 1, "registers": 2, "stack": 0}, {"error": "E"}]
    assert calls == [(0, 2), (1, 2), (2, 2)]


# --- tuner check ------------------------------------------------------------------------------------

TINY = """\
name: tiny
target: sm_120
workloads:
  - {name: v4_tiny, kv_format: fp8_model1, heads: 64, tp: 4, topk: 64, page_size: 64, context: 256}
concurrency: [1]
parameters: {BLOCK_T: [16], num_warps: [4], num_stages: [1, 2], TARGET_CTAS: [4, 8, 16]}
constraints: []
baseline: {BLOCK_T: 16, num_warps: 4, num_stages: 2, TARGET_CTAS: 4}
measurement: {rounds: 5, finalists: 2, finalist_rounds: 8, trial_timeout_s: 60}
sampler: {name: grid, seed: 0}
"""


def tuner(*args):
    exe = shutil.which("tuner")
    cmd = [exe] if exe else [sys.executable, "-m", "sparse_mla_tuner.tuner"]
    # stderr is a pipe, not a TTY: the plain-lines mode; one compile at a time keeps a shared CPU usable
    env = {**os.environ, "TUNER_COMPILE_JOBS": "1", "TUNER_PROGRESS_INTERVAL_S": "0"}
    return subprocess.run(cmd + list(args), capture_output=True, text=True, env=env, timeout=600)


def cached_check(*args):
    """``tuner check ARGS`` when its verdicts are cached (nothing compiles): through the entry point in this
    process, its stderr a pipe all the same."""
    from tests.conftest import tuner_in_process

    return tuner_in_process("check", *args)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny space, its database, and the first check (the one that compiles: 2 binaries, 6 configs)."""
    d = tmp_path_factory.mktemp("tiny")
    (d / "tiny.yaml").write_text(TINY)
    space, db = str(d / "tiny.yaml"), f"sqlite:///{d / 'tiny.db'}"
    return space, db, tuner("check", space, "-f", "json", "--db", db)


def test_check_rows_per_compiled_binary_with_progress_lines(tiny):
    *_, proc = tiny
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [(r["num_stages"], r["TARGET_CTAS"]) for r in rows] == [(1, [4, 8, 16]), (2, [4, 8, 16])]
    # progress while compiling: plain lines, bounded, never a carriage return
    assert "\r" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert "tiny/v4_tiny: compile 2 configs ..." in lines
    # read while the compile process runs, with the time left
    assert any(ln.startswith("tiny/v4_tiny: compiled 1/2 (50 %), about ") and ln.endswith(" left") for ln in lines)
    assert any(ln.startswith("tiny/v4_tiny: compiled 2 in ") for ln in lines)
    assert len(lines) <= 8
    assert lines[-1] == "6 feasible / 0 infeasible for sm_120"


def test_check_all_lists_every_config_in_the_old_field_order(tiny):
    from sparse_mla_tuner.kernels.config import PARAM_NAMES
    from sparse_mla_tuner.tuner.cli import VERDICT_FIELDS

    space, db, _ = tiny
    proc = cached_check(space, "--all", "-f", "json", "--db", db)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert len(rows) == 6 and all(list(r) == [*PARAM_NAMES, *VERDICT_FIELDS] for r in rows)
    assert [r["TARGET_CTAS"] for r in rows] == [4, 8, 16, 4, 8, 16]
    assert "compile" not in proc.stderr  # cached by the first check


def test_check_csv_joins_launch_values_and_quiet_is_silent(tiny):
    space, db, _ = tiny
    proc = cached_check(space, "-f", "csv", "-q", "--db", db)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1].startswith('16,4,1,"4,8,16",0,')
    assert proc.stderr.splitlines() == ["6 feasible / 0 infeasible for sm_120"]


def test_a_slow_step_says_what_it_does_and_a_quick_one_nothing():
    import threading

    out = io.StringIO()
    progress = Progress(file=out, tty=False)
    with progress.slow("export: reading", after_s=3600):
        pass
    assert out.getvalue() == ""  # quick: nothing (an error right after it stays the only line)
    said = threading.Event()
    progress.message = lambda text: (out.write(text + "\n"), said.set())  # noqa: B023 - this progress only
    with progress.slow("export: reading", after_s=0.0):
        assert said.wait(60)  # still inside: the step is slow
    assert out.getvalue() == "export: reading\n"
    quiet = io.StringIO()
    with Progress(quiet=True, file=quiet).slow("x", after_s=0.0):
        pass
    assert quiet.getvalue() == ""


@pytest.mark.parametrize("cmd", [["report"], ["export", "--out", "OUT"], ["export", "--format", "triton"]])
def test_report_and_export_say_their_progress_on_stderr(tmp_path, cmd):
    """They took a minute and ten seconds on the whole H200 record without a word: each now ends with a line on
    stderr (with lines of progress and the reading said on the way when they are slow); stdout is the data."""
    from tests.conftest import tuner_in_process
    from tests.recorded import make_results

    db = make_results(tmp_path / "r.db")
    args = [a.replace("OUT", str(tmp_path / "t")) for a in cmd]
    proc = tuner_in_process(*args, "--db", f"sqlite:///{db}")
    assert proc.returncode == 0, proc.stderr
    name = cmd[0]
    done = [line for line in proc.stderr.splitlines() if line.startswith(f"{name}: done in")]
    assert len(done) == 1 and ("3 sections" if name == "report" else "3 tables") in done[0], proc.stderr
    assert f"{name}: done" not in proc.stdout
