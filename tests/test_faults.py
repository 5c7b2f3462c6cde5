"""Faults: ``tuner search`` killed with SIGKILL and resumed, again and again, in every phase.

The searches replay a small recorded database (tests/recorded.py) with Optuna's queue in the results database
(``--replay-queue database``, as a GPU search keeps it), so a run is deterministic under ``--seed`` and takes
about a second. tests/kill_search.py runs them and kills each at a chosen moment. Against SQLite and, when
``TUNER_TEST_PG`` names a server, PostgreSQL.
"""

import json
import os
import random
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine
from sqlalchemy import text

from sparse_mla_tuner.tuner.cli import cli
from tests.conftest import PG
from tests.conftest import _pg_database
from tests.recorded import LEVELS
from tests.recorded import SMALL_SPACE
from tests.recorded import make_recorded

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("compile", "aa", "screen", "finalist")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """The recorded database the searches replay, and the space they search."""
    folder = tmp_path_factory.mktemp("recorded")
    (folder / "small.yaml").write_text(SMALL_SPACE)
    return make_recorded(folder / "recorded.db"), folder / "small.yaml"


@pytest.fixture(scope="module")
def whole() -> dict:
    """The uninterrupted run on SQLite that the killed runs of either backend are compared with: made once, with the
    first backend's plans (:func:`killed`), and kept here for the other's."""
    return {}


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def killed(recorded, whole, request, tmp_path_factory):
    """The kill plans of the tests below on one database backend, run by one tests/kill_search.py process (one
    import): ``whole``, one uninterrupted run on SQLite, which the others are compared with (run once, with the
    first backend's plans); ``finalist``, killed in a finalist's rounds and resumed; ``random``, killed at random
    moments (:func:`_plan`) and resumed after each; ``resume``, killed before the second level's A/A, resumed, then
    run again. Each is ``(url, results)``."""
    folder = tmp_path_factory.mktemp(f"killed-{request.param}")
    dbs = []
    if request.param == "postgresql":
        if not PG:
            pytest.skip("TUNER_TEST_PG is not set (CI starts a PostgreSQL server and sets it)")
        dbs = [_pg_database() for _ in range(3)]
        urls = [next(db) for db in dbs]
    else:
        urls = [f"sqlite:///{folder / f'{name}.db'}" for name in ("finalist", "random", "resume")]
    plans = {
        "finalist": (urls[0], [{"phase": "finalist", "k": 1, "where": "before"}, None]),
        "random": (urls[1], _plan(random.Random(7))),
        "resume": (urls[2], [{"phase": "aa", "k": 2, "where": "before"}, None, None]),
    }
    if not whole:
        plans = {"whole": (f"sqlite:///{folder / 'whole.db'}", [None]), **plans}
    results = iter(_runs(recorded, folder, list(plans.values())))
    ran = {name: (url, [next(results) for _ in runs]) for name, (url, runs) in plans.items()}
    whole.setdefault("whole", ran.pop("whole", None))
    yield {"whole": whole["whole"], **ran}
    for db in dbs:  # drop the PostgreSQL databases
        next(db, None)


def _argv(recorded, url, seed=1):
    db, space = recorded
    return [
        "search", str(space), "--backend", "replay", "--replay-db", f"sqlite:///{db}", "--replay-queue", "database",
        "--seed", str(seed), "--db", url, "-q",
    ]  # fmt: skip


def _runs(recorded, folder, plans, seed=1):
    """Run tests/kill_search.py's plans, ``[(url, runs), ...]``, one after another in one process (one import):
    one `tuner search` per entry of ``runs``, each killed as it says. Their results, in order."""
    marker = str(folder / "killed.json")
    given = [{"argv": _argv(recorded, url, seed), "url": url, "marker": marker, "runs": runs} for url, runs in plans]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "kill_search.py")],
        input=json.dumps({"plans": given}), capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800,
    )  # fmt: skip  # the limit only guards against a hang: a loaded machine is slow, never wrong
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines()]


def _by_trial(samples) -> dict:
    """Samples grouped by (study, config, phase): one trial's rounds of one phase."""
    out = defaultdict(list)
    for study, key, phase, *rest in samples:
        out[(study, key, phase)].append(tuple(rest))
    return dict(out)


