"""``tuner search`` end to end with the interpreter backend, through the real executable; the other commands
(queries, check, export, report) through its entry point in this process."""

import csv
import io
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import cheap_smoke
from tests.conftest import tuner_in_process as query  # a command that only reads: no interpreter start per call

SMOKE = "search_spaces/smoke.yaml"


def tuner(*args, env=None, timeout=600):
    exe = shutil.which("tuner")
    cmd = [exe] if exe else [sys.executable, "-m", "sparse_mla_tuner.tuner"]
    return subprocess.run(
        cmd + list(args), capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=timeout
    )


@pytest.fixture(scope="session")
def smoke_db(smoke_search, tmp_path_factory):
    """One smoke search (conftest.py's, which test_strategies.py replays too), shared by the query tests below:
    this file's own copy of its database."""
    assert smoke_search["returncode"] == 0, smoke_search["stderr"]
    assert "interpreter backend" in smoke_search["stderr"] and "not GPU timings" in smoke_search["stderr"]
    path = tmp_path_factory.mktemp("smoke") / "tuner.db"
    shutil.copy(smoke_search["path"], path)
    return {
        "url": f"sqlite:///{path}",
        "path": path,
        "stdout": smoke_search["stdout"],
        "wall_s": smoke_search["wall_s"],
    }


def _rows(db_path, sql):
    con = sqlite3.connect(db_path)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_smoke_search_fills_the_database(smoke_db):
    path = smoke_db["path"]
    # 4 configs x 2 concurrency levels, each measured once
    trials = _rows(path, "SELECT concurrency, config_key, verdict FROM tuner_trials ORDER BY id")
    assert len(trials) == 8 and len({(c, k) for c, k, _ in trials}) == 8
    verdicts = {(c, k): v for c, k, v in trials}
    # T32 with 2 stages needs 102 528 B of shared memory: infeasible on sm_120, never launched
    assert verdicts[(1, "T32-w4-s2-c4")] == "infeasible"
    reason = _rows(path, "SELECT reason FROM tuner_trials WHERE config_key='T32-w4-s2-c4'")[0][0]
    assert "> sm_120 limit 101 376 B" in reason
    assert _rows(
        path,
        "SELECT COUNT(*) FROM tuner_samples s JOIN tuner_trials t ON s.trial_id = t.id WHERE t.verdict = 'infeasible'",
    ) == [(0,)]
    # every ok trial has its raw samples (4 screening rounds) and a statistic; finalists got 5 more rounds
    for (n,) in _rows(
        path,
        "SELECT COUNT(*) FROM tuner_samples s JOIN tuner_trials t ON s.trial_id = t.id "
        "WHERE t.verdict = 'ok' AND s.phase = 'screen' GROUP BY t.id",
    ):
        assert n == 4
    # at least the top 2 of each study, plus every config that beat all told before it (see the Optuna test)
    (n_final,) = _rows(path, "SELECT COUNT(*) FROM tuner_statistics WHERE phase = 'finalist'")[0]
    (n_ok,) = _rows(path, "SELECT COUNT(*) FROM tuner_trials WHERE verdict = 'ok'")[0]
    assert 4 <= n_final <= n_ok
    bands = _rows(path, "SELECT noise_band FROM tuner_studies")
    assert len(bands) == 2 and all(b is not None and b >= 0 for (b,) in bands)
    # Optuna's study is in the same database and readable by Optuna
    import optuna

    names = optuna.study.get_all_study_names(storage=smoke_db["url"])
    assert len(names) == 2 and all(n.startswith("smoke/v4_tiny/C") for n in names)
    # the summary has one row per concurrency level, each naming an ok config, never the infeasible one
    rows = [line.split() for line in smoke_db["stdout"].splitlines() if line.startswith("v4_tiny")]
    assert sorted(r[1] for r in rows) == ["1", "4"], smoke_db["stdout"]
    assert all(r[2] in {"T16-w4-s1-c4", "T16-w4-s2-c4", "T32-w4-s1-c4"} for r in rows), smoke_db["stdout"]


