"""The merge in the split launch (``MERGE=1``): the last program of a row merges its partials, no combine launch.

Against the fp32 reference with NaN-poisoned outputs and partials, at one and many splits, with -1 indices, ragged
``topk_length``, both formats, the balanced deal and the layer call (window + compressed cache + sink); bitwise
the same on a repeat; the counters back at zero after every call."""

import pytest
import torch

import sparse_mla_tuner.kernels.decode as decode
from sparse_mla_tuner.kernels import KernelConfig
from sparse_mla_tuner.kernels import Workload
from sparse_mla_tuner.kernels import make_batch
from sparse_mla_tuner.kernels.config import head_blocks_for
from sparse_mla_tuner.kernels.config import split_grid
from sparse_mla_tuner.kernels.decode import prepare_decode
from sparse_mla_tuner.kernels.reference import compare
from sparse_mla_tuner.kernels.reference import sparse_mla_decode_ref

# topk 100 at BLOCK_T 16: 7 tiles per row; c64 -> 7 splits of one tile, c4 at B=1 -> 4 splits (2, 2, 2, 1 tiles)
MERGED = KernelConfig(BLOCK_T=16, num_warps=4, num_stages=1, TARGET_CTAS=64, PREFETCH=2, MERGE=1)
# 7 tiles per row over 5 programs at B=3: runs cross row ends, rows use 2 or 3 of their 3 slots
MERGED_BALANCED = KernelConfig(BLOCK_T=16, num_warps=4, num_stages=1, TARGET_CTAS=5, PREFETCH=1, BALANCED=1, MERGE=1)


@pytest.fixture
def nan_outputs(monkeypatch):
    """Every float tensor the launcher allocates (out, lse, partials) starts as NaN."""
    real_empty = torch.empty

    def nan_empty(*shape, dtype=None, **kw):
        t = real_empty(*shape, dtype=dtype, **kw)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(decode.torch, "empty", nan_empty)


@pytest.fixture
def launches(monkeypatch):
    seen = []
    monkeypatch.setattr(decode, "LAUNCH_LISTENERS", [lambda name, cfg, grid: seen.append(name)])
    return seen


def _single(fmt, B, H, topk, device, seed):
    bt = make_batch(
        Workload(fmt, H, topk, page_size=64, context=300),
        B,
        device=device,
        seed=seed,
        with_topk_length=seed == 1,
        invalid_fraction=0.1,
        with_sink=seed == 1,  # with the -1 row of B=3: a sink on an empty row leaves it zero
    )
    bt.indices[0, 4] = -1
    if B == 3:
        bt.indices[1] = -1  # a row with no valid token
    return bt


def _run_checked(bt, cfg, **extra_kw):
    """Run the prepared call twice: both match the reference, bitwise alike, counters zero after each."""
    call = prepare_decode(*bt.args(), **bt.kwargs(), config=cfg, **extra_kw)
    out, lse = call()
    out, lse = out.clone(), lse.clone()
    assert call.plan.counters is not None and not call.plan.counters.any()
    ref_out, ref_lse = sparse_mla_decode_ref(*bt.args(), **bt.kwargs(), **extra_kw)
    ok, rel, lse_err, reason = compare(out, lse, ref_out, ref_lse)
    assert ok, reason
    for t in (call.plan.out, call.plan.lse, *call.plan.workspace):
        t.fill_(float("nan"))  # the repeat writes every element again
    out2, lse2 = call()
    assert torch.equal(out2, out) and torch.equal(lse2, lse)
    assert not call.plan.counters.any()
    return call, out, lse


@pytest.mark.parametrize(
    "fmt, B, H, cfg, seed",
    [
        ("fp8_model1", 1, 16, MERGED, 0),  # 7 splits of one tile
        ("fp8_v32", 3, 16, MERGED, 1),  # a -1 row, ragged topk_length: splits past a row's end merge as empty
        ("fp8_model1", 3, 48, MERGED.replace(TARGET_CTAS=8), 1),  # two head blocks (the second half masked), 2 splits
        ("fp8_v32", 1, 16, MERGED.replace(TARGET_CTAS=4, PREFETCH=3), 0),  # 4 splits of 2, 2, 2, 1 tiles
        ("fp8_model1", 3, 16, MERGED_BALANCED, 1),  # the balanced deal: programs of two rows, unused slots
        ("fp8_v32", 1, 64, MERGED_BALANCED.replace(PREFETCH=2), 0),  # two head blocks, each with its counter
    ],
)
def test_the_merged_call_matches_the_reference(fmt, B, H, cfg, seed, device, nan_outputs, launches):
    bt = _single(fmt, B, H, 100, device, seed)
    grid = split_grid(cfg, B, H, 100)
    assert grid.slots > 1
    call, out, lse = _run_checked(bt, cfg)
    assert launches == ["split", "split"]  # no combine launch, on either run
    assert call.plan.counters.numel() == B * head_blocks_for(H)
    if B == 3:
        assert torch.isposinf(lse[1]).all() and (out[1] == 0).all()


def test_one_split_per_row_runs_the_unmerged_kernel_and_touches_no_counter(device, nan_outputs, launches):
    """MERGE=1 at one split per row is the MERGE=0 binary (SplitGrid.binary): it writes the output itself."""
    bt = _single("fp8_model1", 3, 16, 100, device, 1)
    cfg = MERGED.replace(TARGET_CTAS=1)
    call = prepare_decode(*bt.args(), **bt.kwargs(), config=cfg)
    assert call.plan.counters is None
    (split,) = call.plan.launches
    assert split.constexprs["MERGE"] == 0 and split.constexprs["WRITE_FINAL"]
    out, lse = call()
    ref = sparse_mla_decode_ref(*bt.args(), **bt.kwargs())
    assert compare(out, lse, *ref)[0] and launches == ["split"]


