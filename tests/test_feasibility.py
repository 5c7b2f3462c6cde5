"""Compile-only feasibility for the target arch (real cross-compiles of the real kernel, no GPU)."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparse_mla_tuner.kernels import KernelConfig
from sparse_mla_tuner.kernels import Workload
from sparse_mla_tuner.tuner.adapters.sparse_mla.adapter import estimate_shared
from sparse_mla_tuner.tuner.feasibility import check
from sparse_mla_tuner.tuner.feasibility import check_many
from sparse_mla_tuner.tuner.space import load_space

V4 = Workload("fp8_model1", heads=16, topk=512, page_size=64, context=8192)
V32 = Workload("fp8_v32", heads=16, topk=2048, page_size=64, context=8192)


@pytest.fixture(scope="module", autouse=True)
def shared_cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("TRITON_CACHE_DIR", str(tmp_path_factory.mktemp("triton-cache")))  # really cold compiles
    yield
    mp.undo()


# The configs the tests below check in full (registers too), each compiled once: T32-w4-s2 for the fit, T16 at one
# and two stages for the stage's bytes, two more for the shared-only comparison; V3.2's TARGET_CTAS and spill checks.
FULL = {
    (V4, "sm_120"): ("T32-w4-s2-c256", "T16-w4-s1-c256", "T16-w4-s2-c256", "T64-w4-s1-c256-p1", "T16-w8-s2-c256-b1"),
    (V4, "sm_90"): ("T32-w4-s2-c256",),
    (V32, "sm_120"): ("T16-w4-s2-c128", "T64-w2-s2-c256"),
}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A results database: the feasibility verdicts are cached there. The configs of :data:`FULL` are compiled
    into it at once (one compile process per workload and target, its jobs in parallel), so the tests read
    their verdicts from it, as a search reads those of an earlier check."""
    from sparse_mla_tuner.db.store import Store

    store = Store(f"sqlite:///{tmp_path_factory.mktemp('verdicts') / 'tuner.db'}")
    for (wl, target), keys in FULL.items():
        check_many([KernelConfig.parse(k) for k in keys], wl, target, store=store)
    return store


@pytest.mark.parametrize("space", ["search_spaces/v4_flash_tp4.yaml", "search_spaces/v32_tp8.yaml"])
def test_estimate_tracks_the_compiled_value(space, store):
    """Within 2 % for 4 and 8 warps; 2 warps drift (register-starved, ptxas and the pipeliner choose
    other layouts) and are only required to be within a factor of two (checked on V4 at 1 stage).
    Every tile size runs at 4 warps and the other widths at BLOCK_T 32: the estimate's terms do not
    depend on the width, so this keeps the check to 27 cold compiles (the balanced deal at one staged shape).
    The compiles stop after Triton's shared-memory allocation (``registers=False``): the estimate is checked
    against ``shared`` alone, which is the full compile's own number (the shared-only test below), without ptxas."""
    sp = load_space(space)
    wl = sp.workloads[0].workload()
    # one launch setting; stages 1 and 2 (3 and 4 stage no more, see estimate_shared): every term of the estimate
    v4 = sp.workloads[0].kv_format == "fp8_model1"
    stages, warps = ((1, 2), (2, 4, 8)) if v4 else ((1, 2), (4, 8))  # V3.2's 2 warps: as V4's
    configs = [
        c
        for c in sp.configs()
        if c.TARGET_CTAS == sp.baseline.TARGET_CTAS
        and c.num_stages in stages
        and c.num_warps in warps
        and (c.num_warps > 2 or c.num_stages == 1)
        and (c.num_warps == 4 or c.BLOCK_T == 32)  # every tile size at 4 warps; the other widths at one size
        and (c.PREFETCH == 0 or c.num_warps == 4)  # the prefetch's terms: three tile sizes at one width
        and (c.PREFETCH != 2 or c.BLOCK_T == 32)  # the index prefetch stages what PREFETCH=0 stages: one size
        and (c.PREFETCH != 3 or c.BLOCK_T == 32)  # the deeper prefetch, what PREFETCH=1 stages: one size
        and (
            c.BALANCED == 0 or (c.BLOCK_T == 32 and c.num_warps == 4 and c.num_stages == 2)
        )  # so does the balanced deal
    ]
    worst = {}
    for cfg, v in zip(configs, check_many(configs, wl, sp.target, store=store, registers=False), strict=True):
        assert v.estimate_bytes == estimate_shared(cfg, wl)
        err = abs(v.estimate_bytes - v.shared_bytes) / v.shared_bytes
        key = "w2" if cfg.num_warps == 2 else "w4+"
        worst[key] = max(worst.get(key, 0.0), err)
    assert worst["w4+"] <= 0.02, worst
    assert worst.get("w2", 0.0) <= 1.0, worst


