"""The engine-facing call: attention sink, an extra cache in the same softmax, s_q query tokens per request."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton

import sparse_mla_tuner.kernels.decode as decode
from sparse_mla_tuner.kernels import KernelConfig
from sparse_mla_tuner.kernels import Workload
from sparse_mla_tuner.kernels import make_batch
from sparse_mla_tuner.kernels import sparse_mla_decode
from sparse_mla_tuner.kernels.reference import compare
from sparse_mla_tuner.kernels.reference import sparse_mla_decode_ref

ONE_SPLIT = KernelConfig(BLOCK_T=16, num_warps=4, num_stages=2, TARGET_CTAS=1)
MANY_SPLITS = KernelConfig(BLOCK_T=16, num_warps=4, num_stages=2, TARGET_CTAS=64)
CONFIGS = {"1split": ONE_SPLIT, "splits": MANY_SPLITS}

# the main cache on 64-token pages, the extra one on 16-token pages (as V4's SWA + compressed caches differ)
MAIN = {"fp8_model1": Workload("fp8_model1", 16, 64, page_size=64, context=300)}
MAIN["fp8_v32"] = Workload("fp8_v32", 16, 64, page_size=64, context=300)
EXTRA = {fmt: Workload(fmt, 16, 40, page_size=16, context=120) for fmt in MAIN}

VARIANTS = {
    "sink": {"with_sink": True},
    "extra": {"extra": True},
    "sq2": {"q_tokens": 2},
    "sq2-extra-sink-lengths": {"q_tokens": 2, "extra": True, "with_sink": True, "with_topk_length": True},
}


@pytest.fixture(autouse=True)
def poisoned(monkeypatch):
    """Outputs and partials start as NaN, so an element the kernels never write fails the comparison."""
    monkeypatch.setattr(decode, "POISON_OUTPUTS", True)


def _batch(fmt, B, device, seed=0, **kw):
    extra = EXTRA[fmt] if kw.pop("extra", False) else None
    return make_batch(MAIN[fmt], B, device=device, seed=seed, invalid_fraction=0.1, extra=extra, **kw)


def _check(bt, cfg, **overrides):
    kwargs = {**bt.kwargs(), **overrides}
    out, lse = sparse_mla_decode(*bt.args(), **kwargs, config=cfg)
    ref_out, ref_lse = sparse_mla_decode_ref(*bt.args(), **kwargs)
    assert out.shape == ref_out.shape and lse.shape == ref_lse.shape
    ok, rel, lse_err, reason = compare(out, lse, ref_out, ref_lse)
    assert ok, reason
    return out, lse


@pytest.mark.parametrize(
    "fmt, variant, cfg_name",
    [
        # each variant in both formats and under both configs, each format under both configs (pairwise: the
        # variants' code paths do not depend on the format and the config together; the sink, the extra cache and
        # s_q 2 together in both formats under both configs: test_invalid_and_out_of_range_indices_in_either_cache)
        pytest.param(fmt, variant, cfg_name, id=f"{fmt}-{variant}-{cfg_name}")
        for i, variant in enumerate(VARIANTS)
        for j, fmt in enumerate(["fp8_model1", "fp8_v32"])
        for cfg_name in [list(CONFIGS)[(i + j) % 2]]
    ],
)
def test_new_arguments_match_reference(fmt, variant, cfg_name, device):
    bt = _batch(fmt, 3, device, **VARIANTS[variant])
    out, lse = _check(bt, CONFIGS[cfg_name])
    s_q = VARIANTS[variant].get("q_tokens")
    if s_q:
        assert out.shape == (3, s_q, 16, 512) and lse.shape == (3, 16, s_q)
    else:
        assert out.shape == (3, 16, 512) and lse.shape == (3, 16)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32


@pytest.mark.parametrize("cfg_name", list(CONFIGS))
@pytest.mark.parametrize("fmt", ["fp8_model1", "fp8_v32"])
def test_invalid_and_out_of_range_indices_in_either_cache(fmt, cfg_name, device):
    bt = _batch(fmt, 3, device, extra=True, q_tokens=2, with_sink=True)
    n_main = bt.kv_cache.shape[0] * bt.kv_cache.shape[1]
    n_extra = bt.extra_kv_cache.shape[0] * bt.extra_kv_cache.shape[1]
    bt.indices[0, 0, :3] = torch.tensor([-1, -7, n_main], dtype=torch.int32)  # masked, never read
    bt.indices[1, 1, 5] = n_main + 1000
    bt.extra_indices[0, 1, :3] = torch.tensor([-1, n_extra, n_extra + 64], dtype=torch.int32)
    bt.indices[2, 0] = -1  # token (2, 0): nothing in the main cache, the extra cache alone
    bt.indices[2, 1] = -1  # token (2, 1): nothing in either cache
    bt.extra_indices[2, 1] = -1
    out, lse = _check(bt, CONFIGS[cfg_name])
    assert torch.isfinite(lse[2, :, 0]).all()
    assert torch.isposinf(lse[2, :, 1]).all() and (out[2, 1] == 0).all()  # the sink does not change that


@pytest.mark.parametrize("empty", ["main", "extra", "both"])
def test_topk_length_zero_on_one_cache(empty, device):
    bt = _batch("fp8_model1", 2, device, extra=True, with_topk_length=True, with_sink=True)
    if empty in ("main", "both"):
        bt.topk_length[0] = 0
    if empty in ("extra", "both"):
        bt.extra_topk_length[0] = 0
    out, lse = _check(bt, MANY_SPLITS)
    assert torch.isposinf(lse[0]).all() == (empty == "both")
    if empty == "main":  # request 0 is then exactly a call on the extra cache alone
        alone, alone_lse = sparse_mla_decode(
            bt.q,
            bt.extra_kv_cache,
            bt.extra_indices,
            kv_format="fp8_model1",
            topk_length=bt.extra_topk_length,
            attn_sink=bt.attn_sink,
            config=MANY_SPLITS,
        )
        assert torch.allclose(lse[0], alone_lse[0], atol=1e-5)
        assert (out[0].float() - alone[0].float()).abs().max() <= 1e-2


@pytest.mark.parametrize("cfg_name", list(CONFIGS))
@pytest.mark.parametrize("sink", ["+inf", "-inf", "finite"])
def test_sink_values(sink, cfg_name, device):
    bt = _batch("fp8_v32", 3, device)
    bt.indices[1] = -1  # an empty row stays zero with lse +inf whatever the sink
    plain_out, plain_lse = _check(bt, CONFIGS[cfg_name])
    value = {"+inf": float("inf"), "-inf": float("-inf"), "finite": 3.0}[sink]
    attn_sink = torch.full((16,), value, device=device)
    if sink == "finite":
        attn_sink[::2] = -2.5
    out, lse = _check(bt, CONFIGS[cfg_name], attn_sink=attn_sink)
    assert torch.equal(lse, plain_lse)  # lse is returned unchanged
    assert torch.isposinf(lse[1]).all() and (out[1] == 0).all()
    if sink == "+inf":
        assert (out == 0).all()
    elif sink == "-inf":
        assert torch.equal(out, plain_out)
    else:
        w = torch.sigmoid(lse[0] - attn_sink)  # exp(lse) / (exp(lse) + exp(sink))
        assert torch.allclose(out[0].float(), plain_out[0].float() * w[:, None], rtol=2e-2, atol=2e-3)


def test_sq2_rows_are_independent_tokens(device):
    """Each of the s_q tokens of a request is the 3-D call on that token (lse laid out [B, H, s_q])."""
    bt = _batch("fp8_model1", 2, device, q_tokens=2, with_topk_length=True)
    out, lse = _check(bt, ONE_SPLIT)
    for s in range(2):
        o1, l1 = sparse_mla_decode(
            bt.q[:, s], bt.kv_cache, bt.indices[:, s].contiguous(), kv_format="fp8_model1",
            topk_length=bt.topk_length, config=ONE_SPLIT,
        )  # fmt: skip
        assert torch.equal(out[:, s], o1) and torch.equal(lse[:, :, s], l1)


def test_3d_form_unchanged_with_extra_and_sink(device):
    """The 3-D form takes the new arguments too and keeps its shapes."""
    bt = _batch("fp8_v32", 2, device, extra=True, with_sink=True)
    assert bt.q.dim() == 3 and bt.extra_indices.dim() == 2
    out, lse = _check(bt, MANY_SPLITS)
    assert out.shape == (2, 16, 512) and lse.shape == (2, 16)


def test_extra_cache_of_another_page_size_and_format(device):
    """Another page size works; another format has another head dim (512 vs 576), which one q cannot serve."""
    bt = _batch("fp8_model1", 2, device)
    other = make_batch(Workload("fp8_model1", 16, 24, page_size=8, context=50), 2, device=device, seed=3)
    _check(bt, MANY_SPLITS, extra_kv_cache=other.kv_cache, extra_indices=other.indices, extra_kv_format="fp8_model1")
    v32 = make_batch(Workload("fp8_v32", 16, 24, page_size=8, context=50), 2, device=device, seed=3)
    with pytest.raises(ValueError, match="both caches must share q's head dim"):
        sparse_mla_decode(*bt.args(), kv_format="fp8_model1", extra_kv_cache=v32.kv_cache,
                          extra_indices=v32.indices, extra_kv_format="fp8_v32")  # fmt: skip


def test_bad_call_arguments_raise_value_error(device):
    bt = _batch("fp8_model1", 2, device, q_tokens=2, extra=True)
    kw = bt.kwargs()
    with pytest.raises(ValueError, match=r"attn_sink must be a \[16\] float32"):
        sparse_mla_decode(*bt.args(), **{**kw, "attn_sink": torch.zeros(8, device=device)})
    with pytest.raises(ValueError, match=r"extra_indices must be a contiguous \[2, 2, topk\] int32"):
        sparse_mla_decode(*bt.args(), **{**kw, "extra_indices": bt.extra_indices[:, 0]})
    with pytest.raises(ValueError, match=r"extra_topk_length must be a \[2\] int32"):
        sparse_mla_decode(*bt.args(), **{**kw, "extra_topk_length": torch.ones(3, dtype=torch.int32)})
    with pytest.raises(ValueError, match="must be given together"):
        sparse_mla_decode(*bt.args(), **{**kw, "extra_indices": None})


_COMPILE_SCRIPT = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from sparse_mla_tuner.kernels.config import KernelConfig
from sparse_mla_tuner.kernels.decode import compile_spec
from sparse_mla_tuner.kernels.workload import Workload

main = Workload("fp8_model1", 16, 128, page_size=256, context=4096)
extra = Workload("fp8_model1", 16, 512, page_size=64, context=2048)
rows = []
for spec in compile_spec(KernelConfig(), main, "sm_120", extra=extra, attn_sink=True, q_tokens=2,
                         topk_length=True, extra_topk_length=True):
    k = triton.compile(ASTSource(spec.kernel, spec.signature, spec.constexprs, spec.attrs),
                       target=GPUTarget("cuda", 120, 32), options=spec.options)
    c = spec.constexprs
    rows.append([spec.name, c.get("PAGE_SIZE"), c.get("WRITE_FINAL"), c.get("HAS_SINK"), k.metadata.shared,
                 c.get("LATE_TRIGGER"), c.get("X_PAGE_SIZE"), c.get("HAS_EXTRA")])
plain = compile_spec(KernelConfig(), main, "sm_120")
sq2 = compile_spec(KernelConfig(), main, "sm_120", q_tokens=2)
at = {n: sorted({s.constexprs["LATE_TRIGGER"]
                  for s in compile_spec(KernelConfig(), main, "sm_120", batch=8, sms=n, extra=extra)
                  if s.name == "split"}) for n in (None, 132, 1000)}
json.dump({"rows": rows, "sq_same_binaries": [s.key() for s in plain] == [s.key() for s in sq2],
           "late_at_batch_8": {str(n): v for n, v in at.items()}}, sys.stdout)
"""