@pytest.mark.parametrize("cfg", [MERGED, MERGED_BALANCED.replace(TARGET_CTAS=7)], ids=["per-row", "balanced"])
def test_the_layer_call_merges_window_compressed_and_sink_in_one_launch(cfg, device, nan_outputs, launches):
    """The V4 layer call's shape, small: a window cache and a compressed cache on other pages, a sink, two query
    tokens per request (rows of 2 + 4 tiles: c64 -> 6 splits per row; balanced: 7 programs over 4 rows)."""
    window = Workload("fp8_model1", 16, 32, page_size=32, context=64)
    compressed = Workload("fp8_model1", 16, 64, page_size=64, context=128)
    bt = make_batch(
        window, 2, device=device, seed=3, q_tokens=2, extra=compressed, with_sink=True, invalid_fraction=0.1
    )
    bt.extra_indices[1, 0] = -1  # one query token sees only its window
    call, out, lse = _run_checked(bt, cfg)
    assert launches == ["split", "split"]
    (split,) = call.plan.launches
    assert split.constexprs["MERGE"] == 1 and split.constexprs["HAS_SINK"] and split.constexprs["HAS_EXTRA"]
    # the same call through the combine gives the same answer within the gate (not the same bits: other code)
    sep = prepare_decode(*bt.args(), **bt.kwargs(), config=cfg.replace(MERGE=0))()
    assert compare(out, lse, *sep)[0]


def test_a_stale_counter_is_what_the_reset_prevents(device):
    """The counters decide which program merges: one left at 1 gives the last ticket to the row's next-to-last
    program, which merges before the last partial is written, and leaves the counter at 1 again. So the reset
    after every call (checked at 0 above) is what the next call's correctness rests on."""
    bt = _single("fp8_model1", 1, 16, 100, device, 0)
    ref = sparse_mla_decode_ref(*bt.args(), **bt.kwargs())
    call = prepare_decode(*bt.args(), **bt.kwargs(), config=MERGED)
    for t in (call.plan.out, call.plan.lse, *call.plan.workspace):
        t.fill_(float("nan"))
    call.plan.counters.fill_(1)
    out, lse = call()
    assert not compare(out, lse, *ref)[0]
    assert (call.plan.counters == 1).all()
    call.plan.counters.zero_()
    out, lse = call()
    assert compare(out, lse, *ref)[0]
    assert not call.plan.counters.any()


def test_whichever_program_merges_the_bits_are_the_same(device):
    """The merging program reads every slot back, its own included, in slot order: made to merge at another program
    (the counter started so that program k of 7 gets the last ticket, the partials already in place from the call
    before, which the later programs rewrite with the same bits), the output is bitwise the last program's."""
    bt = _single("fp8_model1", 1, 16, 100, device, 1)
    call = prepare_decode(*bt.args(), **bt.kwargs(), config=MERGED)
    n = call.plan.launches[0].grid[1]
    assert n == 7
    out, lse = (t.clone() for t in call())
    for k in (0, 3):
        call.plan.out.fill_(float("nan"))
        call.plan.counters.fill_(n - 1 - k)
        got, got_lse = call()
        assert torch.equal(got, out) and torch.equal(got_lse, lse), k
        call.plan.counters.zero_()


def test_prepared_calls_with_buffers_share_the_counters(device):
    bt = _single("fp8_v32", 1, 16, 100, device, 0)
    first = prepare_decode(*bt.args(), **bt.kwargs(), config=MERGED)
    second = prepare_decode(*bt.args(), **bt.kwargs(), config=MERGED, buffers=first)
    assert second.plan.counters.data_ptr() == first.plan.counters.data_ptr()
    first()
    out, lse = second()
    assert compare(out, lse, *sparse_mla_decode_ref(*bt.args(), **bt.kwargs()))[0]
    assert not first.plan.counters.any()


_COMPILE_SCRIPT = """
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
for key, batch in (("T16-w4-s1-c64-p2-m1", 1), ("T32-w4-s1-c256-p3-b1-m1", 40)):
    for spec in compile_spec(KernelConfig.parse(key), window, 90, batch, extra=compressed, attn_sink=True):
        k = triton.compile(ASTSource(spec.kernel, spec.signature, spec.constexprs, spec.attrs),
                           target=GPUTarget("cuda", 90, 32), options=spec.options)
        ptx = k.asm["ptx"]
        out.append([key, spec.name, spec.constexprs["MERGE"], spec.constexprs["BALANCED"],
                    "atom.global.gpu.acq_rel.add" in ptx, "ld.global.cg" in ptx, *resources(k.asm["cubin"])])
json.dump(out, sys.stdout)
"""


def test_the_merged_layer_call_compiles_for_sm90_with_an_acq_rel_counter():
    """Both deals of the merged layer call compile for sm_90 on the CPU as one launch each: the counter is an
    acquire/release atomic at GPU scope and the partials are read through L2 (``ld.global.cg``)."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(proc.stdout)
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        ("T16-w4-s1-c64-p2-m1", "split", 1, 0),
        ("T32-w4-s1-c256-p3-b1-m1", "split", 1, 1),
    ]
    assert all(r[4] and r[5] for r in rows), rows
    assert all(r[6] <= 255 for r in rows), rows