def test_rerun_resumes_without_remeasuring(smoke_db, tmp_path):
    path = tmp_path / "again.db"
    shutil.copy(smoke_db["path"], path)
    samples = _rows(path, "SELECT * FROM tuner_samples ORDER BY id")
    proc = tuner("search", SMOKE, "--db", f"sqlite:///{path}", "-q")
    assert proc.returncode == 0, proc.stderr
    assert _rows(path, "SELECT COUNT(*) FROM tuner_trials") == [(8,)]
    assert _rows(path, "SELECT * FROM tuner_samples ORDER BY id") == samples  # nothing measured again


def test_kill_9_loses_at_most_the_running_trial_and_resume_completes(tmp_path, smoke_db):
    """Killed mid-trial, and once more between Optuna's ask and the next trial's first heartbeat (a trial
    Optuna never fails as stale by itself: it fails only silent heartbeats). The resume gives every running
    trial a beat, so both go stale after the grace period (4 s here, ``$TUNER_HEARTBEAT_GRACE_S``, instead of 10),
    are re-queued and measured."""
    import optuna

    from sparse_mla_tuner.kernels.config import KernelConfig
    from sparse_mla_tuner.tuner.space import load_space
    from sparse_mla_tuner.tuner.study import optuna_distributions

    path = tmp_path / "k.db"
    url = f"sqlite:///{path}"
    exe = shutil.which("tuner")
    space = cheap_smoke(tmp_path)
    cmd = ([exe] if exe else [sys.executable, "-m", "sparse_mla_tuner.tuner"]) + [
        "search",
        space,
        "--db",
        url,
        "-q",
        "--concurrency",
        "1",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 5 * smoke_db["wall_s"]  # a whole smoke search, five times over
    while time.monotonic() < deadline:
        time.sleep(0.5)
        if path.exists() and _count(path) >= 1:  # the baseline: two of the three launches are still to come
            break
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = _count(path)
    assert 1 <= before < 3
    (name,) = optuna.get_all_study_names(url)
    study = optuna.load_study(study_name=name, storage=url)
    dists = optuna_distributions(load_space(SMOKE))
    # a second process took the next queued config and died before beating: a config the grid needs (the
    # last launch of the grid is queued once more, so there is one to take whenever the kill came)
    study.enqueue_trial(KernelConfig.parse("T32-w4-s1-c4").as_dict(), skip_if_exists=False)
    orphan = study.ask(fixed_distributions=dists)
    assert "fixed_params" in next(t for t in study.get_trials() if t.number == orphan.number).system_attrs
    # a whole smoke search (two levels) five times over, plus the grace period: waiting forever fails here
    done = tuner(
        "search", space, "--db", url, "-q", "--concurrency", "1", timeout=5 * smoke_db["wall_s"] + 60,
        env={"TUNER_HEARTBEAT_GRACE_S": "4"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = _rows(path, "SELECT config_key, COUNT(*) FROM tuner_trials GROUP BY config_key")
    assert sorted(rows) == sorted((k, 1) for k in ("T16-w4-s1-c4", "T16-w4-s2-c4", "T32-w4-s1-c4", "T32-w4-s2-c4"))
    orphans = _rows(path, "SELECT COUNT(*) FROM tuner_samples WHERE trial_id NOT IN (SELECT id FROM tuner_trials)")
    assert orphans == [(0,)]


def test_ctrl_c_stops_after_the_running_trial(tmp_path, smoke_db):
    path = tmp_path / "i.db"
    exe = shutil.which("tuner")
    cmd = ([exe] if exe else [sys.executable, "-m", "sparse_mla_tuner.tuner"]) + [
        "search",
        cheap_smoke(tmp_path),
        "--db",
        f"sqlite:///{path}",
        "-q",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 5 * smoke_db["wall_s"]
    while time.monotonic() < deadline and _count(path) < 1:
        time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGINT)  # as the terminal does: the whole process group
    out, err = proc.communicate(timeout=5 * smoke_db["wall_s"])
    assert proc.returncode == 130, err  # stopped on request: the shell's convention for SIGINT
    assert "stopping after the current trial" in err
    verdicts = [v for (v,) in _rows(path, "SELECT verdict FROM tuner_trials")]
    assert 1 <= len(verdicts) < 8 and "crashed" not in verdicts  # the measurement process survived the signal


def _count(path):
    try:
        return _rows(path, "SELECT COUNT(*) FROM tuner_trials")[0][0]
    except sqlite3.OperationalError:
        return 0


FAULTS = {"T16-w4-s1-c4": "crash", "T32-w4-s1-c4": "hang", "T16-w8-s1-c4": "oor"}


@pytest.fixture(scope="module")
def faulted(smoke_db, tmp_path_factory):
    """One search at one level in which every launch but the baseline's fails: one crashes its measurement process,
    one hangs it, one runs out of shared memory at launch (``$TUNER_FAULT``). The smoke space with the fewest rounds
    and one more config, T16-w8-s1-c4, for the third fault. The trial timeout must exceed a normal trial on this
    machine now: 5x the slowest trial of the smoke search. Its database's path, the timeout and the process."""
    (slowest,) = _rows(smoke_db["path"], "SELECT MAX(wall_s) FROM tuner_trials")[0]
    limit = max(8, int(5 * slowest) + 1)
    folder = tmp_path_factory.mktemp("faulted")
    text = Path(cheap_smoke(folder, trial_timeout_s=limit)).read_text()
    assert "num_warps: [4]" in text and "constraints: []" in text
    text = text.replace("num_warps: [4]", "num_warps: [4, 8]")
    space = folder / "faulted.yaml"  # the smoke space's four configs, and the third fault's
    third = 'constraints: ["num_warps == 4 or (BLOCK_T == 16 and num_stages == 1)"]'
    space.write_text(text.replace("constraints: []", third))
    path = folder / "f.db"
    proc = tuner(
        "search", str(space), "--db", f"sqlite:///{path}", "-q", "--concurrency", "1",
        env={"TUNER_FAULT": ",".join(f"{kind}@{key}" for key, kind in FAULTS.items())},
    )  # fmt: skip
    return {"path": path, "limit": limit, "proc": proc}


def test_injected_crash_and_hang_are_recorded_and_the_study_goes_on(faulted):
    path, limit, proc = faulted["path"], faulted["limit"], faulted["proc"]
    assert proc.returncode == 0, proc.stderr
    verdicts = dict(_rows(path, "SELECT config_key, verdict FROM tuner_trials"))
    assert verdicts == {
        "T16-w4-s2-c4": "ok",
        "T16-w4-s1-c4": "crashed",
        "T32-w4-s1-c4": "timeout",
        "T32-w4-s2-c4": "infeasible",
        "T16-w8-s1-c4": "infeasible",  # test_out_of_resources_at_launch_is_recorded_as_infeasible's
    }
    reasons = dict(_rows(path, "SELECT config_key, reason FROM tuner_trials"))
    assert "status 17" in reasons["T16-w4-s1-c4"] and f"no answer within {limit} s" in reasons["T32-w4-s1-c4"]


@pytest.mark.parametrize("fmt", ["table", "json", "csv"])
def test_best_in_every_format(smoke_db, fmt):
    proc = query("best", "--concurrency", "1", "--db", smoke_db["url"], "-f", fmt)
    assert proc.returncode == 0, proc.stderr
    if fmt == "json":
        (row,) = json.loads(proc.stdout)
        assert {"BLOCK_T", "num_warps", "num_stages", "TARGET_CTAS"} <= set(row)
        assert row["concurrency"] == 1 and row["backend"] == "interpreter" and row["ci_low_us"] <= row["median_us"]
        assert row["effect"] in ("win", "flat", "regression")
    elif fmt == "csv":
        (row,) = list(csv.DictReader(io.StringIO(proc.stdout)))
        assert row["device"] == "cpu-interpreter"
    else:
        assert "median_us" in proc.stdout.splitlines()[0]


@pytest.mark.parametrize("fmt", ["table", "json", "csv"])
def test_trials_in_every_format(smoke_db, fmt):
    proc = query("trials", "--verdict", "infeasible", "--db", smoke_db["url"], "-f", fmt)
    assert proc.returncode == 0, proc.stderr
    if fmt == "json":
        rows = json.loads(proc.stdout)
        assert len(rows) == 2 and all(r["verdict"] == "infeasible" and r["shared_bytes"] > 101376 for r in rows)
    elif fmt == "csv":
        assert len(list(csv.DictReader(io.StringIO(proc.stdout)))) == 2
    else:
        assert proc.stdout.count("infeasible") == 2


def test_best_with_no_data_is_one_sentence(smoke_db):
    proc = query("best", "--concurrency", "77", "--db", smoke_db["url"])
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "no ok result" in proc.stderr


def test_out_of_resources_at_launch_is_recorded_as_infeasible(faulted):
    """A launch that needs more shared memory than the GPU has (Triton's OutOfResources) is an infeasible trial
    with its reason, and the search goes on (the faulted search's third fault)."""
    proc, path = faulted["proc"], faulted["path"]
    assert proc.returncode == 0, proc.stderr
    verdict, reason = _rows(path, "SELECT verdict, reason FROM tuner_trials WHERE config_key = 'T16-w8-s1-c4'")[0]
    assert verdict == "infeasible" and reason.startswith("OutOfResources at launch") and "120000" in reason


@pytest.fixture(scope="module")
def check_db(tmp_path_factory):
    """One results database for the three formats: the first check compiles, the others read its verdicts."""
    return tmp_path_factory.mktemp("check") / "c.db"


@pytest.mark.parametrize("fmt", ["table", "json", "csv"])
def test_check_in_every_format(fmt, check_db):
    proc = query("check", SMOKE, "-f", fmt, "--db", f"sqlite:///{check_db}")
    assert proc.returncode == 0, proc.stderr
    if fmt == "json":
        from sparse_mla_tuner.kernels.config import PARAM_NAMES

        rows = json.loads(proc.stdout)
        assert [list(r) for r in rows][0] == [
            *PARAM_NAMES,  # every declared parameter, then the feasibility numbers
            "shared_bytes",
            "limit_bytes",
            "registers",
            "spill_bytes",
            "estimate_bytes",
            "feasible",
            "reason",
        ]
        assert sum(r["feasible"] for r in rows) == 3
        assert "3 feasible / 1 infeasible for sm_120" in proc.stderr
    elif fmt == "csv":
        assert len(list(csv.DictReader(io.StringIO(proc.stdout)))) == 4
    else:
        assert proc.stdout.strip().splitlines()[-1] == "3 feasible / 1 infeasible for sm_120"
    # the verdicts are cached in the results database
    assert _rows(check_db, "SELECT COUNT(*) FROM tuner_feasibility")[0][0] == 4


def test_version_and_help():
    from tests.conftest import tuner_processes  # each its own process, after one import

    version, help_ = tuner_processes([["--version"], ["--help"]])
    assert version.returncode == 0 and version.stdout.strip() == "tuner, version 0.1.0"
    assert help_.returncode == 0
    out = help_.stdout
    for cmd in ("check", "search", "best", "trials", "db"):
        assert cmd in out


def test_export_writes_the_table_the_kernel_reads(smoke_db, tmp_path):
    out = tmp_path / "configs"
    exports = _rows(smoke_db["path"], "SELECT COUNT(*) FROM tuner_exports")[0][0]
    proc = query("export", "--db", smoke_db["url"], "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    name = "kv_format=fp8_model1,heads=16,topk=32,device_name=cpu-interpreter"
    assert sorted(p.name for p in out.glob("*.json")) == [f"{name}.json", f"{name}.provenance.json"]
    table = json.loads((out / f"{name}.json").read_text())
    assert set(table) == {"1", "4"}
    for entry in table.values():
        from sparse_mla_tuner.kernels.config import PARAM_NAMES

        assert set(entry) == set(PARAM_NAMES)  # every declared parameter (MERGE too)
        assert entry["BLOCK_T"] * entry["num_stages"] < 64  # never the infeasible T32-s2
    side = json.loads((out / f"{name}.provenance.json").read_text())
    assert {e["verdict"] for e in side["entries"].values()} == {"ok"}
    from sparse_mla_tuner.kernels.table import lookup_config

    cfg = lookup_config("cpu-interpreter", "fp8_model1", 16, 32, 3, config_dir=out)  # nearest key: 4
    assert cfg.as_dict() == table["4"]
    assert _rows(smoke_db["path"], "SELECT COUNT(*) FROM tuner_exports")[0][0] == exports  # only read
    assert query("export", "--db", smoke_db["url"], "--out", str(out), "--record").returncode == 0
    assert _rows(smoke_db["path"], "SELECT COUNT(*) FROM tuner_exports")[0][0] == exports + 1  # one table
    triton_fmt = query("export", "--db", smoke_db["url"], "--format", "triton")
    assert triton_fmt.returncode == 0 and "triton.Config(" in triton_fmt.stdout


def test_stale_table_warns_with_both_hashes(tmp_path):
    import warnings

    import sparse_mla_tuner.kernels.table as kc

    name = kc.table_name("dev", "fp8_v32", 16, 64)
    entry = {"BLOCK_T": 16, "num_warps": 4, "num_stages": 1, "TARGET_CTAS": 8}
    (tmp_path / name).write_text(json.dumps({"1": entry}))
    side = {"kernel_hash": "000000000000", "entries": {"1": {"verdict": "ok"}}}
    kc.sidecar_path(tmp_path / name).write_text(json.dumps(side))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        cfg = kc.lookup_config("dev", "fp8_v32", 16, 64, 1, config_dir=tmp_path)
    assert cfg.TARGET_CTAS == 8
    from sparse_mla_tuner.kernels.config import kernel_source_hash

    assert any("000000000000" in str(x.message) and kernel_source_hash() in str(x.message) for x in w)


def test_report_states_levers_dead_ends_and_infeasible(smoke_db, tmp_path):
    out = tmp_path / "REPORT.md"
    proc = query("report", "--db", smoke_db["url"], "-o", str(out), "--plots", str(tmp_path / "plots"))
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert "## smoke / v4_tiny on cpu-interpreter (interpreter)" in text
    assert "| BLOCK_T = 32 |" in text and "| num_stages = 1 |" in text
    assert "`T32-w4-s2`: shared 102 528 B > sm_120 limit 101 376 B" in text
    assert "### Dead ends" in text and "noise band" in text
    pngs = sorted(p.name for p in (tmp_path / "plots").glob("*.png"))
    assert len(pngs) == 2 and all(f"plots/{p}" in text for p in pngs)


@pytest.mark.parametrize("fmt", ["table", "json", "csv"])
def test_show_compare_studies_in_every_format(smoke_db, fmt):
    show = query("show", "1", "--db", smoke_db["url"], "-f", fmt)
    assert show.returncode == 0, show.stderr
    if fmt == "json":
        info = json.loads(show.stdout)
        screen = [x for x in info["samples"] if x["phase"] == "screen"]
        assert info["config_key"] == "T16-w4-s2-c4" and info["is_baseline"] and len(screen) == 4
    cmp_ = query("compare", "T32-w4-s1-c4", "T16-w4-s2-c4", "--db", smoke_db["url"], "-f", fmt)
    assert cmp_.returncode == 0, cmp_.stderr
    if fmt == "json":
        rows = json.loads(cmp_.stdout)
        assert [r["C"] for r in rows] == [1, 4] and all(r["ci_low"] <= r["A/B"] <= r["ci_high"] for r in rows)
    st = query("studies", "--db", smoke_db["url"], "-f", fmt)
    assert st.returncode == 0, st.stderr
    if fmt == "csv":
        assert len(list(csv.DictReader(io.StringIO(st.stdout)))) == 2


def test_query_errors_are_one_sentence(smoke_db, tmp_path):
    for args, msg in [
        (["show", "999"], "no trial 999"),
        (["compare", "T16", "x"], "not of the form"),
        (["export", "--db", f"sqlite:///{tmp_path / 'empty.db'}"], "no database at"),
    ]:
        proc = query(*args, *([] if "--db" in args else ["--db", smoke_db["url"]]))
        assert proc.returncode == 2 and msg in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_the_optuna_study_explains_itself(smoke_db):
    """Optuna's own API (and so optuna-dashboard) shows the metric, what was tuned, and why a trial ended."""
    import optuna

    names = optuna.study.get_all_study_names(storage=smoke_db["url"])
    study = optuna.load_study(study_name=sorted(names)[0], storage=smoke_db["url"])
    assert study.metric_names == ["median_us"]
    attrs = study.user_attrs
    for key in ("space", "workload", "concurrency", "device", "backend", "target_arch", "baseline", "noise_band"):
        assert key in attrs, key
    assert attrs["space"] == "smoke" and attrs["target_arch"] == "sm_120" and attrs["baseline"] == "T16-w4-s2-c4"
    done = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert done
    for t in done:
        ua = t.user_attrs
        assert ua["verdict"] == "ok" and isinstance(ua["tuner_trial_id"], int)
        assert ua["ratio_ci"][0] <= ua["ratio"] <= ua["ratio_ci"][1] and ua["effect"] in ("win", "flat", "regression")
        # the value is the tuner's own final median of the config (its finalist rounds', else its screening ones')
        assert t.value == ua.get("finalist_median_us", ua["screening_median_us"]) == ua["median_us_measured"]


def test_optunas_best_is_the_tuners_best(smoke_db):
    """Finalist re-measurements reach Optuna, so its best trial is the one `tuner best` names; configs decided
    without a launch are pruned Optuna trials that say why."""
    import optuna

    for name in optuna.study.get_all_study_names(storage=smoke_db["url"]):
        study = optuna.load_study(study_name=name, storage=smoke_db["url"])
        c = study.user_attrs["concurrency"]
        proc = query("best", "--concurrency", str(c), "--format", "json", "--db", smoke_db["url"])
        assert proc.returncode == 0, proc.stderr
        (row,) = json.loads(proc.stdout)
        # every Optuna value is the tuner's own median of its config, so `best`'s trial holds what `best` shows and
        # Optuna's best is the lowest median; the tuner ranks by the paired ratio instead, so the two name the same
        # trial unless the baseline drifted between rounds (docs/search.md, "Optuna's view")
        (ours,) = [t for t in study.trials if t.user_attrs.get("tuner_trial_id") == row["trial"]]
        assert ours.user_attrs["phase"] == row["phase"] == "finalist"
        assert {k: ours.params[k] for k in ("BLOCK_T", "num_warps", "num_stages", "TARGET_CTAS")} == {
            k: row[k] for k in ("BLOCK_T", "num_warps", "num_stages", "TARGET_CTAS")
        }
        assert ours.user_attrs["finalist_median_us"] == pytest.approx(row["median_us"], abs=1e-3)
        assert ours.value == pytest.approx(row["median_us"], abs=1e-3)  # what `tuner best` shows
        assert study.best_value == min(t.value for t in study.trials if t.value is not None) <= ours.value
        pruned = study.get_trials(states=(optuna.trial.TrialState.PRUNED,))
        infeasible = [t for t in pruned if t.user_attrs.get("verdict") == "infeasible"]
        assert infeasible and all("sm_120 limit" in t.user_attrs["reason"] for t in infeasible)
        assert all(t.user_attrs.get("reason") for t in pruned)


def test_a_changed_kernel_measures_the_previous_kernels_best_first(smoke_db, tmp_path):
    """The smoke results are made to look like another kernel's; a new search measures the baseline,
    then the configs given with ``--first``, then that kernel's best configs in their order, then the rest."""
    path = tmp_path / "prior.db"
    shutil.copy(smoke_db["path"], path)
    url = f"sqlite:///{path}"
    con = sqlite3.connect(path)
    # the smoke kernel's row becomes an older kernel's (kernel rows are created in the order kernels appear)
    con.execute("UPDATE tuner_kernels SET source_hash = '0123456789ab'")
    (old,) = con.execute("SELECT id FROM tuner_kernels").fetchone()
    con.execute("UPDATE tuner_studies SET name = name || '-old'")
    con.execute("UPDATE studies SET study_name = study_name || '-old'")  # Optuna's table
    con.commit()
    con.close()
    from sparse_mla_tuner.db import queries
    from sparse_mla_tuner.db.store import Store

    with Store(url, readonly=True).session() as s:
        ranked = queries.prior_picks(s, -1, 1, space="smoke")
    assert len(ranked) == 3  # the three feasible configs, best first
    baseline = "T16-w4-s2-c4"
    given = next(k for k in reversed(ranked) if k != baseline)  # not the old kernel's best: --first puts it ahead
    space = cheap_smoke(tmp_path)  # the smoke space by name (the previous kernel's), its fewest rounds
    proc = tuner("search", space, "--db", url, "--concurrency", "1", "--n-trials", "3", "--first", given)
    assert proc.returncode == 0, proc.stderr
    assert "first the configs given with --first, then the previous kernel's best" in proc.stderr
    order = [
        k
        for (k,) in _rows(
            path, f"SELECT config_key FROM tuner_trials WHERE kernel_id != {old} AND verdict = 'ok' ORDER BY id"
        )
    ]
    assert order == [baseline, given, next(k for k in ranked if k not in (baseline, given))]
    # the report reads each level's newest kernel only: C=1 the new one, C=4 (not searched again) the old
    rep = query("report", "--db", url, "-o", str(tmp_path / "r.md"))
    assert rep.returncode == 0, rep.stderr
    text = (tmp_path / "r.md").read_text()
    assert "`0123456789ab`" in text and "(the newest measured at each level)" in text
    c1 = next(line for line in text.splitlines() if line.startswith("| 1 |"))
    assert c1.split("|")[8].strip() == "3"  # ok trials at C=1: the new kernel's 3, not 6 with the old kernel's


def test_a_value_the_previous_kernel_never_ran_is_tried_on_its_best_configs():
    from sparse_mla_tuner.kernels import KernelConfig
    from sparse_mla_tuner.tuner.study import new_value_variants

    best = [KernelConfig.parse(k) for k in ("T32-w4-s1-c768", "T64-w8-s1-c128-p1", "T32-w4-s2-c256")]
    measured = [*best, KernelConfig.parse("T16-w4-s1-c512")]
    parameters = {"BLOCK_T": [16, 32, 64], "num_warps": [4, 8], "num_stages": [1, 2], "PREFETCH": [0, 1, 2]}
    got = [str(c) for c in new_value_variants(best, measured, parameters)]
    # PREFETCH=2 is the only value none of them ran: each best config with it, best first (the caller drops
    # what the space does not hold, e.g. T32-w4-s2-c256-p2 under "PREFETCH == 0 or num_stages == 1")
    assert got == ["T32-w4-s1-c768-p2", "T64-w8-s1-c128-p2", "T32-w4-s2-c256-p2"]
    assert new_value_variants(best, measured + [KernelConfig.parse("T16-w4-s1-c4-p2")], parameters) == []
    assert new_value_variants(best, [], parameters) == []  # no previous kernel: nothing is new


def test_a_searchs_history_read_level_after_level_is_the_whole_history(smoke_db, tmp_path):
    """A search reads its workload's history whole once, then only what changed (new trials, new statistics): at
    every read it holds what a whole read holds."""
    from sparse_mla_tuner.db import queries
    from sparse_mla_tuner.db.store import Store
    from sparse_mla_tuner.tuner.recorder import SpaceHistory

    path = tmp_path / "history.db"
    shutil.copy(smoke_db["path"], path)
    store, known = Store(f"sqlite:///{path}"), SpaceHistory()

    def both():
        with store.session() as s:
            return known.read(s, "smoke", "v4_tiny", "interpreter"), queries.history(
                s, "smoke", "v4_tiny", "interpreter"
            )

    ours, whole = both()
    assert ours == whole and len(whole) == 8
    con = sqlite3.connect(path)
    with con:  # a finalist statistic for an old trial (its ratio changes), and a trial recorded since
        old = con.execute("SELECT trial_id FROM tuner_statistics WHERE phase = 'screen' ORDER BY id LIMIT 1").fetchone()
        con.execute("DELETE FROM tuner_statistics WHERE trial_id = ? AND phase = 'finalist'", old)
        columns = [
            r[1] for r in con.execute("PRAGMA table_info(tuner_statistics)") if r[1] not in ("id", "phase", "ratio")
        ]
        con.execute(
            f"INSERT INTO tuner_statistics (phase, ratio, {', '.join(columns)}) SELECT 'finalist', 0.5, "
            f"{', '.join(columns)} FROM tuner_statistics WHERE trial_id = ? AND phase = 'screen'",
            old,
        )
        columns = [r[1] for r in con.execute("PRAGMA table_info(tuner_trials)") if r[1] not in ("id", "config_key")]
        con.execute(
            f"INSERT INTO tuner_trials (config_key, {', '.join(columns)}) SELECT 'T64-w4-s1-c4', {', '.join(columns)} "
            "FROM tuner_trials ORDER BY id LIMIT 1"
        )
    con.close()
    ours, whole = both()
    assert ours == whole and len(whole) == 9
    assert next(r for r in whole if r.trial_id == old[0]).ratio == 0.5