def test_fits_sm90_but_not_sm120_with_the_numbers(store):
    cfg = KernelConfig(BLOCK_T=32, num_warps=4, num_stages=2, TARGET_CTAS=256)
    on_90 = check(cfg, V4, "sm_90", store=store)
    on_120 = check(cfg, V4, "sm_120", store=store)
    assert on_90.feasible and on_90.limit_bytes == 232_448
    assert not on_120.feasible and on_120.limit_bytes == 101_376
    assert 101_376 < on_120.shared_bytes < 232_448
    n = f"{on_120.shared_bytes:,}".replace(",", " ")
    assert re.fullmatch(rf"shared {n} B > sm_120 limit 101 376 B", on_120.reason), on_120.reason
    assert on_120.registers > 0


def test_num_stages_is_a_real_lever_on_shared_memory(store):
    one, two = (check(KernelConfig(16, 4, s, 256), V4, "sm_120", store=store) for s in (1, 2))
    # the second stage keeps one more gathered tile in flight: 16 tokens x (512 + 128 + 4) bytes
    assert two.shared_bytes - one.shared_bytes == 16 * 644


def test_second_check_is_cached(tmp_path, monkeypatch, store):
    """The second check reads every verdict from the database: no compile process starts (counted, not timed:
    a busy machine is slow, never wrong, and a warm Triton cache makes a compile fast but no less counted). The
    configs are two of :data:`FULL`'s, whose kernels the module's Triton cache holds; this database has none."""
    import subprocess as sp

    from sparse_mla_tuner.db.store import Store
    from sparse_mla_tuner.tuner import feasibility

    store = Store(f"sqlite:///{tmp_path / 'verdicts.db'}")  # a new database: no verdict cached yet
    configs = [KernelConfig.parse(k) for k in FULL[(V32, "sm_120")]]
    started, popen = [], sp.Popen
    monkeypatch.setattr(feasibility.subprocess, "Popen", lambda *a, **k: started.append(a) or popen(*a, **k))
    first = check_many(configs, V32, "sm_120", store=store)
    assert len(started) == 1  # the first check compiles, in one compile process
    second = check_many(configs, V32, "sm_120", store=store)
    assert first == second and len(started) == 1  # the second compiles nothing


def test_target_ctas_does_not_recompile(store):
    a = check(KernelConfig(16, 4, 2, 128), V32, "sm_120", store=store)
    b = check(KernelConfig(16, 4, 2, 1024), V32, "sm_120", store=store)
    assert a == b


