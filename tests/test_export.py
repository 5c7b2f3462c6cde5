"""Export formats and the kernel's run-time lookup of the exported tables.

The export tests read the committed H200 results (a copy, upgraded to the current schema); the
lookup tests write broken tables on purpose: every kind gives one warning and the default config.
"""

import importlib.util
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

import kernels.table as kt
from kernels import decode
from kernels import make_batch
from kernels import sparse_mla_decode
from kernels.config import DEFAULT_CONFIG
from kernels.config import KernelConfig
from kernels.workload import Workload

H200_DB = os.path.join(os.path.dirname(__file__), "..", "results", "h200.db")
ENTRY = {"BLOCK_T": 16, "num_warps": 4, "num_stages": 1, "TARGET_CTAS": 7}


def tuner(*args):
    exe = shutil.which("tuner")
    cmd = [exe] if exe else [sys.executable, "-m", "tuner"]
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def h200(tmp_path_factory):
    """A copy of the committed H200 results at the current schema (the original is never written)."""
    from db.store import Store

    path = tmp_path_factory.mktemp("h200") / "h200.db"
    shutil.copy(H200_DB, path)
    Store(f"sqlite:///{path}", upgrade=True)
    return {"url": f"sqlite:///{path}", "path": path}


def engine_loader(folder, device_name, kv_format, heads, topk, batch):
    """How an engine reads a tuned table (vLLM's fused-MoE get_moe_configs / SGLang): file name,
    json.load, nearest key. Written here from the engines' code, independent of kernels.table."""
    name = f"kv_format={kv_format},heads={heads},topk={topk},device_name={device_name.replace(' ', '_')}.json"
    with open(os.path.join(folder, name)) as f:
        configs = {int(k): v for k, v in json.load(f).items()}
    return configs[min(configs.keys(), key=lambda x: abs(x - batch))]


def _write(folder, name, content) -> None:
    path = folder / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    else:
        path.write_text(json.dumps(content))


def _lookup(folder, batch=4, **kw):
    return kt.lookup_config("dev X", "fp8_v32", 16, 64, batch, config_dir=folder, **kw)


def _table_warnings(fn):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        result = fn()
    return result, [x for x in w if issubclass(x.category, kt.TableWarning)]


# --- export ---------------------------------------------------------------------------------------


def test_engine_export_is_what_an_engine_loader_and_the_kernel_read(h200, tmp_path):
    out = tmp_path / "configs"
    proc = tuner("export", "--db", h200["url"], "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    name = "kv_format=fp8_model1,heads=16,topk=512,device_name=NVIDIA_H200"
    assert (out / f"{name}.json").is_file() and (out / f"{name}.provenance.json").is_file()
    assert len(list(out.glob("*.json"))) == 6  # three workloads, each a table and its sidecar
    table = json.loads((out / f"{name}.json").read_text())
    graph_sizes = [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96]  # the engines' CUDA-graph batch sizes
    assert sorted(map(int, table)) == graph_sizes
    side = json.loads((out / f"{name}.provenance.json").read_text())
    for c, entry in table.items():
        assert set(entry) == set(KernelConfig().as_dict())
        prov = side["entries"][c]
        assert prov["verdict"] == "ok" and str(KernelConfig.from_dict(entry)) == prov["config"]
        assert prov["ci_us"][0] <= prov["median_us"] <= prov["ci_us"][1]
    assert side["triton"] == "3.6.0" and side["kernel_hash"] and side["date"]
    for batch in (1, 3, 7, 20, 50, 70, 90, 200):
        theirs = engine_loader(out, "NVIDIA H200", "fp8_model1", 16, 512, batch)
        ours = kt.lookup_config("NVIDIA H200", "fp8_model1", 16, 512, batch, config_dir=out)
        assert KernelConfig.from_dict(theirs) == ours, batch
    # SGLang keeps the same files per Triton version
    proc = tuner("export", "--db", h200["url"], "--out", str(tmp_path / "sg"), "--format", "sglang")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "sg" / "triton_3_6_0" / f"{name}.json").read_text()) == table
    con = sqlite3.connect(h200["path"])
    rows = con.execute("SELECT path, content FROM tuner_exports").fetchall()
    con.close()
    assert any(p.endswith(f"{name}.json") and json.loads(c)["table"] == table for p, c in rows)