def _check_database(url) -> None:
    """No config recorded twice in a study, no launch measured twice, no Optuna trial left running or queued."""
    eng = create_engine(url)
    try:
        with eng.connect() as con:
            twice = con.execute(
                text("SELECT study_id, config_key FROM tuner_trials GROUP BY 1, 2 HAVING COUNT(*) > 1")
            ).all()
            assert twice == []
            relaunched = con.execute(
                text(
                    "SELECT study_id, launch_key FROM tuner_trials WHERE launch_key IS NOT NULL AND "
                    "verdict != 'duplicate' GROUP BY 1, 2 HAVING COUNT(*) > 1"
                )
            ).all()
            assert relaunched == []
            states = dict(con.execute(text("SELECT state, COUNT(*) FROM trials GROUP BY 1")).all())
            assert states.get("RUNNING", 0) == 0 and states.get("WAITING", 0) == 0, states
    finally:
        eng.dispose()


def _picks(url) -> dict:
    """`tuner best` at every level: the config picked per level."""
    out = {}
    for c in LEVELS:
        result = CliRunner().invoke(cli, ["best", "--concurrency", str(c), "-f", "json", "--db", url])
        assert result.exit_code == 0, result.output
        out[c] = [row["config"] for row in json.loads(result.stdout)]
    return out


def _optuna_view(url) -> dict:
    """Per Optuna study: its reference (the baseline's median), its best trial's config and value, and whether
    every ok trial of the tuner's tables was told to Optuna."""
    import optuna

    eng = create_engine(url)
    try:
        with eng.connect() as con:
            ok = set(con.execute(text("SELECT optuna_study, id FROM tuner_trials WHERE verdict = 'ok'")).all())
    finally:
        eng.dispose()
    out = {}
    for name in optuna.study.get_all_study_names(storage=url):
        study = optuna.load_study(study_name=name, storage=url)
        complete = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
        told = {(name, t.user_attrs["tuner_trial_id"]) for t in complete}
        best = study.best_trial
        out[name] = (
            study.user_attrs["reference_us"],
            best.params,
            round(best.value, 9),
            told == {x for x in ok if x[0] == name},
        )
    return out


def test_a_kill_in_the_finalist_rounds_leaves_no_running_trial_after_the_resume(killed):
    """Killed while re-measuring a finalist, a search leaves its trial running in Optuna's table (recorded in the
    tuner's, Optuna not told). The resume fails it at once (its process is gone), tells Optuna the result
    with the finalist rounds the killed run did not finish, and ends with nothing running."""
    db_url, (cut_run, resumed) = killed["finalist"]
    assert cut_run["rc"] == -9 and cut_run["killed"]["phase"] == "finalist"
    assert cut_run["states"].get("RUNNING") == 1  # the trial whose finalist rounds were cut
    assert resumed["rc"] == 0
    _check_database(db_url)
    assert all(v[3] for v in _optuna_view(db_url).values())  # every ok trial told to Optuna
    (cut,) = {tuple(r[:2]) for r in cut_run["samples"]}  # the one config screened before the kill: the baseline
    assert (*cut, "finalist") in _by_trial(resumed["samples"])  # its finalist rounds, measured by the resume


def _plan(rng: random.Random) -> list:
    """At least 10 kills in the search's order of phases, at moments drawn by ``rng``, then a run to the end.

    A killed run resumes in the next one, which is killed at the K-th moment of its phase counted from its own
    start; every phase has that many moments left at that point of the search, so every kill lands."""
    kills = [("compile", 1)]
    for _ in LEVELS:
        kills += [("aa", 1), ("screen", 1), ("finalist", 1)]  # the baseline is measured first, then its finalist
        kills += [(rng.choice(["screen", "finalist"]), 1), ("screen", rng.choice([1, 2]))]
    kills.insert(rng.randrange(2, len(kills)), ("compile", 1))
    return [{"phase": p, "k": k, "where": rng.choice(["before", "after"])} for p, k in kills] + [None]