def test_max_spill_bytes_makes_spilling_configs_infeasible(store):
    cfg = KernelConfig(BLOCK_T=64, num_warps=2, num_stages=2, TARGET_CTAS=256)
    plain = check(cfg, V32, "sm_120", store=store)
    assert plain.spill_bytes > 0 and plain.feasible and "spills" in plain.reason
    strict = check(cfg, V32, "sm_120", max_spill_bytes=0, store=store)
    assert not strict.feasible and "max_spill_bytes" in strict.reason


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state, ppid, ...); None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _children(pid: int) -> list[int]:
    kids = []
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _stat(int(name))) is not None and int(st[1]) == pid:
            kids.append(int(name))
    return kids


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the compile processes' parent-death signal is Linux's"
)
def test_a_check_killed_by_sigterm_leaves_no_compile_running(tmp_path):
    """SIGTERM ends a Python process without running its exception handlers, so only the compile
    processes' own parent-death signal stops them. Before it, the orphaned compile process failed on its
    next progress line and its pool then finished every queued job: minutes for a shipped space's 126."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "triton"), TUNER_COMPILE_JOBS="2")  # a cold cache: real compiles
    cmd = [
        sys.executable,
        "-m",
        "sparse_mla_tuner.tuner",
        "check",
        "search_spaces/v4_flash_tp4.yaml",
        "--db",
        f"sqlite:///{tmp_path}/t.db",
    ]
    check_proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    # the compile process and its two workers start within a few seconds (imports); allow 30x that
    deadline, tree = time.monotonic() + 120, []
    while time.monotonic() < deadline and check_proc.poll() is None:
        tree = [(c, _children(c)) for c in _children(check_proc.pid)]
        if any(len(workers) == 2 for _, workers in tree):
            break
        time.sleep(0.05)
    assert check_proc.poll() is None, "the check ended before its compiles could be caught running"
    pids = [p for c, workers in tree for p in (c, *workers)]
    assert len(pids) == 3
    check_proc.send_signal(signal.SIGTERM)
    check_proc.wait(timeout=60)
    deadline = time.monotonic() + 30  # the signal is immediate; a compile takes seconds
    while time.monotonic() < deadline and any((st := _stat(p)) is not None and st[0] != "Z" for p in pids):
        time.sleep(0.05)
    running = [p for p in pids if (st := _stat(p)) is not None and st[0] != "Z"]
    for p in running:  # no stray compiles left behind by a failing test
        os.kill(p, signal.SIGKILL)
    assert not running, f"compile processes {running} outlived the check"


def test_a_shared_only_check_gives_the_compilers_own_shared_memory(store):
    """Stopping each compile once Triton has allocated shared memory gives the same `shared` as the full
    compile (the very attribute triton.compile reports), so the same verdict, without ptxas."""
    configs = [
        KernelConfig.parse(k) for k in ("T32-w4-s2-c256", "T16-w4-s1-c256", "T64-w4-s1-c256-p1", "T16-w8-s2-c256-b1")
    ]
    full = check_many(configs, V4, "sm_120", store=store)  # compiled in full into the store (FULL)
    fast = check_many(configs, V4, "sm_120", registers=False)  # no database: really compiled, shared only
    for cfg, f, s in zip(configs, full, fast, strict=True):
        assert (s.shared_bytes, s.feasible, s.limit_bytes) == (f.shared_bytes, f.feasible, f.limit_bytes), cfg
        assert s.registers is None and s.spill_bytes is None and f.registers > 0
    assert [v.feasible for v in fast] == [False, True, True, True]  # T32 with 2 stages does not fit sm_120
    # full numbers in the database answer a shared-only question as well (nothing compiles again)
    assert check_many(configs, V4, "sm_120", store=store, registers=False) == full
    # where spills decide (max_spill_bytes), registers=False compiles through ptxas all the same
    strict = check_many(configs[1:2], V4, "sm_120", max_spill_bytes=0, registers=False)
    assert strict[0].registers is not None and strict[0].spill_bytes is not None


COUNT_KERNELS = """
import io, json, sys
from dataclasses import asdict
from sparse_mla_tuner.kernels import KernelConfig, Workload
import sparse_mla_tuner.tuner.compile_process as cp
wl = Workload("fp8_model1", heads=16, topk=512, page_size=64, context=8192)
jobs = [{"config": KernelConfig(16, 4, s, 256).as_dict(), "workload": asdict(wl), "cc": 120} for s in (1, 2)]
calls = []
real = cp._compile_indexed
cp._compile_indexed = lambda job, i: calls.append((job["config"]["num_stages"], i)) or real(job, i)
sys.stdin = io.StringIO(json.dumps(jobs))
out, sys.stdout = sys.stdout, io.StringIO()
cp.main()
results, sys.stdout = sys.stdout.getvalue(), out
total = sum(len(cp.specs_of(j)) for j in jobs)
distinct = len({s.key() for j in jobs for s in cp.specs_of(j)})
print(json.dumps({"calls": len(calls), "total": total, "distinct": distinct, "results": json.loads(results)}))
"""


def test_the_compile_process_compiles_each_distinct_kernel_once(store):
    """Configs share kernels (the combine kernel, and variants that coincide): each distinct kernel is
    compiled once, and every config still gets its own numbers. Counted, not timed: the two configs are
    :data:`FULL`'s, whose kernels the module's Triton cache holds (a compile asked for is counted all the same)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TUNER_COMPILE_JOBS="1")
    proc = subprocess.run([sys.executable, "-c", COUNT_KERNELS], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.splitlines()[-1])
    assert got["calls"] == got["distinct"] < got["total"]
    assert len(got["results"]) == 2 and all(r["registers"] > 0 and r["shared"] > 0 for r in got["results"])