_COMPILE_RUNNER = """
import contextlib, io, json, sys, traceback
out = {}
for name, script in json.load(sys.stdin).items():
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            exec(compile(script, name, "exec"), {"__name__": "__main__"})
        out[name] = {"ok": json.loads(buf.getvalue())}
    except BaseException:
        out[name] = {"error": traceback.format_exc()}
json.dump(out, sys.stdout)
"""


@pytest.fixture(scope="module")
def compile_only():
    """Each compile-only script's JSON output (below: the variants, the registers, the arches), all run in one
    process without TRITON_INTERPRET (so that @triton.jit compiles): one interpreter start for the three, each
    script in its own namespace, its error reported to its own test."""
    scripts = {"variants": _COMPILE_SCRIPT, "registers": _REGISTERS_SCRIPT, "arch": _ARCH_SCRIPT}
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[1]
    res = subprocess.run(
        [sys.executable, "-c", _COMPILE_RUNNER], input=json.dumps(scripts), cwd=root, env=env, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    done = json.loads(res.stdout)

    def get(name: str) -> dict:
        assert "error" not in done[name], done[name]["error"][-2000:]
        return done[name]["ok"]

    return get


def test_compile_spec_lists_the_new_variants_and_they_compile_for_sm120(compile_only):
    """compile_spec on meta tensors for a call with an extra cache, a sink and s_q = 2 (compiled, not run)."""
    got = compile_only("variants")
    variants = {tuple(r[:4]) for r in got["rows"]}
    # one split launch walks both caches, each with its own page size; with one split per row it writes the
    # output and applies the sink itself, else the combine applies the sink
    assert {r[0] for r in got["rows"]} == {"split", "combine"}
    assert all((r[1], r[6], r[7]) == (256, 64, True) for r in got["rows"] if r[0] == "split"), got["rows"]
    assert ("split", 256, True, True) in variants and ("split", 256, False, False) in variants
    assert {r[3] for r in got["rows"] if r[0] == "combine"} == {True}
    assert all(r[4] <= 101_376 for r in got["rows"]), got["rows"]
    # both triggers of the split kernel (late: with more split programs than SMs), the same shared memory
    split = {r[5]: r[4] for r in got["rows"] if r[0] == "split" and not r[2]}
    assert split[False] == split[True], split
    # at a batch the GPU's SMs decide: 8 rows of the default config over both caches' 8 + 32 tiles are 20 splits
    # of 2 tiles each, 160 programs; SMs unknown: the early trigger
    assert got["late_at_batch_8"] == {"None": [False], "132": [True], "1000": [False]}
    assert got["sq_same_binaries"]  # s_q changes the grid, not the binary


_REGISTERS_SCRIPT = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from sparse_mla_tuner.kernels.config import KernelConfig
from sparse_mla_tuner.kernels.decode import compile_spec
from sparse_mla_tuner.kernels.workload import Workload
from sparse_mla_tuner.tuner.compile_process import resources

out = {}
for name in ("T16-w4-s1-c512-p2", "T32-w4-s1-c512-p1"):
    for spec in compile_spec(KernelConfig.parse(name), Workload("fp8_model1", 16, 512), "sm_120", batch=96, sms=132):
        if spec.name == "split":
            k = triton.compile(ASTSource(spec.kernel, spec.signature, spec.constexprs, spec.attrs),
                               target=GPUTarget("cuda", 120, 32), options=spec.options)
            out[name] = resources(k.asm["cubin"])
json.dump(out, sys.stdout)
"""


def test_fp8_model1_dots_in_chunks_keep_the_split_kernel_lean_for_sm120(compile_only):
    """fp8_model1's dots over four chunks of 128 dims, not one over 512, so no warp holds the whole q operand.

    With one dot, T16-w4-s1-p2's split kernel took 254 registers per thread and T32-w4-s1-p1's 255 with a 64 B
    stack (spills); in chunks they take 168 and 255 without a stack (compiled for sm_120 on Triton 3.6)."""
    got = compile_only("registers")
    regs, stack = got["T16-w4-s1-c512-p2"]
    if triton.__version__.startswith("3.6."):
        assert regs <= 200 and stack == 0, got
        assert got["T32-w4-s1-c512-p1"][1] == 0, got  # no spill
    else:
        # Triton 3.9.0 allocates more: 232 registers without a stack for T16-p2, and T32-p1 spills 144 B
        # (compiled for sm_120, 2026-12-01). Still no stack for T16-p2; the spill is for the GPU issue to weigh.
        assert regs <= 255 and stack == 0, got


_ARCH_SCRIPT = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from sparse_mla_tuner.kernels.config import KernelConfig
from sparse_mla_tuner.kernels.decode import compile_spec
from sparse_mla_tuner.kernels.workload import Workload

out = []
cases = [("T32-w4-s1-c512-p1", Workload("fp8_model1", 16, 512)), ("T16-w4-s2-c256-b1", Workload("fp8_v32", 16, 2048))]
for key, wl in cases:
    for cc in (90, 120):
        for spec in compile_spec(KernelConfig.parse(key), wl, cc):
            k = triton.compile(ASTSource(spec.kernel, spec.signature, spec.constexprs, spec.attrs),
                               target=GPUTarget("cuda", cc, 32), options=spec.options)
            out.append([key, cc, spec.name, k.metadata.shared, len(k.asm["cubin"]), triton.__version__])
json.dump(out, sys.stdout)
"""


def test_every_kernel_variant_compiles_for_sm90_and_sm120(compile_only):
    """The split and combine kernels of both formats (every variant a call can launch) compile for sm_90 and
    sm_120 with the installed Triton (3.6.0 and 3.9.0 in .ci/run), without a GPU."""
    got = compile_only("arch")
    assert {(r[0], r[1]) for r in got} == {
        (k, cc) for k in ("T32-w4-s1-c512-p1", "T16-w4-s2-c256-b1") for cc in (90, 120)
    }
    for key, cc, name, shared, cubin, version in got:
        assert name in ("split", "combine") and cubin > 0, (key, cc, name)
        assert shared <= 101376 or cc == 90, (key, cc, name, shared)  # fits sm_120's shared memory
        assert version == triton.__version__
    assert {r[2] for r in got} == {"split", "combine"}


# --- the whole call in one split launch ------------------------------------------------------------------------


def _one_launch_batch(fmt, B, device, seed=0, x_page=16, **kw):
    """main: 40 tokens = 3 tiles of 16 (the last one ragged); extra: 40 tokens = 3 more tiles, on pages of
    ``x_page`` tokens (64, the main cache's: one loop over one page layout; 16: one loop over two layouts; 3, a page
    stride of no whole 16-byte units: one loop per cache)."""
    main = Workload(fmt, 16, 40, page_size=64, context=200)
    extra = Workload(fmt, 16, 40, page_size=x_page, context=96)
    return make_batch(main, B, device=device, seed=seed, invalid_fraction=0.1, extra=extra, **kw)


def _launches(monkeypatch):
    seen = []
    monkeypatch.setattr(decode, "LAUNCH_LISTENERS", [lambda kind, cfg, grid: seen.append((kind, grid))])
    return seen


@pytest.mark.parametrize("target", [1, 2, 3, 6, 64])
def test_both_caches_are_one_split_launch_and_one_combine(target, monkeypatch, device):
    """Whatever the split count, a call over two caches is one split launch (then one combine, unless one split)."""
    bt = _one_launch_batch("fp8_model1", 1, device, with_sink=True)
    seen = _launches(monkeypatch)
    _check(bt, KernelConfig(16, 4, 1, target))
    kinds = [k for k, _ in seen]
    splits = seen[0][1][1]  # grid (rows * head_blocks, splits)
    assert kinds == (["split"] if splits == 1 else ["split", "combine"])
    assert splits == {1: 1, 2: 2, 3: 3, 6: 6, 64: 6}[target]  # the row's 6 tiles, both caches, dealt together


ONE_LAUNCH_CONFIGS = [
    "T16-w4-s1-c2",  # 2 splits of 3 tiles: one per cache
    "T16-w4-s1-c4",  # 3 splits of 2 tiles: the middle one ends the main cache and starts the extra one
    "T16-w4-s1-c5-p1",
    "T16-w4-s1-c5-p2",
    "T16-w4-s1-c5-p3",
    "T32-w4-s1-c1",  # one split: the sink applied by the split kernel, no combine
    "T16-w4-s2-c7-b1",  # balanced: runs cross rows and caches
    "T16-w4-s1-c16-p1-b1",
]


def _one_launch_cases():
    """Every config with both formats and s_q 1 and 2, fp8_model1's extra cache on both page layouts.

    fp8_model1 walks two page layouts in one loop (x_page 16) or one (x_page 64): every config on both layouts,
    s_q 1 on one and 2 on the other (so each config and each layout sees both s_q). fp8_v32 addresses its rows by
    token, not by page: the extra cache's page size never enters its loop (x_page 16 ran the same code as 64), so
    its configs run on one layout, each with both s_q."""
    for i, cfg in enumerate(ONE_LAUNCH_CONFIGS):
        for x_page in (16, 64):
            q_tokens = 2 if (i + (x_page == 64)) % 2 else None
            yield pytest.param("fp8_model1", cfg, q_tokens, x_page, id=f"fp8_model1-{cfg}-{q_tokens}-{x_page}")
        for q_tokens in (None, 2):
            yield pytest.param("fp8_v32", cfg, q_tokens, 64, id=f"fp8_v32-{cfg}-{q_tokens}-64")


@pytest.mark.parametrize("fmt, cfg, q_tokens, x_page", list(_one_launch_cases()))
def test_one_launch_matches_the_reference(fmt, cfg, q_tokens, x_page, device):
    """Splits that straddle the two caches, ragged topk_length on each cache, -1 rows, the sink, s_q 1 and 2."""
    kw = {"q_tokens": q_tokens, "with_sink": True, "with_topk_length": True}
    bt = _one_launch_batch(fmt, 3, device, seed=1, x_page=x_page, **kw)
    bt.topk_length[:] = torch.tensor([40, 17, 0], dtype=torch.int32)  # ragged; request 2: the extra cache alone
    bt.extra_topk_length[:] = torch.tensor([5, 40, 33], dtype=torch.int32)
    idx, xidx = bt.indices.view(3, -1, 40), bt.extra_indices.view(3, -1, 40)
    idx[1, -1] = -1  # request 1's last token: main cache all -1, the extra cache alone
    xidx[0, 0] = -1  # request 0's first token: the main cache alone
    out, lse = _check(bt, KernelConfig.parse(cfg))
    assert torch.isfinite(lse).all()


@pytest.mark.parametrize("cfg", ["T16-w4-s1-c4", "T16-w4-s1-c5-p3", "T16-w4-s2-c7-b1"])
def test_one_launch_over_unaligned_pages_walks_a_loop_per_cache_and_matches_the_reference(cfg, device):
    """Pages of 3 tokens (a 1752-byte stride, no whole 16-byte units): the two-loop path, same contract."""
    kw = {"q_tokens": 2, "with_sink": True, "with_topk_length": True}
    bt = _one_launch_batch("fp8_model1", 3, device, seed=2, x_page=3, **kw)
    assert bt.extra_kv_cache.stride(0) % 16 != 0
    bt.topk_length[:] = torch.tensor([40, 17, 0], dtype=torch.int32)
    bt.extra_topk_length[:] = torch.tensor([5, 40, 33], dtype=torch.int32)
    bt.extra_indices.view(3, -1, 40)[0, 0] = -1
    out, lse = _check(bt, KernelConfig.parse(cfg))
    assert torch.isfinite(lse).all()


@pytest.mark.parametrize("cfg", ["T16-w4-s1-c4", "T16-w4-s1-c5-p3"])
def test_one_launch_over_two_layouts_of_any_page_size_matches_the_reference(cfg, device):
    """Pages of 24 tokens (a 14016-byte stride, whole 16-byte units, not a power of two) beside the main cache's
    64: one loop over both layouts, dividing by each page size (powers of two shift instead), same contract."""
    kw = {"q_tokens": 2, "with_sink": True, "with_topk_length": True}
    bt = _one_launch_batch("fp8_model1", 3, device, seed=4, x_page=24, **kw)
    assert bt.extra_kv_cache.stride(0) % 16 == 0 and bt.extra_kv_cache.shape[1] == 24
    bt.topk_length[:] = torch.tensor([40, 17, 0], dtype=torch.int32)
    bt.extra_topk_length[:] = torch.tensor([5, 40, 33], dtype=torch.int32)
    bt.extra_indices.view(3, -1, 40)[0, 0] = -1
    out, lse = _check(bt, KernelConfig.parse(cfg))
    assert torch.isfinite(lse).all()


@pytest.mark.parametrize("x_page", [16, 64])
@pytest.mark.parametrize("cfg", ["T16-w4-s1-c1", "T16-w4-s1-c4", "T16-w4-s1-c7-b1"])
def test_rows_empty_in_both_caches_are_zero_with_the_sink(cfg, x_page, device):
    bt = _one_launch_batch("fp8_model1", 2, device, x_page=x_page, q_tokens=2, with_sink=True)
    bt.indices[1, 0] = -1
    bt.extra_indices[1, 0] = -1
    out, lse = _check(bt, KernelConfig.parse(cfg))
    assert torch.isposinf(lse[1, :, 0]).all() and (out[1, 0] == 0).all()
    assert torch.isfinite(lse[0]).all() and torch.isfinite(lse[1, :, 1]).all()


def test_one_launch_split_geometry_counts_both_caches():
    from sparse_mla_tuner.kernels.config import launch_identity
    from sparse_mla_tuner.kernels.config import split_grid

    cfg = KernelConfig(16, 4, 1, 64)
    assert split_grid(cfg, 1, 16, 40, 40).slots == 6  # 3 + 3 tiles
    assert split_grid(cfg, 1, 16, 40).slots == 3  # the single-cache geometry is unchanged
    assert split_grid(cfg.replace(TARGET_CTAS=4), 1, 16, 40, 40).tiles_per_split == 2
    # two targets the per-cache geometry could not tell apart launch differently over both caches
    a, b = cfg.replace(TARGET_CTAS=3 * 16), cfg.replace(TARGET_CTAS=6 * 16)
    assert launch_identity(a, 16, 40, 16) == launch_identity(b, 16, 40, 16)
    assert launch_identity(a, 16, 40, 16, 40) != launch_identity(b, 16, 40, 16, 40)


@pytest.mark.parametrize("padded", ["both", "main"])
def test_padded_pages_in_the_one_launch_give_the_contiguous_result(padded, device):
    """SGLang's padded fp8_model1 pages: both caches padded alike, or a padded main cache beside a contiguous
    extra one (two page strides, one loop): either way the contiguous caches' result, exactly."""
    from sparse_mla_tuner.kernels.sglang_plugin import engine_cache

    bt = _one_launch_batch("fp8_model1", 2, device, x_page=64, with_sink=True, with_topk_length=True)
    cfg = KernelConfig.parse("T16-w4-s1-c4-p1")  # 3 splits of 2 tiles: the middle one in both caches
    want = sparse_mla_decode(*bt.args(), **bt.kwargs(), config=cfg)
    kw = bt.kwargs()
    main = engine_cache(bt.kv_cache, torch.uint8).squeeze(2)
    if padded == "both":
        kw["extra_kv_cache"] = engine_cache(bt.extra_kv_cache, torch.uint8).squeeze(2)
    got = sparse_mla_decode(bt.q, main, bt.indices, **{k: v for k, v in kw.items() if k != "kv_format"},
                            kv_format="fp8_model1", config=cfg)  # fmt: skip
    assert not main.is_contiguous()
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
