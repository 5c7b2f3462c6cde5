"""`tuner db compact`: a superseded kernel loses its raw samples and its Optuna studies, never its trials or
statistics; the newest kernel and the kernels named to keep lose nothing; bad input is one sentence."""

import json
import shutil
import sqlite3

import optuna
import pytest
from click.testing import CliRunner

from sparse_mla_tuner.db import queries
from sparse_mla_tuner.db import record
from sparse_mla_tuner.db.models import StudyModel
from sparse_mla_tuner.db.store import Store
from sparse_mla_tuner.db.verdicts import Effect
from sparse_mla_tuner.db.verdicts import Phase
from sparse_mla_tuner.tuner.cli import cli

INFO = dict(
    backend="cuda", gpu_name="gpu", compute_capability="9.0", sm_count=132, driver="d", cuda="c", torch="t", triton="t"
)
WORKLOAD = dict(name="w", kv_format="fp8_v32", heads=16, tp=1, topk=64, page_size=64, context=256, d_qk=576, d_v=512)


def _summary(ratio: float) -> record.Summary:
    return record.Summary(
        n=10,
        median_us=20.0 * ratio,
        ci_low_us=19.0 * ratio,
        ci_high_us=21.0 * ratio,
        baseline_median_us=20.0,
        ratio=ratio,
        ratio_ci_low=ratio * 0.99,
        ratio_ci_high=ratio * 1.01,
        noise_band=0.01,
        effect=Effect.WIN if ratio < 0.99 else Effect.FLAT,
    )


def _study(s, kernel: str, concurrency: int, ratios: dict[str, float]) -> str:
    """One study of ``kernel`` with an ok trial (10 samples) per config; its name."""
    env = queries.ensure_environment(s, {**INFO, "host": "h"})
    k = queries.ensure_kernel(s, kernel)
    w = queries.ensure_workload(s, **WORKLOAD)
    sp = queries.ensure_space(s, "space", "h", "text", "p")
    name = f"space/w/C{concurrency}/gpu/cuda/k{kernel}"
    st = StudyModel(
        name=name,
        space_id=sp.id,
        workload_id=w.id,
        environment_id=env.id,
        kernel_id=k.id,
        concurrency=concurrency,
        backend="cuda",
    )
    s.add(st)
    s.flush()
    for i, (key, ratio) in enumerate(ratios.items()):
        t = record.add_trial(
            s,
            study_id=st.id,
            workload_id=w.id,
            environment_id=env.id,
            kernel_id=k.id,
            concurrency=concurrency,
            backend="cuda",
            config_key=key,
            BLOCK_T=16 * 2**i,
            num_warps=4,
            num_stages=1,
            TARGET_CTAS=64,
            num_splits=4,
            verdict="ok",
            optuna_study=name,
            is_baseline=(i == 0),
        )
        rounds = [(20.0 * ratio + 0.01 * r, 20.0 + 0.01 * r) for r in range(10)]
        record.add_samples(s, t.id, Phase.SCREEN, rounds, 1, 0, _summary(ratio))
    return name


@pytest.fixture
def three_kernels(tmp_path):
    """Kernels old, bench (named by a benchmark) and new (the newest at C=1; C=8 has only old and bench)."""
    path = tmp_path / "r.db"
    url = f"sqlite:///{path}"
    store = Store(url)
    ratios = {"T16-w4-s1-c64": 1.0, "T32-w4-s1-c64": 0.9, "T64-w4-s1-c64": 0.95}
    studies = [("old", 1, ratios), ("old", 8, ratios), ("bench", 1, ratios)]
    studies += [("bench", 8, {**ratios, "T32-w4-s1-c64": 0.97}), ("new", 1, {**ratios, "T64-w4-s1-c64": 0.8})]
    with store.session() as s:
        named = [(_study(s, *st), st[2]) for st in studies]
    store.engine.dispose()
    for name, by_config in named:  # the Optuna study of each, one trial per config
        study = optuna.create_study(study_name=name, storage=url)
        for ratio in by_config.values():
            study.tell(study.ask({"x": optuna.distributions.FloatDistribution(0, 2)}), ratio)
    return path


def _samples(path) -> dict[str, list]:
    con = sqlite3.connect(path)
    rows = con.execute(
        "SELECT k.source_hash, x.trial_id, x.phase, x.round, x.candidate_us, x.baseline_us FROM tuner_samples x "
        "JOIN tuner_trials t ON t.id = x.trial_id JOIN tuner_kernels k ON k.id = t.kernel_id ORDER BY x.id"
    ).fetchall()
    con.close()
    out: dict[str, list] = {}
    for h, *rest in rows:
        out.setdefault(h, []).append(tuple(rest))
    return out


def _counts(path, *tables) -> list[int]:
    con = sqlite3.connect(path)
    n = [con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables]
    con.close()
    return n


