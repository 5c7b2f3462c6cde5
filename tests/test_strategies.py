"""The search strategies (tuner/strategies): what they propose, when they stop, and the study around them.

Synthetic landscapes with a known best stand in for a GPU: each candidate's log ratio is a smooth
function of its parameters and the concurrency, with a sharp optimum the model has to find.
"""

from __future__ import annotations

import itertools
import json
import math
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kernels.config import KernelConfig
from kernels.workload import Workload
from tuner import strategies
from tuner.strategies import Level
from tuner.strategies import surrogate

ROOT = Path(__file__).resolve().parent.parent
WL = Workload("fp8_model1", 16, 512)
VALUES = {"BLOCK_T": [16, 32, 64], "num_warps": [2, 4, 8], "num_stages": [1, 2, 3], "TARGET_CTAS": [128, 256, 512]}


def _candidates() -> list[KernelConfig]:
    names = list(VALUES)
    return [KernelConfig(**dict(zip(names, v, strict=True))) for v in itertools.product(*VALUES.values())]


def _neighbours(cands):
    out = {}
    for c in cands:
        near = []
        for name, vals in VALUES.items():
            i = vals.index(getattr(c, name))
            near += [c.replace(**{name: vals[j]}) for j in (i - 1, i + 1) if 0 <= j < len(vals)]
        out[c] = near
    return out


def _landscape(cfg: KernelConfig, c: int, best: KernelConfig) -> float:
    """A smooth bowl around ``best`` (its optimum moves with C through TARGET_CTAS), 30 % deep at its centre."""
    d = sum((math.log2(getattr(cfg, n)) - math.log2(getattr(best, n))) ** 2 for n in VALUES)
    return 0.05 * d - 0.3 * math.exp(-2 * d) + 0.01 * math.log2(c)


def _search(strategy, levels, best_at, noise=0.002, seed=0):
    """Drive ``strategy`` over ``levels`` as a study would: propose, measure (with noise), until it stops."""
    rng = np.random.default_rng(seed)
    cands = _candidates()
    rows, out = [], {}
    for c in levels:
        lvl = Level(c, WL, cands, band=0.01, baseline=cands[0], neighbours=_neighbours(cands))
        proposed = []
        while True:
            strategy.history(rows + [(c, k, y, None) for k, y in lvl.measured.items()])
            if strategy.stop_reason(lvl) is not None:
                break
            picks = strategy.propose(lvl, 1)
            assert picks, "a strategy that does not stop must propose"
            for p in picks:
                assert p in cands and p not in lvl.measured and p not in lvl.pending, p
                assert p not in proposed
                proposed.append(p)
                lvl.measured[p] = _landscape(p, c, best_at(c)) + rng.normal(0, noise)
        rows += [(c, k, y, None) for k, y in lvl.measured.items()]
        out[c] = (lvl, strategy.stop_reason(lvl))
    return out


@pytest.mark.parametrize("name", strategies.NAMES)
def test_a_strategy_proposes_only_open_candidates_once(name):
    """No infeasible config (outside the candidates), no twin of a measured launch, nothing twice."""
    strategy = strategies.make(name, seed=3)
    best = KernelConfig(BLOCK_T=32, num_warps=4, num_stages=1, TARGET_CTAS=256)
    result = _search(strategy, [8], lambda c: best)
    lvl, why = result[8]
    assert why is not None
    assert len(set(lvl.measured)) == len(lvl.measured)


def test_the_grid_measures_every_candidate_and_says_so():
    result = _search(strategies.make("grid"), [4], lambda c: KernelConfig())
    lvl, why = result[4]
    assert set(lvl.measured) == set(lvl.candidates)
    assert why == f"every one of the {len(lvl.candidates)} distinct feasible launches measured"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_surrogate_finds_a_known_best_measuring_a_part(seed):
    """Synthetic timers with a known best whose place moves with C: found at every level, with far fewer
    measurements than the grid."""

    def best_at(c):
        return KernelConfig(BLOCK_T=32, num_warps=4, num_stages=1, TARGET_CTAS=128 if c < 32 else 512)

    result = _search(strategies.make("surrogate", seed=seed), [1, 8, 32, 96], best_at, seed=seed)
    measured = sum(len(lvl.measured) for lvl, _ in result.values())
    total = sum(len(lvl.candidates) for lvl, _ in result.values())
    for c, (lvl, why) in result.items():
        assert lvl.best()[0] == best_at(c), (c, lvl.best())
        assert why.startswith("P(an unmeasured launch beats the best by > band)")
    assert measured < 0.6 * total


