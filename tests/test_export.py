"""Export formats and the kernel's run-time lookup of the exported tables.

The export tests read the committed H200 results (a copy, upgraded to the current schema); the
lookup tests write broken tables on purpose: every kind gives one warning and the default config.
"""

import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import sqlite3
import time
import warnings
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

import sparse_mla_tuner.kernels.table as kt
from sparse_mla_tuner.kernels import decode
from sparse_mla_tuner.kernels import make_batch
from sparse_mla_tuner.kernels import sparse_mla_decode
from sparse_mla_tuner.kernels.config import DEFAULT_CONFIG
from sparse_mla_tuner.kernels.config import PARAMS
from sparse_mla_tuner.kernels.config import KernelConfig
from sparse_mla_tuner.kernels.config import Role
from sparse_mla_tuner.kernels.workload import Workload
from tests.conftest import tuner_in_process as tuner  # export reads the database and writes files: no interpreter start

H200_DB = os.path.join(os.path.dirname(__file__), "..", "results", "h200.db")
ENTRY = {"BLOCK_T": 16, "num_warps": 4, "num_stages": 1, "TARGET_CTAS": 7}


@pytest.fixture(scope="module")
def h200(tmp_path_factory):
    """A copy of the committed H200 results at the current schema (the original is never written)."""
    from sparse_mla_tuner.db.store import Store

    path = tmp_path_factory.mktemp("h200") / "h200.db"
    shutil.copy(H200_DB, path)
    Store(f"sqlite:///{path}", upgrade=True)
    return {"url": f"sqlite:///{path}", "path": path}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """The committed results' three workloads at two levels each (tests/recorded.py's make_results), for the tests
    of names, passwords and paths, which do not depend on how much was measured: a few thousand trials to read
    instead of 55 000."""
    from sparse_mla_tuner.db.store import Store
    from tests.recorded import make_results

    path = make_results(tmp_path_factory.mktemp("results") / "results.db")
    Store(f"sqlite:///{path}", upgrade=True).engine.dispose()
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


@pytest.fixture(autouse=True)
def fresh_lookup_state():
    """Each test sees its own warnings: the once-per-file memory and the parse cache start empty."""
    kt._warned.clear()
    kt._logged.clear()
    kt.load_table.cache_clear()


def _table_warnings(fn):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        result = fn()
    return result, [x for x in w if issubclass(x.category, kt.TableWarning)]


# --- export ---------------------------------------------------------------------------------------


def _digest(path) -> str:
    """The database file and its WAL, byte for byte (a read must change neither)."""
    h = hashlib.sha256()
    for p in (Path(path), Path(f"{path}-wal")):
        h.update(p.read_bytes() if p.exists() else b"-")
    return h.hexdigest()


