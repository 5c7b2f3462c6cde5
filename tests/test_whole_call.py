"""Spaces that describe the whole decode call (extra cache, attention sink, query tokens), tuned end to end."""

import json
import os
import sqlite3
import subprocess
import sys

import pytest

from sparse_mla_tuner.kernels import Workload
from sparse_mla_tuner.kernels import make_batch
from sparse_mla_tuner.tuner.errors import SpaceError
from sparse_mla_tuner.tuner.space import load_space

LAYER = """\
name: layer
target: sm_120
workloads:
  - name: tiny_layer
    kv_format: fp8_model1
    heads: 16
    topk: 32
    page_size: 32
    context: 64
    extra: {kv_format: fp8_model1, topk: 64, page_size: 64, context: 128}
    attn_sink: true
    q_tokens: QTOKENS
concurrency: [2]
parameters:
  BLOCK_T: [16]
  num_warps: [4]
  num_stages: [1]
  TARGET_CTAS: [1, 64]
baseline: {BLOCK_T: 16, num_warps: 4, num_stages: 1, TARGET_CTAS: 1}
measurement: {rounds: 3, finalists: 1, finalist_rounds: 3, trial_timeout_s: 600}
"""


def _space(tmp_path, text):
    p = tmp_path / "layer.yaml"
    p.write_text(text)
    return p


def test_the_shipped_layer_space_is_the_v4_flash_call():
    sp = load_space("search_spaces/v4_flash_layer_tp4.yaml")
    wl = sp.workloads[0].workload()
    assert (wl.kv_format, wl.heads, wl.topk, wl.context) == ("fp8_model1", 16, 128, 128)
    assert (wl.extra.kv_format, wl.extra.heads, wl.extra.topk, wl.extra.context) == ("fp8_model1", 16, 512, 8192)
    assert wl.attn_sink and wl.q_tokens == 1
    assert json.loads(sp.workloads[0].fields()["call"])["extra"]["topk"] == 512


@pytest.mark.parametrize(
    "change, where",
    [
        ("extra: {kv_format: fp8_v32, topk: 64}", "extra.kv_format"),  # another head dim: one q can't serve both
        ("extra: {kv_format: fp8_model1}", "extra.topk"),
        ("extra: {kv_format: fp8_model1, topk: 64, heads: 4}", "extra.heads"),
        ("extra: [fp8_model1]", "extra"),
        ("extra: {kv_format: fp8_model1, topk: 0}", "extra.topk"),
    ],
)
def test_bad_extra_caches_are_one_sentence(tmp_path, change, where):
    text = LAYER.replace("    extra: {kv_format: fp8_model1, topk: 64, page_size: 64, context: 128}", "    " + change)
    with pytest.raises(SpaceError, match=f"workloads\\[0\\].{where}"):
        load_space(_space(tmp_path, text.replace("QTOKENS", "1")))


@pytest.mark.parametrize("bad, where", [("attn_sink: yes please", "attn_sink"), ("q_tokens: 0", "q_tokens")])
def test_bad_call_keys_are_one_sentence(tmp_path, bad, where):
    key = bad.split(":")[0]
    text = LAYER.replace("QTOKENS", "1")
    lines = [f"    {bad}" if line.strip().startswith(key + ":") else line for line in text.splitlines()]
    with pytest.raises(SpaceError, match=f"workloads\\[0\\].{where}"):
        load_space(_space(tmp_path, "\n".join(lines)))


def test_workload_round_trips_through_json_and_builds_the_whole_call():
    from dataclasses import asdict

    wl = Workload("fp8_model1", 16, 32, 32, 64, Workload("fp8_model1", 16, 64, 64, 128), True, 2)
    assert Workload(**json.loads(json.dumps(asdict(wl)))) == wl
    bt = make_batch(wl, 3)
    assert bt.q.shape == (3, 2, 16, 512) and bt.attn_sink.shape == (16,)
    assert bt.extra_indices.shape == (3, 2, 64) and bt.rows(1, 2).q.shape == (1, 2, 16, 512)
    assert wl.kv_bytes_per_request() == 2 * (32 + 64) * 584
    with pytest.raises(ValueError, match="head dim"):
        Workload("fp8_model1", 16, 32, extra=Workload("fp8_v32", 16, 64))