def test_the_stop_rule_waits_for_the_minimum_and_the_incumbents_neighbours():
    s = strategies.make("surrogate", seed=0)
    cands = _candidates()
    best = cands[13]
    lvl = Level(8, WL, cands, band=0.01, baseline=cands[0], neighbours=_neighbours(cands))
    for cfg in cands[: surrogate.MIN_HERE - 1]:
        lvl.measured[cfg] = _landscape(cfg, 8, best)
    s.history([(8, k, y, None) for k, y in lvl.measured.items()])
    assert s.stop_reason(lvl) is None  # fewer than MIN_HERE measured
    lvl.measured[best] = _landscape(best, 8, best)
    s.history([(8, k, y, None) for k, y in lvl.measured.items()])
    assert s.stop_reason(lvl) is None  # the best's neighbours are not all measured yet
    assert set(s.propose(lvl, 1)) <= set(lvl.neighbours[best])


def test_the_stop_rule_reports_the_probability_it_stopped_at():
    """The reason names P, below the threshold, and the launches measured; a threshold of 0 never stops early."""
    best = KernelConfig(BLOCK_T=32, num_warps=4, num_stages=1, TARGET_CTAS=256)
    s = strategies.make("surrogate", seed=0)
    lvl, why = _search(s, [16], lambda c: best)[16]
    p = float(why.split("= ")[1].split("%")[0]) / 100
    assert p < surrogate.STOP_P and p == pytest.approx(s.last_p, abs=5e-4)
    assert f"{len(lvl.measured)} of {len(lvl.candidates)} launches measured" in why
    never = surrogate.Surrogate(seed=0, stop_p=0.0)
    lvl, why = _search(never, [16], lambda c: best)[16]
    assert set(lvl.measured) == set(lvl.candidates) and why.startswith("every one of")


def test_several_workers_get_different_proposals():
    """With launches pending (other workers), the kriging believer spreads the proposals out."""
    s = strategies.make("surrogate", seed=0)
    cands = _candidates()
    best = cands[13]
    lvl = Level(8, WL, cands, band=0.01, baseline=cands[0], neighbours={})
    for cfg in cands[::3]:
        lvl.measured[cfg] = _landscape(cfg, 8, best)
    s.history([(8, k, y, None) for k, y in lvl.measured.items()])
    batch = s.propose(lvl, 4)
    assert len(batch) == 4 and len(set(batch)) == 4
    lvl.pending = set(batch)
    again = s.propose(lvl, 2)
    assert not set(again) & set(batch)


def test_a_prior_that_predicts_well_enters_and_one_that_does_not_is_ignored():
    s = surrogate.Surrogate(seed=0)
    cands = _candidates()
    best = cands[13]
    own = [(8, c, _landscape(c, 8, best), None) for c in cands[:10]]
    good = [(8, c, _landscape(c, 8, best) + 0.1, ("k1", "dev")) for c in cands]
    bad = [(8, c, -_landscape(c, 8, best), ("k2", "dev")) for c in cands]
    s.history(own + good + bad)
    rho = s._prior_rho([(c, k, y) for c, k, y, _ in own])
    assert rho[("k1", "dev")] > 0.9 and rho[("k2", "dev")] == 0.0


def test_an_unknown_strategy_is_refused_by_name():
    with pytest.raises(ValueError, match="allowed: grid, tpe, surrogate"):
        strategies.make("random")


# --- the study around the strategy, by replay -----------------------------------------------------

SMOKE = str(ROOT / "search_spaces" / "smoke.yaml")