def test_sidecar_and_export_row_hold_no_password(h200, tmp_path):
    from db.models import ExportModel
    from db.store import Store
    from tuner.export import export_tables

    store = Store(h200["url"])
    store.url = "postgresql+psycopg://tuner:s3cr3t-pw@db-host/tuner?sslpassword=other-secret"
    paths = export_tables(store, tmp_path)
    text = "".join(p.read_text() for p in paths)
    assert "s3cr3t-pw" not in text and "other-secret" not in text
    side = json.loads(next(p for p in paths if p.name.endswith(".provenance.json")).read_text())
    assert side["source"].startswith("postgresql+psycopg://tuner:***@db-host/tuner")
    with store.session() as s:
        contents = [r.content for r in s.query(ExportModel)]
    assert contents and not any("s3cr3t-pw" in c or "other-secret" in c for c in contents)


@triton.jit  # module level: the interpreter re-reads it
def _copy_kernel(X, Y, n, BLOCK_T: tl.constexpr, PREFETCH: tl.constexpr, BALANCED: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    m = offs < n
    tl.store(Y + offs, tl.load(X + offs, mask=m), mask=m)


def test_triton_module_imports_and_autotunes_a_kernel(h200, tmp_path):
    path = tmp_path / "sparse_mla_configs.py"
    proc = tuner("export", "--db", h200["url"], "--format", "triton", "--out", str(path))
    assert proc.returncode == 0, proc.stderr
    spec = importlib.util.spec_from_file_location("sparse_mla_configs", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    configs = mod.CONFIGS_FP8_V32_H16_TOPK2048_NVIDIA_H200
    assert isinstance(configs, list) and len(configs) > 1
    # the kernel's meta-parameters, and nothing else (options and TARGET_CTAS are not kwargs)
    assert all(isinstance(c, triton.Config) and set(c.kwargs) == {"BLOCK_T", "PREFETCH", "BALANCED"} for c in configs)
    index, ctas = mod.CONFIG_INDEX_FP8_V32_H16_TOPK2048_NVIDIA_H200, mod.TARGET_CTAS_FP8_V32_H16_TOPK2048_NVIDIA_H200
    assert set(index) == set(ctas) == {1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96}
    timed = []

    def cpu_bench(kernel_call, quantiles):  # wall clock on the CPU: the interpreter has no GPU timer
        t0 = time.perf_counter()
        kernel_call()
        timed.append(1)
        return [(time.perf_counter() - t0) * 1e3] * len(quantiles)

    _copy = triton.autotune(configs=configs, key=["n"], do_bench=cpu_bench)(_copy_kernel)
    x = torch.arange(100, dtype=torch.float32)
    y = torch.zeros_like(x)
    _copy[lambda meta: (triton.cdiv(100, meta["BLOCK_T"]),)](x, y, 100)
    assert torch.equal(x, y) and len(timed) == len(configs)
    assert _copy.best_config in configs


# --- lookup ---------------------------------------------------------------------------------------


BROKEN = {
    "bad-json": '{"1": {"BLOCK_T": 16',
    "empty": "",
    "blank": "  \n",
    "binary": b"\x89PNG\r\n\x1a\n\x00\xff\xfe",
    "list": [ENTRY],
    "null": None,
    "number": 3,
    "no-entries": {},
    "word-key": {"one": ENTRY},
    "float-key": {"1.5": ENTRY},
    "negative-key": {"-1": ENTRY},
    "zero-key": {"0": ENTRY},
    "entry-not-object": {"1": 16},
    "unknown-param": {"1": {**ENTRY, "BLOCK_M": 16}},
    "missing-param": {"1": {"BLOCK_T": 16, "num_warps": 4}},
    "block-t-17": {"1": {**ENTRY, "BLOCK_T": 17}},
    "ctas-1e12": {"1": {**ENTRY, "TARGET_CTAS": 1e12}},
    "ctas-float": {"1": {**ENTRY, "TARGET_CTAS": 256.0}},
    "warps-bool": {"1": {**ENTRY, "num_warps": True}},
    "stages-string": {"1": {**ENTRY, "num_stages": "2"}},
    "nan": '{"1": {"BLOCK_T": NaN, "num_warps": 4, "num_stages": 1, "TARGET_CTAS": 7}}',
    "deep": "[" * 100_000 + "]" * 100_000,
}


@pytest.mark.parametrize("kind", list(BROKEN))
def test_a_broken_table_warns_once_and_gives_the_default(tmp_path, kind):
    name = kt.table_name("dev X", "fp8_v32", 16, 64)
    _write(tmp_path, name, BROKEN[kind])
    cfg, w = _table_warnings(lambda: _lookup(tmp_path))
    assert cfg == DEFAULT_CONFIG
    assert len(w) == 1 and name in str(w[0].message) and "default config" in str(w[0].message)
    cfg, w = _table_warnings(lambda: _lookup(tmp_path, batch=64))  # the same file again: no new warning
    assert cfg == DEFAULT_CONFIG and w == []


def test_a_table_that_is_a_directory_warns_once(tmp_path):
    (tmp_path / kt.table_name("dev X", "fp8_v32", 16, 64)).mkdir()
    cfg, w = _table_warnings(lambda: _lookup(tmp_path))
    assert cfg == DEFAULT_CONFIG and len(w) == 1 and "cannot be read" in str(w[0].message)


def test_a_missing_table_warns_once_naming_what_it_looked_for(tmp_path):
    cfg, w = _table_warnings(lambda: [_lookup(tmp_path, batch=b) for b in (1, 2, 3)])
    assert cfg == [DEFAULT_CONFIG] * 3
    assert len(w) == 1
    msg = str(w[0].message)
    assert "kv_format=fp8_v32,heads=16,topk=64,device_name=dev_X.json" in msg and str(tmp_path) in msg


def test_sidecar_verdicts_filter_entries(tmp_path):
    name = kt.table_name("dev X", "fp8_v32", 16, 64)
    _write(tmp_path, name, {"1": ENTRY, "8": {**ENTRY, "TARGET_CTAS": 9}})
    side = {"kernel_hash": kt.kernel_source_hash(), "entries": {"1": {"verdict": "ok"}, "8": {"verdict": "wrong"}}}
    _write(tmp_path, kt.sidecar_path(tmp_path / name).name, side)
    cfg, w = _table_warnings(lambda: [_lookup(tmp_path, batch=b).TARGET_CTAS for b in (1, 8, 64)])
    assert cfg == [7, 7, 7]  # "8" was not accepted
    assert len(w) == 1 and "8 (wrong)" in str(w[0].message)
    side["entries"]["1"]["verdict"] = "crashed"
    _write(tmp_path, kt.sidecar_path(tmp_path / name).name, side)
    os.utime(tmp_path / kt.sidecar_path(tmp_path / name).name, ns=(1, 1))  # another stamp, whatever the clock
    cfg, w = _table_warnings(lambda: _lookup(tmp_path))
    assert cfg == DEFAULT_CONFIG and any("no entry has an accepted verdict" in str(x.message) for x in w)


def test_a_broken_sidecar_rejects_the_table(tmp_path):
    name = kt.table_name("dev X", "fp8_v32", 16, 64)
    _write(tmp_path, name, {"1": ENTRY})
    _write(tmp_path, kt.sidecar_path(tmp_path / name).name, "not json")
    cfg, w = _table_warnings(lambda: _lookup(tmp_path))
    assert cfg == DEFAULT_CONFIG and len(w) == 1 and "provenance" in str(w[0].message)


def test_user_folder_comes_first(tmp_path, monkeypatch):
    user, package = tmp_path / "user", tmp_path / "package"
    user.mkdir(), package.mkdir()
    name = kt.table_name("dev X", "fp8_v32", 16, 64)
    _write(package, name, {"1": {**ENTRY, "TARGET_CTAS": 9}})
    monkeypatch.setattr(kt, "CONFIG_DIR", package)
    monkeypatch.setenv(kt.ENV_DIR, str(user))
    assert _lookup(None).TARGET_CTAS == 9  # nothing in the user folder: the package's table
    _write(user, name, {"1": ENTRY})
    assert _lookup(None).TARGET_CTAS == 7
    monkeypatch.setenv(kt.ENV_DIR, str(tmp_path / "does-not-exist"))
    assert _lookup(None).TARGET_CTAS == 9
    # a broken user table is not silently replaced by the package's: the user asked for it
    _write(user, name, "[]")
    monkeypatch.setenv(kt.ENV_DIR, str(user))
    cfg, w = _table_warnings(lambda: _lookup(None))
    assert cfg == DEFAULT_CONFIG and len(w) == 1 and str(user) in str(w[0].message)


def test_a_table_is_parsed_once_per_modification(tmp_path, monkeypatch):
    name = kt.table_name("dev X", "fp8_v32", 16, 64)
    _write(tmp_path, name, {"1": ENTRY})
    calls = []
    real = kt.parse_table
    monkeypatch.setattr(kt, "parse_table", lambda doc: calls.append(1) or real(doc))
    kt.load_table.cache_clear()
    for b in range(1, 20):
        assert _lookup(tmp_path, batch=b).TARGET_CTAS == 7
    assert len(calls) == 1
    _write(tmp_path, name, {"1": {**ENTRY, "TARGET_CTAS": 11}})
    os.utime(tmp_path / name, ns=(2, 2))
    assert _lookup(tmp_path).TARGET_CTAS == 11 and len(calls) == 2


@pytest.mark.parametrize("kind", ["bad-json", "binary", "null", "block-t-17"])
def test_decode_with_config_none_never_raises_on_a_broken_table(tmp_path, monkeypatch, kind):
    name = kt.table_name(decode.device_name(torch.device("cpu")), "fp8_v32", 16, 32)
    _write(tmp_path, name, BROKEN[kind])
    monkeypatch.setenv(kt.ENV_DIR, str(tmp_path))
    seen = []
    monkeypatch.setattr(decode, "LAUNCH_LISTENERS", [lambda kind_, cfg, grid: seen.append(cfg)])
    bt = make_batch(Workload("fp8_v32", 16, 32, page_size=64, context=64), 1, device="cpu", seed=1)
    (out, lse), w = _table_warnings(lambda: sparse_mla_decode(*bt.args(), kv_format="fp8_v32"))
    assert out.shape == (1, 16, 512) and torch.isfinite(out.float()).all()
    assert len(w) == 1 and name in str(w[0].message)
    assert seen and seen[0] == DEFAULT_CONFIG


def test_committed_tables_are_valid_and_fresh_enough_to_load():
    tables = sorted(p for p in kt.CONFIG_DIR.glob("*.json") if not p.name.endswith(kt.SIDECAR_SUFFIX))
    assert tables, "no committed table"
    for path in tables:
        assert path.name.startswith("kv_format=") and ",device_name=" in path.name
        assert kt.sidecar_path(path).is_file()
        t = kt.load_table(str(path), kt._stamp(path), kt._stamp(kt.sidecar_path(path)))
        assert t.problem is None and t.configs, (path.name, t.problem)


def test_report_on_the_h200_results(h200, tmp_path):
    from db.store import Store
    from tuner.report import render_report

    store = Store(h200["url"])
    store.url = "postgresql://tuner:s3cr3t-pw@db-host/tuner"
    text = render_report(store, tmp_path / "plots", "plots/")
    assert "s3cr3t-pw" not in text and "postgresql://tuner:***@db-host/tuner" in text
    assert "**Target sm_120, measured on sm_90.**" in text
    assert "% copy BW" in text
    # T32 with 2 stages is infeasible on sm_120: the lever shows the nearest variant that ran
    assert re.search(r"^\| BLOCK_T = 32 via `T32-w4-s1-c256` \(num_stages 2 → 1\) \|.* win ", text, flags=re.M)
    # no value of a best config is called a dead end, and "not measured" is never a verdict
    for section in text.split("\n## ")[1:]:
        best = re.findall(r"^\| \d+ \| [^|]+ \| `([^`]+)` \|", section, flags=re.M)
        assert best, section[:200]
        dead = section.split("### Dead ends")[1].split("###")[0]
        assert "not," not in dead and ", not." not in dead
        for key in best:
            for p, v in KernelConfig.parse(key).as_dict().items():
                assert f"**{p} = {v}**" not in dead, (key, dead)
    assert sorted(p.name for p in (tmp_path / "plots").glob("*.png")) == [
        "v32_tp8_v32_NVIDIA_H200_cuda_levers.png",
        "v32_tp8_v32_NVIDIA_H200_cuda_median.png",
        "v4_flash_layer_tp4_v4_flash_layer_NVIDIA_H200_cuda_levers.png",
        "v4_flash_layer_tp4_v4_flash_layer_NVIDIA_H200_cuda_median.png",
        "v4_flash_tp4_v4_flash_NVIDIA_H200_cuda_levers.png",
        "v4_flash_tp4_v4_flash_NVIDIA_H200_cuda_median.png",
    ]


def test_the_export_history_names_paths_inside_the_working_directory_relatively(h200, tmp_path, monkeypatch):
    """A committed database must not carry one machine's folders: a table written under the working
    directory is recorded relative to it; one written elsewhere keeps its absolute path."""
    from db.store import Store
    from tuner.export import export_tables

    store = Store(h200["url"])
    monkeypatch.chdir(tmp_path)
    inside = export_tables(store, Path("tables"))
    outside = export_tables(store, tmp_path.parent / f"{tmp_path.name}-elsewhere")
    con = sqlite3.connect(h200["path"])
    recorded = {p for (p,) in con.execute("SELECT path FROM tuner_exports")}
    con.close()
    assert {str(Path("tables") / p.name) for p in inside if not p.name.endswith(".provenance.json")} <= recorded
    assert {str(p.resolve()) for p in outside if not p.name.endswith(".provenance.json")} <= recorded