def test_a_whole_call_is_checked_measured_and_recorded(tmp_path):
    space = _space(tmp_path, LAYER.replace("QTOKENS", "2"))
    db = tmp_path / "layer.db"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sparse_mla_tuner.tuner",
            "search",
            str(space),
            "--db",
            f"sqlite:///{db}",
            "-q",
            "--backend",
            "interpreter",
        ],
        capture_output=True,
        text=True,
        timeout=1200,
        env=os.environ.copy(),
    )
    assert proc.returncode == 0, proc.stderr
    con = sqlite3.connect(db)
    (call,) = con.execute("SELECT call FROM tuner_workloads").fetchone()
    assert json.loads(call) == {
        "attn_sink": True,
        "extra": {"context": 128, "kv_format": "fp8_model1", "page_size": 64, "topk": 64},
        "q_tokens": 2,
    }
    rows = dict(con.execute("SELECT config_key, verdict FROM tuner_trials").fetchall())
    # 2 requests x 2 tokens = 4 rows of 2 + 4 tiles (main, extra) in one launch: c1 -> 1 split (no combine), c64 -> 6
    assert rows == {"T16-w4-s1-c1": "ok", "T16-w4-s1-c64": "ok"}
    errs = con.execute("SELECT out_rel_err FROM tuner_trials").fetchall()
    assert all(e is not None and e < 1e-2 for (e,) in errs)  # the gate compared the whole call
    n = con.execute("SELECT COUNT(*) FROM tuner_samples WHERE phase = 'screen'").fetchone()[0]
    assert n == 2 * 3


def test_the_recorded_split_count_counts_every_query_token_as_a_row(monkeypatch):
    from sparse_mla_tuner.kernels import KernelConfig
    from sparse_mla_tuner.kernels.config import split_grid
    from sparse_mla_tuner.tuner import measure_main
    from sparse_mla_tuner.tuner.protocol import CalibrateRequest
    from sparse_mla_tuner.tuner.protocol import MeasureRequest

    monkeypatch.setattr(measure_main, "BACKEND", "interpreter")
    wl = Workload("fp8_model1", 16, 64, page_size=64, context=128, q_tokens=2)
    cfg = KernelConfig(16, 4, 1, 8)  # 4 tiles per row; a target of 8 programs over the rows
    rows = 2 * wl.q_tokens  # 2 requests x 2 tokens
    assert split_grid(cfg, rows, 16, 64).slots == 2 != split_grid(cfg, 2, 16, 64).slots  # the case tells them apart
    runner = measure_main.Runner()
    measured = runner.measure(MeasureRequest(wl, 2, cfg, cfg, 1, 7, False))
    calibrated = runner.calibrate(CalibrateRequest(wl, 2, cfg, 1))
    assert (measured.verdict, measured.num_splits) == ("ok", 2)
    assert (calibrated.verdict, calibrated.num_splits) == ("ok", 2)


_LAYER_COMPILE_SCRIPT = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from sparse_mla_tuner.kernels.config import KernelConfig
from sparse_mla_tuner.kernels.decode import compile_spec
from sparse_mla_tuner.kernels.workload import Workload
from sparse_mla_tuner.tuner.compile_process import resources

window = Workload("fp8_model1", 16, 128, page_size=64, context=128)
compressed = Workload("fp8_model1", 16, 512, page_size=64, context=8192)
out = []
for wl, extra in ((window, compressed), (compressed, None)):
    for spec in compile_spec(KernelConfig.parse("T16-w4-s1-c512-p2"), wl, 90, extra=extra, attn_sink=True):
        k = triton.compile(ASTSource(spec.kernel, spec.signature, spec.constexprs, spec.attrs),
                           target=GPUTarget("cuda", 90, 32), options=spec.options)
        out.append([spec.name, bool(spec.constexprs.get("HAS_EXTRA")), spec.constexprs.get("WRITE_FINAL"),
                    *resources(k.asm["cubin"])])
json.dump(out, sys.stdout)
"""


def test_the_layer_call_compiles_for_sm90_without_a_gpu_in_one_split_launch():
    """Every variant of the V4 layer call (one split launch over both caches, the combine) compiles for sm_90 on
    the CPU, and the one tile loop over both caches keeps the single-cache kernel's registers."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", _LAYER_COMPILE_SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(proc.stdout)
    layer = [r for r in rows if r[0] == "split" and r[1]]
    single = [r for r in rows if r[0] == "split" and not r[1]]
    assert {r[2] for r in layer} == {True, False}  # one split per row (no combine) and partials
    assert {r[0] for r in rows} == {"split", "combine"}
    assert all(r[4] == 0 for r in rows), rows  # no spill
    # the splits that write partials (every level of the shipped tables) keep the single-cache kernel's registers
    # (168 on Triton 3.6; a loop per cache took 222); one split per row, which writes the output, took 191
    most = max(r[3] for r in single)
    assert all(r[3] <= most for r in layer if not r[2]), rows