def _tuner(*args):
    return subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True, cwd=ROOT)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A smoke search under the interpreter: the database the replay tests draw from."""
    path = tmp_path_factory.mktemp("recorded") / "tuner.db"
    proc = _tuner("search", SMOKE, "--db", f"sqlite:///{path}", "-q")
    assert proc.returncode == 0, proc.stderr
    assert "why each level stopped:" in proc.stdout
    return path


def _samples(db: Path) -> list:
    con = sqlite3.connect(db)
    try:
        return con.execute(
            "SELECT t.concurrency, t.config_key, x.phase, x.round, x.candidate_us, x.baseline_us FROM tuner_samples x "
            "JOIN tuner_trials t ON t.id = x.trial_id ORDER BY 1, 2, 3, 4"
        ).fetchall()
    finally:
        con.close()


def test_a_seeded_replay_repeats_and_another_seed_differs(recorded, tmp_path):
    runs = {}
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        db = tmp_path / f"{name}.db"
        proc = _tuner(
            "search", SMOKE, "--backend", "replay", "--replay-db", f"sqlite:///{recorded}", "--seed", str(seed),
            "--db", f"sqlite:///{db}", "-q",
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        runs[name] = _samples(db)
    assert runs["a"] == runs["b"]
    assert runs["a"] != runs["c"]


def test_replay_of_an_unknown_kernel_is_one_sentence(recorded, tmp_path):
    proc = _tuner(
        "search", SMOKE, "--backend", "replay", "--replay-db", f"sqlite:///{recorded}", "--replay-kernel", "0" * 12,
        "--db", f"sqlite:///{tmp_path / 'x.db'}", "-q",
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--replay-kernel '000000000000' is not in the replay database" in proc.stderr


def test_optuna_values_are_the_ratio_times_this_studys_own_baseline(recorded):
    """Every value Optuna holds is the trial's ratio times ``reference_us``, and ``reference_us`` is the median of
    the baseline as this study's own baseline trial measured it (never another kernel's A/A), so the values
    optuna-dashboard plots are µs within noise of what each trial measured."""
    import optuna

    url = f"sqlite:///{recorded}"
    con = sqlite3.connect(recorded)
    try:
        for name in optuna.study.get_all_study_names(storage=url):
            study = optuna.load_study(study_name=name, storage=url)
            base = [
                b
                for (b,) in con.execute(
                    "SELECT x.baseline_us FROM tuner_samples x JOIN tuner_trials t ON t.id = x.trial_id "
                    "WHERE t.is_baseline AND t.optuna_study = ? AND x.phase = 'screen'",
                    (name,),
                )
            ]
            assert base, name
            assert study.user_attrs["reference_us"] == pytest.approx(float(np.median(base)), rel=1e-9)
            done = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
            assert done
            for t in done:
                assert t.value == pytest.approx(t.user_attrs["ratio"] * study.user_attrs["reference_us"], rel=1e-9)
    finally:
        con.close()


def test_a_calibration_of_another_kernel_is_not_a_studys_aa(tmp_path):
    """A stored calibration informs the band only if its kernel hash matches."""
    from db import queries
    from db import record
    from db.store import Store

    store = Store(f"sqlite:///{tmp_path / 'cal.db'}")
    info = {
        "backend": "cuda", "gpu_name": "NVIDIA H200", "compute_capability": "9.0", "sm_count": 132, "driver": "x",
        "cuda": "x", "torch": "x", "triton": "3.6.0", "host": "h",
    }  # fmt: skip
    with store.session() as s:
        env = queries.ensure_environment(s, info)
        wl = queries.ensure_workload(
            s, name="w", kv_format="fp8_model1", heads=16, tp=4, topk=512, page_size=64, context=8192, d_qk=576, d_v=512
        )
        old, new = queries.ensure_kernel(s, "aaaaaaaaaaaa"), queries.ensure_kernel(s, "bbbbbbbbbbbb")
        s.flush()
        fields = dict(
            environment_id=env.id, workload_id=wl.id, concurrency=96, backend="cuda", config_key="T16-w4-s2-c256",
            pairs=30, rounds=10, spread=0.002, min_effect=0.01, band=0.01, mde=0.01, false_rate=0.0, multimodal=False,
        )  # fmt: skip
        record.add_calibration(s, [[87.0, 87.1]] * 30, kernel_id=old.id, **fields)
        s.flush()
        assert queries.latest_calibration(s, env.id, wl.id, 96, "cuda", kernel_id=new.id) is None
        assert queries.latest_calibration(s, env.id, wl.id, 96, "cuda", kernel_id=old.id) is not None
        mine = record.add_calibration(s, [[57.0, 57.1]] * 30, kernel_id=new.id, **fields)
        s.flush()
        assert queries.latest_calibration(s, env.id, wl.id, 96, "cuda", kernel_id=new.id).id == mine.id


def test_the_space_files_sampler_is_honoured_and_the_flag_overrides_it(recorded, tmp_path):
    text = Path(SMOKE).read_text()
    assert "name: surrogate" in text
    grid = tmp_path / "grid.yaml"
    grid.write_text(text.replace("name: surrogate", "name: grid"))
    for path, flag, want in ((grid, [], "grid"), (grid, ["--sampler", "tpe"], "tpe"), (Path(SMOKE), [], "surrogate")):
        db = tmp_path / f"{want}-{len(flag)}.db"
        proc = _tuner(
            "search", str(path), "--backend", "replay", "--replay-db", f"sqlite:///{recorded}", *flag,
            "--db", f"sqlite:///{db}", "-q", "--concurrency", "1", "-f", "json",
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        (row,) = json.loads(proc.stdout)
        assert row["strategy"] == want and row["stopped"]
