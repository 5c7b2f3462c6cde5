"""Kernel against the torch reference (interpreter on the CPU, compiled on a GPU)."""

import pytest
import torch
import triton
import triton.language as tl

import sparse_mla_tuner.kernels.decode as decode
from sparse_mla_tuner.kernels import KernelConfig
from sparse_mla_tuner.kernels import Workload
from sparse_mla_tuner.kernels import make_batch
from sparse_mla_tuner.kernels import sparse_mla_decode
from sparse_mla_tuner.kernels.config import effective_config
from sparse_mla_tuner.kernels.config import launch_identity
from sparse_mla_tuner.kernels.config import num_splits_for
from sparse_mla_tuner.kernels.config import split_grid
from sparse_mla_tuner.kernels.kv_format import get_format
from sparse_mla_tuner.kernels.reference import compare
from sparse_mla_tuner.kernels.reference import sparse_mla_decode_ref
from sparse_mla_tuner.kernels.table import lookup_config
from sparse_mla_tuner.kernels.table import table_name

ONE_SPLIT = KernelConfig(BLOCK_T=16, num_warps=4, num_stages=2, TARGET_CTAS=1)
MANY_SPLITS = KernelConfig(BLOCK_T=16, num_warps=4, num_stages=2, TARGET_CTAS=64)
# register prefetch, with splits of several tiles and an uneven last split (the prefetch past a split's
# end must be fully masked): topk 100 at BLOCK_T 16 is 7 tiles, in 4 splits at B=1 and 2 at B=3
PREFETCH_SPLITS = KernelConfig(BLOCK_T=16, num_warps=4, num_stages=1, TARGET_CTAS=4, PREFETCH=1)
INDEX_PREFETCH_SPLITS = PREFETCH_SPLITS.replace(PREFETCH=2)  # the next tile's indices only
DEEP_PREFETCH_SPLITS = PREFETCH_SPLITS.replace(PREFETCH=3)  # and the indices of the tile after it
# the balanced deal: 7 tiles per row over 5 programs at B=3 (runs of 4 or 5 tiles, crossing row ends;
# rows use 2 or 3 of their 3 slots, so the combine must skip the unused one) and over 3 at B=1
BALANCED_RUNS = PREFETCH_SPLITS.replace(TARGET_CTAS=5, BALANCED=1)

CASES = [
    pytest.param(fmt, B, H, topk, cfg, id=f"{fmt}-B{B}-H{H}-topk{topk}-{name}")
    for fmt in ("fp8_model1", "fp8_v32")
    for B in (1, 3)
    for H in (16, 32)
    for topk in (64, 100)
    for name, cfg in (
        ("1split", ONE_SPLIT),
        ("splits", MANY_SPLITS),
        ("prefetch", PREFETCH_SPLITS),
        ("index-prefetch", INDEX_PREFETCH_SPLITS),
        ("deep-prefetch", DEEP_PREFETCH_SPLITS),
        ("balanced", BALANCED_RUNS),
        ("balanced-index-prefetch", BALANCED_RUNS.replace(PREFETCH=2)),
        ("balanced-deep-prefetch", BALANCED_RUNS.replace(PREFETCH=3)),
        ("balanced-staged", BALANCED_RUNS.replace(PREFETCH=0, num_stages=2)),  # fp8_v32's byte loads
    )
    # two head blocks (H=32) at the uneven topk only; the prefetch's loop is the same at every head count;
    # the index prefetch's uneven last split is at B=3; the balanced deal at both batch sizes and at two
    # head blocks with the register prefetch; the staged balanced loop for fp8_v32's byte loads; the deeper
    # prefetch (3) at both batch sizes
    if ((H, topk) != (32, 64) and not ("prefetch" in name or "balanced" in name))
    or (
        (H, topk) == (16, 100)
        and (name in ("prefetch", "deep-prefetch") or B == 3)
        and (name, fmt) != ("balanced-staged", "fp8_model1")
    )
    or (name == "balanced" and topk == 100 and (B, H) != (1, 32))
]