@pytest.mark.parametrize(
    ("space", "formats"),
    [("glm53_nope_tp4", ("fp8_v32_nope", None)), ("v41_flash_layer_tp4", ("fp8_v41", "fp4_v41"))],
)
def test_tuner_check_of_the_new_formats_spaces_gives_sm120_a_verdict(space, formats, tmp_path):
    """`tuner check` (compile only, the shipped space's sm_120 target) of one config of each new format's shipped
    space, its baseline: a verdict with its numbers, and a reason where it does not fit. Two configs on purpose (the
    space's baseline and its smallest tile at one stage), a few cold compiles."""
    import yaml

    from sparse_mla_tuner.tuner.space import resolve_space
    from tests.conftest import tuner_in_process as tuner

    doc = yaml.safe_load(Path(resolve_space(space)).read_text())
    assert doc["target"] == "sm_120"
    base = doc["baseline"]
    small = min(doc["parameters"]["BLOCK_T"]["choices"])
    doc["parameters"] = {
        "BLOCK_T": {"type": "categorical", "choices": sorted({base["BLOCK_T"], small})},
        "num_warps": {"type": "categorical", "choices": [base["num_warps"]]},
        "num_stages": {"type": "categorical", "choices": [1, base["num_stages"]]},
        "TARGET_CTAS": {"type": "categorical", "choices": [base["TARGET_CTAS"]]},
    }
    doc["constraints"] = [f"BLOCK_T == {base['BLOCK_T']} or num_stages == 1"]  # the baseline, and the small tile
    path = tmp_path / f"{space}.yaml"
    path.write_text(yaml.safe_dump(doc))
    proc = tuner("check", str(path), "--db", f"sqlite:///{tmp_path / 'v.db'}", "-f", "json", "-q")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert {(r["BLOCK_T"], r["num_stages"]) for r in rows} == {(base["BLOCK_T"], base["num_stages"]), (small, 1)}
    for r in rows:
        assert r["shared_bytes"] > 0
        assert abs(r["estimate_bytes"] - r["shared_bytes"]) <= 0.02 * r["shared_bytes"], r  # explains the number
        if r["feasible"]:
            assert r["shared_bytes"] <= r["limit_bytes"] == 101_376 and not r["reason"]
        else:
            assert r["reason"].startswith("shared ") and "sm_120 limit 101 376 B" in r["reason"]
    smallest = next(r for r in rows if (r["BLOCK_T"], r["num_stages"]) == (small, 1))
    assert smallest["feasible"], smallest  # the space's smallest tile at one stage fits sm_120
    w = doc["workloads"][0]
    assert (w["kv_format"], (w.get("extra") or {}).get("kv_format")) == formats