@pytest.fixture(scope="module")
def engine_tables(h200, tmp_path_factory):
    """``tuner export`` of the H200 results as engine tables, once for the tests that read them: the folder, and
    the database's digest before and after the export (a read must change neither the file nor its WAL)."""
    out = tmp_path_factory.mktemp("engine") / "configs"
    before = _digest(h200["path"])
    proc = tuner("export", "--db", h200["url"], "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    return {"out": out, "before": before, "after": _digest(h200["path"])}


def test_engine_export_is_what_an_engine_loader_and_the_kernel_read(h200, engine_tables, tmp_path):
    out = engine_tables["out"]
    assert engine_tables["after"] == engine_tables["before"], "tuner export wrote to the database it read"
    before = _digest(h200["path"])
    name = "kv_format=fp8_model1,heads=16,topk=512,device_name=NVIDIA_H200"
    assert (out / f"{name}.json").is_file() and (out / f"{name}.provenance.json").is_file()
    assert (
        len(list(out.glob("*.json"))) == 10
    )  # five workloads (V4, V3.2, V4's layer call, V4.1's, GLM-5.3's), each a table and its sidecar
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
    for batch in (1, 50):  # SGLang's loader: triton_<version>/ folder, json.load, int keys, nearest key
        theirs = engine_loader(tmp_path / "sg" / "triton_3_6_0", "NVIDIA H200", "fp8_model1", 16, 512, batch)
        ours = kt.lookup_config("NVIDIA H200", "fp8_model1", 16, 512, batch, config_dir=tmp_path / "sg")
        assert KernelConfig.from_dict(theirs) == ours
    assert _digest(h200["path"]) == before, "tuner export wrote to the database it read"
    # --record: the export history gets a row per table, and only then
    proc = tuner("export", "--db", h200["url"], "--out", str(tmp_path / "rec"), "--record")
    assert proc.returncode == 0, proc.stderr
    con = sqlite3.connect(h200["path"])
    rows = con.execute("SELECT path, content FROM tuner_exports").fetchall()
    con.close()
    assert any(p.endswith(f"{name}.json") and json.loads(c)["table"] == table for p, c in rows)


def test_sidecar_and_export_row_hold_no_password(results, tmp_path):
    from sparse_mla_tuner.db.models import ExportModel
    from sparse_mla_tuner.db.store import Store
    from sparse_mla_tuner.tuner.adapters.sparse_mla.export import export_tables

    store = Store(results["url"])
    store.url = "postgresql+psycopg://tuner:s3cr3t-pw@db-host/tuner?sslpassword=other-secret"
    paths = export_tables(store, tmp_path, record=True)
    text = "".join(p.read_text() for p in paths)
    assert "s3cr3t-pw" not in text and "other-secret" not in text
    side = json.loads(next(p for p in paths if p.name.endswith(".provenance.json")).read_text())
    assert side["source"].startswith("postgresql+psycopg://tuner:***@db-host/tuner")
    with store.session() as s:
        contents = [r.content for r in s.query(ExportModel)]
    assert contents and not any("s3cr3t-pw" in c or "other-secret" in c for c in contents)


@triton.jit  # module level: the interpreter re-reads it
def _copy_kernel(X, Y, n, BLOCK_T: tl.constexpr, PREFETCH: tl.constexpr, BALANCED: tl.constexpr, MERGE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    m = offs < n
    tl.store(Y + offs, tl.load(X + offs, mask=m), mask=m)


def _import(path, name="sparse_mla_configs"):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_triton_module_picks_the_tuned_config_per_batch_without_timing(h200, engine_tables, tmp_path):
    """What the module's docstring documents: config_for / target_ctas by nearest batch, and
    triton.autotune(**autotune_kwargs(NAME, batch_arg)) running the tuned config per batch without timing."""
    path = tmp_path / "sparse_mla_configs.py"
    proc = tuner("export", "--db", h200["url"], "--format", "triton", "--out", str(path))
    assert proc.returncode == 0, proc.stderr
    mod = _import(path)
    name = "FP8_V32_H16_TOPK2048_NVIDIA_H200"
    configs = mod.CONFIGS_FP8_V32_H16_TOPK2048_NVIDIA_H200
    assert mod.CONFIGS[name] is configs and isinstance(configs, list) and len(configs) > 1
    # the kernel's meta-parameters (all kernel arguments), and nothing else (options and TARGET_CTAS are not kwargs)
    meta = {p.name for p in PARAMS if p.role is Role.META}  # BLOCK_T, PREFETCH, BALANCED, MERGE
    assert all(isinstance(c, triton.Config) and set(c.kwargs) == meta for c in configs)
    index, ctas = mod.CONFIG_INDEX[name], mod.TARGET_CTAS[name]
    assert set(index) == set(ctas) == {1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96}
    engine = engine_tables["out"]
    for batch in (1, 3, 20, 70, 200):  # the same pick as the engine table's nearest key
        want = kt.lookup_config("NVIDIA H200", "fp8_v32", 16, 2048, batch, config_dir=engine)
        cfg = mod.config_for(name, batch)
        assert cfg.kwargs == want.meta() and cfg.num_warps == want.num_warps and cfg.num_stages == want.num_stages
        assert mod.target_ctas(name, batch) == want.TARGET_CTAS
    assert mod.TABLES[name]["devices"] == ["NVIDIA H200"] and mod.TABLES[name]["triton"] == ["3.6.0"]
    # each config's comment names the config tuned at each of its batch sizes (not its first batch's, repeated)
    text = path.read_text().split(f"CONFIGS_{name} = [", 1)[1].split("]", 1)[0]
    named = {int(c): key for c, key in re.findall(r"C=(\d+) (\S+?)(?=,|$)", text, flags=re.M)}
    assert set(named) == set(index)
    for batch, key in named.items():
        want = kt.lookup_config("NVIDIA H200", "fp8_v32", 16, 2048, batch, config_dir=engine)
        assert key == str(want), (batch, key, str(want))

    timed, ran = [], []

    def timer(kernel_call, quantiles):  # would time; the helper's do_bench must be used instead
        timed.append(1)
        return [1.0] * len(quantiles)

    kw = mod.autotune_kwargs(name, "n")
    assert kw["key"] == ["n"] and kw["configs"] is configs
    _copy = triton.autotune(**kw)(_copy_kernel)
    x = torch.arange(300, dtype=torch.float32)
    for n in (1, 8, 50, 96, 300):  # more than one config under the interpreter: no "0 active drivers"
        y = torch.zeros_like(x)
        _copy[lambda meta: (triton.cdiv(meta["n"], meta["BLOCK_T"]),)](x, y, n)
        assert torch.equal(y[:n], x[:n]) and not y[n:].any()
        assert _copy.best_config is mod.config_for(name, n)
        ran.append(_copy.best_config)
    assert timed == [] and len({id(c) for c in ran}) >= 1


@triton.jit  # module level: the interpreter re-reads it
def _copy_kernel(X, Y, n, BLOCK_T: tl.constexpr, PREFETCH: tl.constexpr, BALANCED: tl.constexpr, MERGE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    m = offs < n
    tl.store(Y + offs, tl.load(X + offs, mask=m), mask=m)


HOSTILE = [
    "NVIDIA H100\nimport os; os.makedirs(PWNED)  # ",
    'GPU "quoted" \'single\' """triple""" \\ back',
    "GPU\x00NUL\x00name",
    "../../etc/passwd",
    "x" * 300,
    "é ü 设备 \u2028 line-sep",
]


@pytest.fixture()
def hostile_db(results, tmp_path):
    """A copy of the H200 results whose device names (and URL) are hostile: newlines with code, NUL bytes,
    quotes, path separators, non-ASCII, 300 characters. Each name gets its own environment."""
    path = tmp_path / "hostile.db"
    shutil.copy(results["path"], path)
    con = sqlite3.connect(path)
    cur = con.execute("SELECT * FROM tuner_environments")
    cols, env = [d[0] for d in cur.description], cur.fetchone()
    ids = []
    for i, name in enumerate(HOSTILE):
        row = dict(zip(cols, env, strict=True)) | {"id": 100 + i, "fingerprint": f"hostile-{i}", "gpu_name": name}
        marks = ",".join("?" * len(cols))
        con.execute(f"INSERT INTO tuner_environments ({','.join(cols)}) VALUES ({marks})", list(row.values()))
        ids.append(100 + i)
    # each study (workload x concurrency) to one of the hostile environments, its trials with it
    studies = con.execute("SELECT id FROM tuner_studies ORDER BY workload_id, concurrency").fetchall()
    for j, (study,) in enumerate(studies):
        env_id = ids[j * len(ids) // len(studies)]
        con.execute("UPDATE tuner_studies SET environment_id = ? WHERE id = ?", (env_id, study))
        con.execute("UPDATE tuner_trials SET environment_id = ? WHERE study_id = ?", (env_id, study))
    con.commit()
    con.close()
    return path


def test_hostile_stored_names_are_data_in_every_export(hostile_db, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{hostile_db}"
    module = tmp_path / "generated.py"
    proc = tuner("export", "--db", url, "--format", "triton", "--out", str(module))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    compile(module.read_text(), str(module), "exec")  # valid Python
    mod = _import(module, "generated_hostile")
    assert not (tmp_path / "PWNED").exists(), "importing the generated module ran stored code"
    devices = {d for t in mod.TABLES.values() for d in t["devices"]}
    assert HOSTILE[0] in devices  # the name round-trips exactly, as data
    assert all(n.isidentifier() and n.isascii() for n in mod.CONFIGS)
    out = tmp_path / "tables"
    for fmt in ("engine", "sglang"):
        proc = tuner("export", "--db", url, "--out", str(out / fmt), "--format", fmt)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    files = [p for p in out.rglob("*") if p.is_file()]
    assert files and all(p.resolve().is_relative_to(out.resolve()) for p in files)  # nothing outside --out
    for p in files:
        assert re.fullmatch(r"[0-9A-Za-z_.+()=,\-]+", p.name), p.name
        assert len(p.name.encode()) < 255
        side = json.loads(p.read_text())  # every file is valid JSON
        if p.name.endswith(kt.SIDECAR_SUFFIX):
            assert side["device"] in HOSTILE or side["device"] == "NVIDIA H200" or "H200" not in side["device"]


def test_a_nul_byte_in_a_stored_name_exports_without_a_traceback(results, tmp_path):
    path = tmp_path / "nul.db"
    shutil.copy(results["path"], path)
    con = sqlite3.connect(path)
    con.execute("UPDATE tuner_environments SET gpu_name = ?", ("NVIDIA\x00H200",))
    con.commit()
    con.close()
    for fmt in ("engine", "sglang", "triton"):
        target = tmp_path / f"out-{fmt}" if fmt != "triton" else tmp_path / "nul_configs.py"
        proc = tuner("export", "--db", f"sqlite:///{path}", "--format", fmt, "--out", str(target))
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (fmt, proc.stderr)
    assert any("device_name=NVIDIA_H200" in p.name for p in (tmp_path / "out-engine").iterdir())


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
    "block-t-2**40": {"1": {**ENTRY, "BLOCK_T": 2**40}},
    "ctas-2**40": {"1": {**ENTRY, "TARGET_CTAS": 2**40}},
    "warps-64": {"1": {**ENTRY, "num_warps": 64}},
    "maxnreg-256": {"1": {**ENTRY, "maxnreg": 256}},
    "prefetch-neg": {"1": {**ENTRY, "PREFETCH": -1}},
    "huge-int": '{"1": {"BLOCK_T": 1' + "0" * 5000 + ', "num_warps": 4, "num_stages": 1, "TARGET_CTAS": 7}}',
    "huge-key": {"1" * 10_000: ENTRY},
    "too-large": '{"1": ' + json.dumps(ENTRY) + ", " + '"pad": "' + "x" * (2 << 20) + '"}',
    "version-not-string": {"triton_version": 3.6, "1": ENTRY},
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


def _in_a_thread(fn, limit_s):
    """``fn()`` in a daemon thread; fails the test if it has not returned within ``limit_s`` (it would hang)."""
    import threading

    out = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(limit_s)
    assert not t.is_alive(), f"still blocked after {limit_s} s"
    return out[0]


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "socket"])
def test_a_table_that_is_not_a_regular_file_is_never_opened_and_never_blocks(tmp_path, kind, monkeypatch):
    import socket

    name = kt.table_name("dev X", "fp8_v32", 16, 64)
    path = tmp_path / name
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")  # endless bytes: a read without a size cap would never finish
    else:
        monkeypatch.chdir(tmp_path)  # a socket's path is limited to 108 bytes: bind the bare name
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(name)
    t0 = time.perf_counter()
    cfg, w = _in_a_thread(lambda: _table_warnings(lambda: _lookup(tmp_path)), limit_s=60)
    assert cfg == DEFAULT_CONFIG and len(w) == 1
    assert "not a regular file" in str(w[0].message) and name in str(w[0].message)
    assert time.perf_counter() - t0 < 60


def test_the_size_cap_holds_even_when_the_file_grows(tmp_path):
    """A file that passes the first size check is still read at most MAX_TABLE_BYTES + 1."""
    name = kt.table_name("dev X", "fp8_v32", 16, 64)
    _write(tmp_path, name, BROKEN["too-large"])
    cfg, w = _table_warnings(lambda: _lookup(tmp_path))
    assert cfg == DEFAULT_CONFIG and "more than a table's limit" in str(w[0].message)


def test_a_triton_version_key_is_tolerated_and_checked(tmp_path):
    """vLLM's tuner writes "triton_version" into its tables and its loader pops it: so does this one."""
    name = kt.table_name("dev X", "fp8_v32", 16, 64)
    _write(tmp_path, name, {"triton_version": "3.9.0", "1": ENTRY})
    cfg, w = _table_warnings(lambda: _lookup(tmp_path, triton_version="3.9.0"))
    assert cfg.TARGET_CTAS == 7 and w == []
    kt.load_table.cache_clear()
    kt._warned.clear()
    cfg, w = _table_warnings(lambda: _lookup(tmp_path, triton_version="3.6.0"))
    assert cfg.TARGET_CTAS == 7 and len(w) == 1 and "tuned with Triton 3.9.0" in str(w[0].message)


@pytest.mark.parametrize(
    "device, slug",
    [
        ("NVIDIA H200", "NVIDIA_H200"),
        ("NVIDIA H200 NVL", "NVIDIA_H200"),
        ("NVIDIA H200 141GB HBM3e", "NVIDIA_H200"),
        ("NVIDIA H100 80GB HBM3", "NVIDIA_H100_80GB_HBM3"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA_A100-SXM4-80GB"),
        ("NVIDIA GeForce RTX 5090", "NVIDIA_GeForce_RTX_5090"),
        (
            "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
            "NVIDIA_RTX_PRO_6000_Blackwell_Max-Q_Workstation_Edition",
        ),
    ],
)
def test_device_names_are_normalized_as_vllm_does(device, slug):
    vllm = device.replace(" ", "_")  # vLLM's get_config_file_name
    if "H200" in vllm.split("_"):
        vllm = "NVIDIA_H200"
    assert kt.device_slug(device) == slug == vllm


def test_every_h200_variant_reads_the_h200_table(tmp_path):
    _write(tmp_path, kt.table_name("NVIDIA H200", "fp8_v32", 16, 64), {"1": ENTRY})
    for device in ("NVIDIA H200", "NVIDIA H200 NVL", "NVIDIA H200 141GB HBM3e"):
        cfg, w = _table_warnings(lambda d=device: kt.lookup_config(d, "fp8_v32", 16, 64, 1, config_dir=tmp_path))
        assert cfg.TARGET_CTAS == 7 and w == [], device


def test_the_rtx_pro_6000_editions_are_one_family_with_a_warning(tmp_path):
    server = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    _write(tmp_path, kt.table_name(server, "fp8_v32", 16, 64), {"1": ENTRY})
    cfg, w = _table_warnings(lambda: kt.lookup_config(server, "fp8_v32", 16, 64, 1, config_dir=tmp_path))
    assert cfg.TARGET_CTAS == 7 and w == []
    for edition in ("Workstation Edition", "Max-Q Workstation Edition"):
        device = f"NVIDIA RTX PRO 6000 Blackwell {edition}"
        cfg, w = _table_warnings(lambda d=device: kt.lookup_config(d, "fp8_v32", 16, 64, 1, config_dir=tmp_path))
        assert cfg.TARGET_CTAS == 7 and len(w) == 1, edition
        msg = str(w[0].message)
        assert "tuned on NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition" in msg and "same chip" in msg
    # its own table, when there is one, wins over the family's
    own = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"
    _write(tmp_path, kt.table_name(own, "fp8_v32", 16, 64), {"1": {**ENTRY, "TARGET_CTAS": 9}})
    assert kt.lookup_config(own, "fp8_v32", 16, 64, 1, config_dir=tmp_path).TARGET_CTAS == 9
    assert (
        kt.lookup_config("NVIDIA RTX 6000 Ada Generation", "fp8_v32", 16, 64, 1, config_dir=tmp_path) == DEFAULT_CONFIG
    )


def test_sglang_version_folders_are_found_with_a_fallback_to_older_versions(tmp_path, monkeypatch):
    """SPARSE_MLA_CONFIG_DIR holding SGLang's layout: triton_<running>/ first, else the newest older folder,
    with a warning; a newer version's folder is never used."""
    name = kt.table_name("dev X", "fp8_v32", 16, 64)
    for version, ctas in (("3_4_0", 4), ("3_6_0", 6), ("3_9_0", 9), ("3_10_0", 10)):
        (tmp_path / f"triton_{version}").mkdir()
        _write(tmp_path / f"triton_{version}", name, {"1": {**ENTRY, "TARGET_CTAS": ctas}})
    monkeypatch.setenv(kt.ENV_DIR, str(tmp_path))
    for running, want, warned in (("3.9.0", 9, False), ("3.6.0", 6, False), ("3.8.1", 6, True), ("3.5.0", 4, True)):
        cfg, w = _table_warnings(lambda r=running: kt.lookup_config("dev X", "fp8_v32", 16, 64, 1, triton_version=r))
        assert cfg.TARGET_CTAS == want, running
        assert bool(w) == warned, (running, [str(x.message) for x in w])
        if warned:
            assert f"no autotune table for Triton {running}" in str(w[0].message) and "tuned with Triton" in str(
                w[0].message
            )
    cfg, w = _table_warnings(lambda: kt.lookup_config("dev X", "fp8_v32", 16, 64, 1, triton_version="3.3.0"))
    assert cfg == DEFAULT_CONFIG and "triton_3_3_0" in str(w[0].message)


def test_the_table_used_is_logged_once_at_info(tmp_path, caplog):
    name = kt.table_name("dev Y", "fp8_v32", 16, 64)
    _write(tmp_path, name, {"1": ENTRY})
    with caplog.at_level(logging.INFO, logger="sparse_mla_tuner.kernels.table"):
        for b in (1, 2, 3):
            kt.lookup_config("dev Y", "fp8_v32", 16, 64, b, config_dir=tmp_path)
    used = [r for r in caplog.records if r.name == "sparse_mla_tuner.kernels.table" and r.levelno == logging.INFO]
    assert len(used) == 1 and str(tmp_path / name) in used[0].getMessage()


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


@pytest.mark.parametrize("kind", ["bad-json", "binary", "null", "block-t-17", "block-t-2**40", "fifo"])
def test_decode_with_config_none_never_raises_on_a_broken_table(tmp_path, monkeypatch, kind):
    name = kt.table_name(decode.device_name(torch.device("cpu")), "fp8_v32", 16, 32)
    if kind == "fifo":
        os.mkfifo(tmp_path / name)  # opening it for reading would wait for a writer forever
    else:
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
    from sparse_mla_tuner.db.store import Store
    from sparse_mla_tuner.tuner.report import render_report

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
    assert sorted(p.name for p in (tmp_path / "plots").glob("*.png")) == sorted(
        [
            "glm53_nope_tp4_glm53_nope_NVIDIA_H200_cuda_levers.png",
            "glm53_nope_tp4_glm53_nope_NVIDIA_H200_cuda_median.png",
            "v32_tp8_v32_NVIDIA_H200_cuda_levers.png",
            "v32_tp8_v32_NVIDIA_H200_cuda_median.png",
            "v4_flash_layer_tp4_v4_flash_layer_NVIDIA_H200_cuda_levers.png",
            "v4_flash_layer_tp4_v4_flash_layer_NVIDIA_H200_cuda_median.png",
            "v4_flash_tp4_v4_flash_NVIDIA_H200_cuda_levers.png",
            "v4_flash_tp4_v4_flash_NVIDIA_H200_cuda_median.png",
            "v41_flash_layer_tp4_v41_flash_layer_NVIDIA_H200_cuda_levers.png",
            "v41_flash_layer_tp4_v41_flash_layer_NVIDIA_H200_cuda_median.png",
        ]
    )


def test_the_export_history_names_paths_inside_the_working_directory_relatively(results, tmp_path, monkeypatch):
    """A committed database must not carry one machine's folders: a table written under the working
    directory is recorded relative to it; one written elsewhere keeps its absolute path."""
    from sparse_mla_tuner.db.store import Store
    from sparse_mla_tuner.tuner.adapters.sparse_mla.export import export_tables

    store = Store(results["url"])
    monkeypatch.chdir(tmp_path)
    inside = export_tables(store, Path("tables"), record=True)
    outside = export_tables(store, tmp_path.parent / f"{tmp_path.name}-elsewhere", record=True)
    con = sqlite3.connect(results["path"])
    recorded = {p for (p,) in con.execute("SELECT path FROM tuner_exports")}
    con.close()
    assert {str(Path("tables") / p.name) for p in inside if not p.name.endswith(".provenance.json")} <= recorded
    assert {str(p.resolve()) for p in outside if not p.name.endswith(".provenance.json")} <= recorded


@pytest.mark.parametrize("name", HOSTILE + ["", ".", "..", "a/../../b", "NVIDIA H200"])
def test_stored_names_become_safe_file_stems_and_markdown(name, tmp_path):
    """The report's one quoting of stored strings (tuner.report), on every hostile name the exports see."""
    from sparse_mla_tuner.tuner.report import file_stem
    from sparse_mla_tuner.tuner.report import md

    stem = file_stem("space", "wl", name, "cuda")
    assert re.fullmatch(r"[0-9A-Za-z_.\-]+", stem) and not stem.startswith(".") and len(stem) <= 150
    (tmp_path / f"{stem}_median.png").write_bytes(b"")  # a valid file name, inside the folder
    assert [p.name for p in tmp_path.iterdir()] == [f"{stem}_median.png"]
    text = md(name)
    assert "\n" not in text and "\x00" not in text and "\r" not in text
    assert not re.search(r"(?<!\\)[`*\[\]<|~$]", text)  # every character Markdown or a table reads, escaped
    assert file_stem("NVIDIA H200") == "NVIDIA_H200" and md("NVIDIA H200") == "NVIDIA H200"


@pytest.mark.parametrize("folder", ["x" * 5000, "/dev/null", "{fifo}"], ids=["long", "devnull", "fifo"])
def test_a_hostile_config_dir_gives_the_default_without_raising(tmp_path, monkeypatch, folder):
    if folder == "{fifo}":
        folder = str(tmp_path / "fifo")
        os.mkfifo(folder)
    monkeypatch.setenv(kt.ENV_DIR, folder)
    monkeypatch.setattr(kt, "CONFIG_DIR", tmp_path / "empty")
    cfg, w = _in_a_thread(lambda: _table_warnings(lambda: kt.lookup_config("dev X", "fp8_v32", 16, 64, 1)), 60)
    assert cfg == DEFAULT_CONFIG and len(w) == 1 and "default config" in str(w[0].message)