@pytest.fixture
def nan_outputs(monkeypatch):
    """Every float tensor the launcher allocates (out, lse, partials) starts as NaN."""
    real_empty = torch.empty

    def nan_empty(*shape, dtype=None, **kw):
        t = real_empty(*shape, dtype=dtype, **kw)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(decode.torch, "empty", nan_empty)


def _batch(fmt, B, H, topk, device, seed=0):
    bt = make_batch(
        Workload(fmt, H, topk, page_size=64, context=300),
        B,
        device=device,
        seed=seed,
        with_topk_length=(seed % 2 == 1),
        invalid_fraction=0.1,
    )
    num_tokens = bt.kv_cache.shape[0] * bt.kv_cache.shape[1]
    bt.indices[0, 3] = num_tokens  # just past the cache: masked, never read
    bt.indices[0, 4] = -7
    if B == 3:
        bt.indices[1] = -1  # a row with no valid token
    return bt


def _seeded(cases):
    """Each case with the seeds it runs: 0 (every row's full topk) and 1 (a ragged topk_length per row, other data).

    The prefetch and balanced variants at B=3, H=16, topk 100 (a -1 row, splits of several tiles, uneven last
    splits) run both seeds. The one-split and split configs run their six shapes once each, the seeds
    alternating so that B 1 and 3, H 16 and 32 and topk 64 and 100 each get both; the variants' other shapes
    (B=1, two head blocks) run one seed each, alternating per variant."""
    out = []
    for i, case in enumerate(cases):
        fmt, B, H, topk, cfg = case.values
        name = case.id.split("-", 4)[-1]
        if (B, H, topk) == (3, 16, 100) and name not in ("1split", "splits"):
            seeds = (0, 1)
        elif name in ("1split", "splits"):
            seeds = (int((B == 3) ^ (topk == 100) ^ (H == 32)),)
        else:
            seeds = (i % 2,)
        out += [pytest.param(*case.values, seed, id=f"{('full', 'topk_length')[seed]}-{case.id}") for seed in seeds]
    return out


@pytest.mark.parametrize("fmt, B, H, topk, cfg, seed", _seeded(CASES))
def test_kernel_matches_reference(fmt, B, H, topk, cfg, seed, device, nan_outputs):
    bt = _batch(fmt, B, H, topk, device, seed)
    out, lse = sparse_mla_decode(*bt.args(), **bt.kwargs(), config=cfg)
    ref_out, ref_lse = sparse_mla_decode_ref(*bt.args(), **bt.kwargs())
    ok, rel, lse_err, reason = compare(out, lse, ref_out, ref_lse)
    assert ok, reason
    if B == 3:
        assert torch.isposinf(lse[1]).all() and (out[1] == 0).all()
    assert out.shape == (B, H, 512) and out.dtype == torch.bfloat16 and lse.dtype == torch.float32


SHAPES = {  # module constants -> the combine's (CHUNK_S, BLOCK_D) for MANY_SPLITS (7 splits) and BALANCED_RUNS (3)
    "one-split-per-iteration": ({"COMBINE_TILE_MAX_ROWS": 0, "COMBINE_UNROLL_MAX_ROWS": 0}, (1, 512), (1, 512)),
    "rows-of-512": ({}, (8, 512), (4, 512)),
    "tile-of-all-splits": ({"COMBINE_TILE_MIN_SPLITS": 2}, (8, 64), (4, 64)),
    "tile-in-two-iterations": ({"COMBINE_TILE_MIN_SPLITS": 2, "COMBINE_TILE": 256}, (4, 64), (4, 64)),
}