def test_searches_killed_at_random_moments_resume_to_the_picks_of_an_uninterrupted_run(killed):
    """``tuner search`` killed with SIGKILL at least 10 times across the compile check, the A/A, screening and
    the finalists, and resumed after each kill. Every trial recorded before a kill keeps its samples, no config
    is measured twice, nothing is left running, and the picks are those of one uninterrupted run."""
    plan = _plan(random.Random(7))  # the fixture's plan
    whole_url, (whole,) = killed["whole"]
    db_url, runs = killed["random"]
    assert whole["rc"] == 0 and len(runs) == len(plan)
    killed = [r["killed"] for r in runs[:-1]]
    for want, run in zip(plan[:-1], runs[:-1], strict=True):
        assert run["rc"] == -9 and run["killed"] is not None and run["killed"]["phase"] == want["phase"], run
    assert len(killed) >= 10 and {k["phase"] for k in killed} == set(PHASES)
    assert {k["level"] for k in killed if k["phase"] != "compile"} == set(LEVELS)  # kills at both levels
    assert runs[-1]["rc"] == 0 and runs[-1]["killed"] is None
    final = _by_trial(runs[-1]["samples"])
    for run in runs[:-1]:  # what was recorded before each kill is unchanged after every resume
        for key, rows in _by_trial(run["samples"]).items():
            assert final.get(key) == rows, key
    _check_database(db_url)
    assert _picks(db_url) == _picks(whole_url)
    view = _optuna_view(db_url)  # Optuna holds what an uninterrupted run's Optuna holds
    assert view == _optuna_view(whole_url) and all(v[3] for v in view.values()), view
    screened = {k[:2]: v for k, v in final.items() if k[2] == "screen"}  # the same replayed rounds per config
    assert screened == {k[:2]: v for k, v in _by_trial(whole["samples"]).items() if k[2] == "screen"}


def _level_samples(samples, level: int) -> list:
    return [r for r in samples if f"/C{level}/" in r[0]]


def _launches(url) -> dict:
    """Distinct launches measured per level."""
    eng = create_engine(url)
    try:
        with eng.connect() as con:
            rows = con.execute(
                text(
                    "SELECT concurrency, COUNT(*) FROM tuner_trials WHERE verdict NOT IN ('infeasible', 'duplicate') "
                    "GROUP BY 1"
                )
            ).all()
        return dict(rows)
    finally:
        eng.dispose()


def test_a_resume_and_a_rerun_measure_nothing_at_finished_levels(killed):
    """Killed before the second level's A/A, the search has finished the first level; the resume measures nothing
    there, and a plain re-run of the finished search measures nothing at all (no sample, no Optuna trial). The
    picks and launch counts are those of one uninterrupted run."""
    first, second = LEVELS
    whole_url, (whole,) = killed["whole"]
    db_url, (cut, resumed, rerun) = killed["resume"]
    assert whole["rc"] == 0
    assert cut["rc"] == -9 and cut["killed"]["level"] == second
    assert _level_samples(cut["samples"], first)  # the first level was measured before the kill
    assert _level_samples(resumed["samples"], first) == _level_samples(cut["samples"], first)
    assert rerun["rc"] == 0 and rerun["samples"] == resumed["samples"] and rerun["states"] == resumed["states"]
    _check_database(db_url)
    assert _picks(db_url) == _picks(whole_url)
    assert _launches(db_url) == _launches(whole_url)


def test_a_larger_n_trials_continues_a_finished_level_and_redo_searches_it_again(recorded, db_url):
    """--n-trials N finishes each level at N launches; the same N again measures nothing, a larger one continues
    each level up to it; --redo searches finished levels again from their measurements."""

    def run(*extra):
        result = CliRunner().invoke(cli, [*_argv(recorded, db_url), *extra])
        assert result.exit_code == 0, result.output
        return _launches(db_url)

    assert run("--n-trials", "3") == dict.fromkeys(LEVELS, 3)
    assert run("--n-trials", "3") == dict.fromkeys(LEVELS, 3)
    assert run() == dict.fromkeys(LEVELS, 3)  # no --n-trials: finished, nothing more
    more = run("--n-trials", "5")  # up to 5 (a level with 4 launches measures all 4)
    assert all(3 < more[c] <= 5 for c in LEVELS) and max(more.values()) == 5
    again = run("--redo")
    assert all(again[c] >= more[c] for c in LEVELS)
    _check_database(db_url)