def _best(url, c):
    result = CliRunner().invoke(cli, ["best", "--concurrency", str(c), "-f", "json", "--db", url])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_compact_drops_only_the_samples_and_optuna_studies_of_superseded_kernels(three_kernels):
    url = f"sqlite:///{three_kernels}"
    before, best_before = _samples(three_kernels), [_best(url, c) for c in (1, 8)]
    trials_before = _counts(three_kernels, "tuner_trials", "tuner_statistics", "tuner_studies")
    result = CliRunner().invoke(cli, ["db", "compact", "--keep-kernel", "bench", "-f", "json", "--db", url])
    assert result.exit_code == 0, result.output
    rows = {r["kernel"]: r for r in json.loads(result.stdout)}
    assert rows["old"]["samples_dropped"] == 60 and rows["old"]["optuna_studies_dropped"] == 2
    assert rows["bench"]["kept"] == "all: newest, named"  # C=8's newest
    assert rows["new"]["kept"] == "all: newest" and rows["new"]["samples_dropped"] == 0
    after = _samples(three_kernels)
    assert "old" not in after and after["bench"] == before["bench"] and after["new"] == before["new"]
    assert _counts(three_kernels, "tuner_trials", "tuner_statistics", "tuner_studies") == trials_before
    assert [_best(url, c) for c in (1, 8)] == best_before
    names = {s.study_name for s in optuna.get_all_study_summaries(url)}
    assert names == {f"space/w/C{c}/gpu/cuda/k{k}" for k, c in (("bench", 1), ("bench", 8), ("new", 1))}


def test_a_dry_run_changes_nothing_and_says_the_size_after(three_kernels, tmp_path):
    shutil.copy(three_kernels, tmp_path / "before.db")
    result = CliRunner().invoke(cli, ["db", "compact", "--dry-run", "-f", "json", "--db", f"sqlite:///{three_kernels}"])
    assert result.exit_code == 0, result.output
    assert {r["kernel"]: r["samples_dropped"] for r in json.loads(result.stdout)} == {"old": 60, "bench": 0, "new": 0}
    assert "would be" in result.stderr and "dry run: nothing changed" in result.stderr
    assert three_kernels.read_bytes() == (tmp_path / "before.db").read_bytes()


def test_a_duplicate_of_a_kept_kernel_keeps_its_originals_samples(three_kernels):
    con = sqlite3.connect(three_kernels)
    old_trial = con.execute(
        "SELECT t.id FROM tuner_trials t JOIN tuner_kernels k ON k.id = t.kernel_id "
        "WHERE k.source_hash = 'old' ORDER BY t.id LIMIT 1"
    ).fetchone()[0]
    con.execute(
        "UPDATE tuner_trials SET duplicate_of = ?, verdict = 'duplicate' WHERE id = (SELECT max(id) FROM tuner_trials)",
        (old_trial,),
    )
    con.commit()
    con.close()
    result = CliRunner().invoke(cli, ["db", "compact", "--db", f"sqlite:///{three_kernels}"])
    assert result.exit_code == 0, result.output
    assert [r[0] for r in _samples(three_kernels)["old"]] == [old_trial] * 10


@pytest.mark.parametrize(
    "args, message",
    [
        (["--keep-kernel", "nope"], "--keep-kernel 'nope' is not in sqlite:///"),
        (["--db", "postgresql+psycopg://u:secret@localhost/x"], "works on SQLite files"),
        (["--db", "sqlite:///missing.db"], "no database at missing.db"),
    ],
)
def test_bad_input_is_one_sentence(three_kernels, args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = three_kernels.read_bytes()
    result = CliRunner().invoke(cli, ["db", "compact", "--db", f"sqlite:///{three_kernels}", *args])
    assert result.exit_code == 2 and message in result.stderr, result.output
    assert len(result.stderr.strip().splitlines()) == 1 and "secret" not in result.stderr
    assert three_kernels.read_bytes() == before


def test_drop_unlaunched_leaves_only_the_optuna_trials_that_launched(three_kernels):
    """Optuna's mirror of an infeasible or duplicate config goes; an ok trial, a failed launch and every row of the
    tuner's own tables stay."""
    url = f"sqlite:///{three_kernels}"
    name = "space/w/C1/gpu/cuda/knew"
    study = optuna.load_study(study_name=name, storage=url)
    dist = {"x": optuna.distributions.FloatDistribution(0, 2)}
    for verdict, state in (("infeasible", "PRUNED"), ("duplicate", "PRUNED"), ("crashed", "PRUNED"), ("ok", "OK")):
        t = study.ask(dist)
        t.set_user_attr("verdict", verdict)
        if state == "OK":
            study.tell(t, 0.5)
        else:
            study.tell(t, state=optuna.trial.TrialState.PRUNED)
    tuner_rows = _counts(three_kernels, "tuner_trials", "tuner_statistics", "tuner_samples")
    result = CliRunner().invoke(cli, ["db", "compact", "--drop-unlaunched", "-f", "json", "--db", url])
    assert result.exit_code == 0, result.output
    rows = {r["kernel"]: r for r in json.loads(result.stdout)}
    assert rows["new"]["optuna_unlaunched_dropped"] == 2 and rows["bench"]["optuna_unlaunched_dropped"] == 0
    left = [t.user_attrs.get("verdict") for t in optuna.load_study(study_name=name, storage=url).trials]
    assert left == [None, None, None, "crashed", "ok"]  # the three launched ones added first, then these
    assert _counts(three_kernels, "trial_params", "trial_user_attributes") == [3 + 3 + 5, 2]  # bench C=1, 8; new
    assert _counts(three_kernels, "tuner_trials", "tuner_statistics", "tuner_samples")[:2] == tuner_rows[:2]