@pytest.mark.parametrize("cfg", [MANY_SPLITS, BALANCED_RUNS], ids=["splits", "balanced"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_shape_of_the_combine_matches_the_reference(cfg, shape, monkeypatch, nan_outputs):
    """The combine's code paths, forced on these small calls by its constants: one split per iteration (as
    large calls run), rows of 512 (8 at a time), and the tile of splits x 64 columns, in one iteration or in
    two. 7 splits under 8 (or 2 x 4), and the balanced deal's 3 slots (one unused in some rows) under 4,
    leave masked lanes."""
    constants, want_splits, want_balanced = SHAPES[shape]
    for name, value in constants.items():
        monkeypatch.setattr(decode, name, value)
    seen = []
    monkeypatch.setattr(decode, "LAUNCH_LISTENERS", [lambda kind, c, grid: seen.append(kind)])
    real_plan = decode._plan
    shapes = []

    def spy(*args, **kwargs):
        plan = real_plan(*args, **kwargs)
        shapes.extend((x.constexprs["CHUNK_S"], x.constexprs["BLOCK_D"]) for x in plan.launches if x.name == "combine")
        return plan

    monkeypatch.setattr(decode, "_plan", spy)
    bt = _batch("fp8_v32", 3, 16, 100, "cpu", seed=1)
    out, lse = sparse_mla_decode(*bt.args(), **bt.kwargs(), config=cfg)
    assert seen[-1] == "combine" and shapes == [want_splits if cfg is MANY_SPLITS else want_balanced]
    ok, _, _, reason = compare(out, lse, *sparse_mla_decode_ref(*bt.args(), **bt.kwargs()))
    assert ok, reason
    assert torch.isposinf(lse[1]).all() and (out[1] == 0).all()


def test_the_combine_tiles_only_calls_of_many_splits_and_few_rows():
    """The rule, on the plans (meta tensors, nothing runs) of calls too large to run here: the tile of splits x
    64 columns from 32 splits up to 4096 partial rows (rows x heads x splits), 8 rows of 512 up to 32 splits
    and 1024 partial rows, one row beyond."""
    v32 = Workload("fp8_v32", 16, 2048, 64, 8192)

    def shape(config, rows):
        q = torch.empty(rows, 1, 16, 576, dtype=torch.bfloat16, device="meta")
        cache = decode._meta_cache(v32, rows, 1, False)
        plan = decode._plan(q, [cache], None, KernelConfig.parse(config), 1.0, native=True, pdl=True)
        return [
            (x.grid, x.constexprs["CHUNK_S"], x.constexprs["BLOCK_D"]) for x in plan.launches if x.name == "combine"
        ]

    assert shape("T64-w8-s1-c256-p1", 1) == [((16, 8), 32, 64)]  # 32 splits x 16 heads: 512 partial rows
    assert shape("T64-w8-s1-c256-p1", 2) == [((32, 8), 32, 64)]  # 1024
    assert shape("T64-w4-s2-c512", 4) == [((64, 8), 32, 64)]  # 2048
    assert shape("T64-w8-s1-c256-p1", 8) == [((128, 8), 32, 64)]  # 4096
    assert shape("T64-w8-s1-c256-p1", 16) == [((256, 1), 1, 512)]  # 8192
    assert shape("T32-w4-s1-c256-p1", 1) == [((16, 8), 64, 64)]  # 64 splits
    assert shape("T16-w4-s1-c1024", 1) == [((16, 8), 64, 64)]  # 128 splits, two tiles of 64
    assert shape("T64-w8-s1-c16", 1) == [((16, 1), 8, 512)]  # 16 splits
    assert shape("T64-w8-s1-c64-p1", 8) == [((128, 1), 8, 512)]  # 8 splits at 8 rows: 1024
    assert shape("T64-w8-s1-c128-p1", 8) == [((128, 1), 1, 512)]  # 16 splits at 8 rows: 2048
    assert shape("T32-w4-s1-c256-p1", 96) == [((1536, 1), 1, 512)]


def test_corrupt_scale_byte_is_caught(device):
    """The comparison can fail: one scale byte of one referenced token changed by x4 must be caught."""
    bt = _batch("fp8_model1", 1, 16, 64, device)
    ref_out, ref_lse = sparse_mla_decode_ref(*bt.args(), **bt.kwargs())
    tok = int(bt.indices[0, 0])
    page, off = divmod(tok, 64)
    bad = bt.kv_cache.clone()
    bad[page, :, :].view(-1)[64 * 576 + off * 8] += 2  # ue8m0 exponent + 2: that group's values x 4
    out, lse = sparse_mla_decode(bt.q, bad, bt.indices, kv_format="fp8_model1", config=ONE_SPLIT)
    ok, _, _, reason = compare(out, lse, ref_out, ref_lse)
    assert not ok and reason


def test_splits_formula_and_skipped_empty_splits():
    cfg = KernelConfig(BLOCK_T=16, num_warps=4, num_stages=2, TARGET_CTAS=256)
    assert num_splits_for(cfg, batch=96, heads=16, topk=512) == (3, 11)  # ceil(256/96) = 3
    assert num_splits_for(cfg, batch=1, heads=16, topk=512) == (32, 1)  # clamped at ceil(512/16)
    assert num_splits_for(cfg, batch=1000, heads=16, topk=512) == (1, 32)
    # 4 tiles over 3 requested splits: 2 tiles each, so only 2 splits are launched
    assert num_splits_for(KernelConfig(16, 4, 2, 3), batch=1, heads=16, topk=64) == (2, 2)
    assert num_splits_for(cfg, batch=8, heads=64, topk=512) == (16, 2)  # 64 heads = 2 head blocks


@pytest.mark.parametrize("row_tiles", [1, 2, 7, 16, 64])
@pytest.mark.parametrize("rows", [1, 3, 96])
def test_balanced_grid_deals_every_tile_once_and_bounds_the_slots(rows, row_tiles):
    """The deal of the balanced kernel, in its integer arithmetic: runs of floor or ceil(units / programs)
    tiles cover each tile once, every row's programs fit its slots, and a run touches at most two rows."""
    topk = row_tiles * 16
    for target in (rows + 1, 2 * rows + 1, 5 * rows, 1000):
        grid = split_grid(KernelConfig(16, 4, 1, target, BALANCED=1), rows, 16, topk)
        if row_tiles == 1:  # no more tiles than rows: nothing to balance
            assert not grid.balanced and grid.programs == rows
            continue
        assert grid.balanced and rows < grid.programs <= min(target, rows * row_tiles)
        units = rows * row_tiles
        runs = [(c * units // grid.programs, (c + 1) * units // grid.programs) for c in range(grid.programs)]
        assert [u for a, b in runs for u in range(a, b)] == list(range(units))
        assert {b - a for a, b in runs} <= {units // grid.programs, -(-units // grid.programs)}
        assert all((b - 1) // row_tiles - a // row_tiles <= 1 for a, b in runs)
        for r in range(rows):
            users = [c for c, (a, b) in enumerate(runs) if a < (r + 1) * row_tiles and b > r * row_tiles]
            first = ((r * row_tiles + 1) * grid.programs - 1) // units  # the kernel's inverse of the deal
            assert users[0] == first and len(users) <= grid.slots
    # a target of no more programs than rows: the per-row kernel, one program per row
    grid = split_grid(KernelConfig(16, 4, 1, rows, BALANCED=1), rows, 16, topk)
    assert not grid.balanced and (grid.programs, grid.slots) == (rows, 1)
    cfg = KernelConfig(16, 4, 1, rows, BALANCED=1)
    assert effective_config(cfg, rows, 16, topk) == cfg.replace(BALANCED=0)
    assert launch_identity(cfg, 16, topk, rows) == launch_identity(cfg.replace(BALANCED=0), 16, topk, rows)


def test_the_interpreter_patches_the_language_once_per_launch_and_module(monkeypatch):
    """kernels/_interpreter.py: a jit-function call rebinds triton.language only the first time its module is
    called in a launch (Triton 3.6 rebinds it at every call, about a third of the interpreted time)."""
    if torch.cuda.is_available():
        pytest.skip("the interpreter only")
    import triton.runtime.interpreter as interp

    from sparse_mla_tuner.kernels import _interpreter

    if triton.__version__ != _interpreter.VERSION:
        pytest.skip(f"the speed-up patches Triton {_interpreter.VERSION}'s interpreter only")

    assert getattr(interp.GridExecutor.__call__, "_skips_device_repatch", False)
    calls = []
    real = interp._patch_lang
    monkeypatch.setattr(interp, "_patch_lang", lambda fn: calls.append(fn.__module__) or real(fn))
    seen = []
    monkeypatch.setattr(decode, "LAUNCH_LISTENERS", [lambda kind, cfg, grid: seen.append(grid)])
    bt = _batch("fp8_v32", 3, 16, 100, "cpu")
    out, lse = sparse_mla_decode(*bt.args(), **bt.kwargs(), config=MANY_SPLITS)
    programs = sum(g[0] * g[1] if len(g) > 1 else g[0] for g in seen)
    assert len(seen) == 2 and programs > 20  # the split kernel and the combine
    # per launch: the kernel's module (the launch itself) and the language's own jit functions, once each
    assert calls == ["sparse_mla_tuner.kernels.decode", "triton.language.standard"] * 2
    assert compare(out, lse, *sparse_mla_decode_ref(*bt.args(), **bt.kwargs()))[0]


@triton.jit  # module level: the interpreter re-reads it
def _scalar_mask_kernel(X, Y, n, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    m = tl.program_id(0) < n  # a scalar comparison masking a block, as the combine's one-split mask does
    tl.store(
        Y + tl.program_id(0) * BLOCK + o,
        tl.load(X + tl.program_id(0) * BLOCK + o, mask=m, other=-1.0),
        mask=m | (o < 0),
    )


def test_a_scalar_comparison_masks_a_block_under_the_interpreter():
    """Triton 3.9's interpreter rejected it (ValueError('mask has unsupported dtype'): the comparison's handle
    is labelled int32, so the splatted mask was int32); kernels/_interpreter.py hands loads and stores bool masks."""
    if torch.cuda.is_available():
        pytest.skip("the interpreter only")
    x = torch.arange(24, dtype=torch.float32)
    y = torch.full((24,), 7.0)
    _scalar_mask_kernel[(3,)](x, y, 2, BLOCK=8)
    assert torch.equal(y[:16], x[:16]) and torch.equal(y[16:], torch.full((8,), 7.0))


def test_fp8_v32_loads_words_only_in_a_loop_the_pipeliner_does_not_stage():
    v32, model1 = get_format("fp8_v32"), get_format("fp8_model1")
    assert decode.kv_words(v32, KernelConfig(32, 4, 1, 256)) and decode.kv_words(
        v32, KernelConfig(32, 4, 3, 256, PREFETCH=1)
    )
    assert decode.kv_words(v32, KernelConfig(32, 4, 3, 256, PREFETCH=3))
    assert not decode.kv_words(v32, KernelConfig(64, 4, 2, 256)) and not decode.kv_words(
        model1, KernelConfig(32, 4, 1, 256)
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"BLOCK_T": 8}, "BLOCK_T must be a power of two >= 16"),
        ({"BLOCK_T": 24}, "BLOCK_T"),
        ({"num_warps": 3}, "num_warps must be a power of two"),
        ({"num_stages": 0}, "num_stages must be an integer in 1..8"),
        ({"TARGET_CTAS": 0}, "TARGET_CTAS must be a positive integer"),
        ({"TARGET_CTAS": 1.5}, "TARGET_CTAS"),
        ({"BLOCK_T": 2**40}, "BLOCK_T must be a power of two >= 16, at most 2048, got 1099511627776"),
        ({"BLOCK_T": 4096}, "at most 2048"),
        ({"TARGET_CTAS": 2**20 + 1}, "TARGET_CTAS must be a positive integer, at most 1048576"),
        ({"num_warps": 64}, "num_warps must be a power of two in 1..32"),
        ({"num_stages": 9}, "num_stages must be an integer in 1..8"),
        ({"maxnreg": 256}, "maxnreg must be 0 .no cap. or an integer in 16..255"),
        ({"maxnreg": -1}, "maxnreg"),
        ({"PREFETCH": 4}, "PREFETCH must be 0, 1, 2 or 3"),
        ({"BLOCK_T": 2**5000}, "got an integer of 5001 bits"),
        ({"BALANCED": 2}, "BALANCED must be 0 or 1"),
    ],
)
def test_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        KernelConfig(**kwargs)


def test_bad_inputs_raise_value_error(device):
    bt = _batch("fp8_v32", 1, 16, 64, device)
    with pytest.raises(ValueError, match="kv_format must be one of"):
        sparse_mla_decode(*bt.args(), kv_format="fp16")
    with pytest.raises(ValueError, match=r"q must be \[B, H, 512\]"):
        sparse_mla_decode(*bt.args(), kv_format="fp8_model1")
    with pytest.raises(ValueError, match=r"indices must be a contiguous \[1, 1, topk\] int32"):
        sparse_mla_decode(bt.q[:, None], bt.kv_cache, bt.indices, kv_format="fp8_v32")  # 4-D q, 2-D indices
    with pytest.raises(ValueError, match=r"q must be \[B, H, 576\] or \[B, s_q, H, 576\]"):
        sparse_mla_decode(bt.q[0], bt.kv_cache, bt.indices, kv_format="fp8_v32")
    with pytest.raises(ValueError, match="int32"):
        sparse_mla_decode(bt.q, bt.kv_cache, bt.indices.long(), kv_format="fp8_v32")


def test_config_none_uses_the_table_by_nearest_batch_key(tmp_path, monkeypatch):
    import json

    import sparse_mla_tuner.kernels.config as kc
    import sparse_mla_tuner.kernels.table as kt

    name = table_name("cpu-interpreter", "fp8_v32", 16, 64)
    entry = {"BLOCK_T": 16, "num_warps": 4, "num_stages": 1}
    table = {"2": {**entry, "TARGET_CTAS": 7}, "8": {**entry, "TARGET_CTAS": 9}}
    (tmp_path / name).write_text(json.dumps(table))
    look = lambda b: lookup_config("cpu-interpreter", "fp8_v32", 16, 64, b, config_dir=tmp_path)  # noqa: E731
    assert look(1).TARGET_CTAS == 7  # below every key: the smallest
    assert look(3).TARGET_CTAS == 7 and look(6).TARGET_CTAS == 9
    assert look(5).TARGET_CTAS == 7  # a tie goes to the smaller key, as an engine's min() over the file's keys
    assert look(8).TARGET_CTAS == 9 and look(100).TARGET_CTAS == 9
    with pytest.warns(kt.TableWarning, match="no autotune table"):
        assert lookup_config("cpu-interpreter", "fp8_model1", 16, 64, 4, config_dir=tmp_path) == kc.DEFAULT_CONFIG
    # and the launcher really uses it
    monkeypatch.delenv(kt.ENV_DIR, raising=False)
    monkeypatch.setattr(kt, "CONFIG_DIR", tmp_path)
    seen = []
    monkeypatch.setattr(decode, "LAUNCH_LISTENERS", [lambda kind, cfg, grid: seen.append((kind, cfg, grid))])
    bt = _batch("fp8_v32", 3, 16, 64, device="cpu")
    sparse_mla_decode(*bt.args(), kv_format="fp8_v32")
    # B = 3: nearest key 2; ceil(7 / 3) = 3 splits requested; 4 tiles dealt 2 per split -> 2 launched
    assert seen[0][1].TARGET_CTAS == 7 and seen[0][2] == (3, 2)


@pytest.mark.parametrize("fmt", ["fp8_model1", "fp8_v32"])
@pytest.mark.parametrize(
    "cfg, native",
    [
        pytest.param(cfg, native, id=f"{name}-{'native-cvt' if native else 'bit-trick'}")
        for name, cfg in (
            ("1split", ONE_SPLIT),
            ("splits", MANY_SPLITS),
            ("prefetch", PREFETCH_SPLITS),
            ("index-prefetch", INDEX_PREFETCH_SPLITS),
            ("deep-prefetch", DEEP_PREFETCH_SPLITS),
            ("balanced", BALANCED_RUNS),
        )
        for native in (False, True)
        # the decoding does not depend on the deal
        if name not in ("index-prefetch", "deep-prefetch", "balanced") or native
    ],
)
def test_the_gpu_path_fp16_operands_match_the_reference(fmt, cfg, native, monkeypatch, nan_outputs):
    """The GPU's code path (fp16 dot operands, bf16 partials), not the interpreter's fp32 one: the
    interpreter multiplies fp16 dot operands correctly (only bf16 ones wrongly), so it can run it. Both
    dequantizations: the bit assembly (pre-sm_89) and the native e4m3 conversion (sm_89+, sm_120)."""
    if torch.cuda.is_available():
        pytest.skip("on a GPU the other tests already run this path compiled")
    real_plan = decode._plan

    def gpu_plan(*args, **kwargs):  # the launches a GPU gets: DOT_F32 off, NATIVE_FP8 as the arch has it
        plan = real_plan(*args, **kwargs)
        for launch in plan.launches:
            if launch.name == "split":
                launch.constexprs.update(DOT_F32=False, NATIVE_FP8=native)
        return plan

    bt = _batch(fmt, 3, 16, 100, "cpu", seed=1)
    ref_out, ref_lse = sparse_mla_decode_ref(*bt.args(), **bt.kwargs())
    _, rel_f32, _, _ = compare(*sparse_mla_decode(*bt.args(), **bt.kwargs(), config=cfg), ref_out, ref_lse)
    monkeypatch.setattr(decode, "_plan", gpu_plan)
    out, lse = sparse_mla_decode(*bt.args(), **bt.kwargs(), config=cfg)
    ok, rel, _, reason = compare(out, lse, ref_out, ref_lse)
    assert ok, reason
    # fp16 operands round K, V, q and p to 2^-11: no worse than the fp32-operand path (which still
    # rounds partials and output to bf16), up to noise
    assert rel <= 1.25 * rel_f32 + 1e-3, (rel, rel_f32)


def test_the_split_kernel_triggers_the_combine_late_only_with_more_programs_than_sms():
    """The rule, on meta-tensor plans: the late trigger when the split launch has more programs than the GPU has
    SMs (under programmatic dependent launch, with a combine to launch); the early one otherwise, or with the SM
    count unknown."""
    v32 = Workload("fp8_v32", 16, 2048, 64, 8192)

    def late(config, rows, sms, pdl=True):
        q = torch.empty(rows, 1, 16, 576, dtype=torch.bfloat16, device="meta")
        cache = decode._meta_cache(v32, rows, 1, False)
        plan = decode._plan(q, [cache], None, KernelConfig.parse(config), 1.0, native=True, pdl=pdl, sms=sms)
        return [x.constexprs["LATE_TRIGGER"] for x in plan.launches if x.name == "split"]

    assert late("T32-w4-s1-c256-p1", 4, 132) == [True]  # 4 rows x 64 splits: 256 programs
    assert late("T32-w4-s1-c256-p1", 1, 132) == [False]  # 64 programs
    assert late("T32-w4-s1-c256-p1", 2, 128) == [False] and late("T32-w4-s1-c256-p1", 2, 127) == [True]  # 128
    assert late("T32-w4-s1-c256-p3-b1", 48, 132) == [True]  # the balanced deal: 256 programs
    assert late("T32-w4-s1-c256-p1", 4, None) == [False]  # SMs unknown (no GPU)
    assert late("T32-w4-s1-c256-p1", 4, 132, pdl=False) == [False]  # no dependent launch to trigger
    assert late("T32-w4-s1-c1", 400, 132) == [False]  # one split: no combine


def test_the_launcher_its_plan_and_the_reference_take_one_signature():
    """``sparse_mla_decode``, ``prepare_decode`` (plus its ``buffers``) and the reference are one call: the same
    parameters, kinds and defaults, so a caller switches between them by name alone."""
    import inspect

    def params(fn, drop=()):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values() if p.name not in drop]

    ours = params(sparse_mla_decode)
    assert ours == params(decode.prepare_decode, drop=("buffers",))
    assert ours == params(sparse_mla_decode_ref)
    assert [n for n, k, _ in ours if k is inspect.Parameter.KEYWORD_ONLY][:1] == ["kv_format"]