def test_a_finished_replay_with_its_queue_in_memory_measures_nothing_when_run_again(recorded, db_url):
    """With the replay's default ``--replay-queue memory`` Optuna's study lives only for the run, so a level's
    finished state lives in the tuner's own table (``tuner_studies.stopped``, with the ``--n-trials`` cap it finished
    under): a second run of the finished search measures nothing (no trial, no sample) and prints each level's stored
    reason; a larger ``--n-trials`` continues each level, as with Optuna's queue in the database."""
    argv = [a for a in _argv(recorded, db_url) if a not in ("--replay-queue", "database")]

    def run(*extra):
        result = CliRunner().invoke(cli, [*argv, "-f", "json", *extra])
        assert result.exit_code == 0, result.output
        return _launches(db_url), _count(db_url, "tuner_samples"), json.loads(result.stdout)

    launches, samples, _ = run("--n-trials", "3")
    assert launches == dict.fromkeys(LEVELS, 3) and samples
    assert run()[:2] == (launches, samples)  # no --n-trials: finished under the cap of 3, nothing more
    stopped = _stopped(db_url)
    assert all(why.startswith("--n-trials 3 reached") for why in stopped.values()) and set(stopped) == set(LEVELS)
    assert {r["C"]: r["stopped"] for r in run()[2]} == stopped
    more, _, _ = run("--n-trials", "5")
    assert all(3 < more[c] <= 5 for c in LEVELS)


def _count(url, table: str) -> int:
    eng = create_engine(url)
    try:
        with eng.connect() as con:
            return con.execute(text(f"SELECT COUNT(*) FROM {table}")).scalar()
    finally:
        eng.dispose()


def _stopped(url) -> dict:
    """Why each level stopped, as the tuner's own table keeps it."""
    eng = create_engine(url)
    try:
        with eng.connect() as con:
            return dict(con.execute(text("SELECT concurrency, stopped FROM tuner_studies")).all())
    finally:
        eng.dispose()


def test_every_config_has_at_most_one_complete_optuna_trial(killed):
    """A finalist's rounds update its config's Optuna trial instead of adding one: each config has at most one
    COMPLETE trial per study, and Optuna's best is the tuner's best: in an uninterrupted run, and in a run
    resumed after every kill."""
    for name in ("whole", "random"):
        db_url, runs = killed[name]
        assert runs[-1]["rc"] == 0
        _one_complete_trial_per_config(db_url)


def _one_complete_trial_per_config(db_url) -> None:
    import optuna

    picks = _picks(db_url)
    for name in optuna.study.get_all_study_names(storage=db_url):
        study = optuna.load_study(study_name=name, storage=db_url)
        complete = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
        keys = [tuple(sorted(t.params.items())) for t in complete]
        assert len(keys) == len(set(keys)), name
        assert study.best_trial.user_attrs["phase"] == "finalist"
        best = study.best_trial.user_attrs["tuner_trial_id"]
        assert any(best == t.user_attrs["tuner_trial_id"] for t in complete)
    assert all(picks.values())


def test_the_summary_says_where_the_time_went(recorded, tmp_path):
    """Each level's row carries its time split (compile, GPU, model, database, other) in seconds, which add up
    to its wall time; the table ends with the split per level and in total. On SQLite: the split is the search's
    own clock, the same whatever database it writes to."""
    db_url = f"sqlite:///{tmp_path / 'summary.db'}"
    result = CliRunner().invoke(cli, [*_argv(recorded, db_url), "-f", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    kinds = ("compile_s", "gpu_s", "model_s", "database_s", "other_s")
    for row in rows:
        assert all(row[k] >= 0 for k in kinds) and row["wall_s"] > 0
        assert sum(row[k] for k in kinds) == pytest.approx(row["wall_s"], abs=0.01)
        assert row["gpu_s"] > 0  # the replayed measurements
    table = CliRunner().invoke(cli, _argv(recorded, db_url))
    assert table.exit_code == 0, table.output
    assert "where the time went" in table.stdout and "total:" in table.stdout
