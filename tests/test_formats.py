"""The cache formats without a bf16 part (issue 57): DeepSeek-V4.1's fp8 window/main cache and fp4 extra cache,
and DeepSeek-V3.2 without RoPE (GLM-5.3). Layouts and quantizers against the documented bytes, the kernel against
the reference under the interpreter (cheap shapes)."""

from pathlib import Path

import pytest
import torch

import sparse_mla_tuner.kernels.decode as decode
from sparse_mla_tuner.kernels import KernelConfig
from sparse_mla_tuner.kernels import Workload
from sparse_mla_tuner.kernels import make_batch
from sparse_mla_tuner.kernels import sparse_mla_decode
from sparse_mla_tuner.kernels.kv_format import E2M1_VALUES
from sparse_mla_tuner.kernels.kv_format import check_pair
from sparse_mla_tuner.kernels.kv_format import dequantize
from sparse_mla_tuner.kernels.kv_format import e2m1_codes
from sparse_mla_tuner.kernels.kv_format import e2m1_values
from sparse_mla_tuner.kernels.kv_format import get_format
from sparse_mla_tuner.kernels.kv_format import quantize
from sparse_mla_tuner.kernels.reference import compare
from sparse_mla_tuner.kernels.reference import sparse_mla_decode_ref

ONE_SPLIT = KernelConfig(BLOCK_T=16, num_warps=4, num_stages=2, TARGET_CTAS=1)
SPLITS = KernelConfig(BLOCK_T=16, num_warps=4, num_stages=2, TARGET_CTAS=64)
PREFETCH = KernelConfig(BLOCK_T=16, num_warps=4, num_stages=1, TARGET_CTAS=4, PREFETCH=1)
BALANCED = PREFETCH.replace(TARGET_CTAS=5, BALANCED=1)

NOPE = Workload("fp8_v32_nope", 16, 100, page_size=64, context=300)
V41_WINDOW = Workload("fp8_v41", 16, 48, page_size=32, context=64)  # the sliding window's pages of 32
FP4 = Workload("fp4_v41", 16, 100, page_size=16, context=300)  # the compressed cache, its own page size
V41_MAIN = Workload("fp8_v41", 16, 100, page_size=32, context=300)  # an fp8 compressed cache (ratios 4, 128)

# (id, main workload, extra workload, config, batch, query tokens, sink): every config shape once per format,
# ragged lengths and -1 indices in all (seeded), two head blocks (H=64, V4.1's TP1 heads), the sink, and
# query tokens 1, 2 and 8
CASES = [
    ("nope-1split", NOPE, None, ONE_SPLIT, 3, None, False),
    ("nope-splits-sink", NOPE, None, SPLITS, 3, None, True),
    ("nope-prefetch-s_q2", NOPE, None, PREFETCH, 2, 2, False),  # the word loads (kv_words), one dot chain
    ("nope-words-T32", NOPE, None, PREFETCH.replace(BLOCK_T=32, PREFETCH=2, TARGET_CTAS=8), 3, None, True),
    ("nope-balanced-H64", Workload("fp8_v32_nope", 64, 100, 64, 300), None, BALANCED, 3, None, True),
    ("v41-window", V41_WINDOW, None, SPLITS, 3, None, False),
    ("v41-fp4-layer-sink", V41_WINDOW, FP4, SPLITS, 3, None, True),
    ("v41-fp4-layer-prefetch", V41_WINDOW, FP4, PREFETCH, 3, None, True),
    ("v41-fp4-layer-balanced-s_q8", V41_WINDOW, FP4, BALANCED, 1, 8, True),
    ("v41-fp4-layer-1split-H8", Workload("fp8_v41", 8, 48, 32, 64), FP4, ONE_SPLIT, 2, None, True),
    # vLLM #56837's V4.1 shape, 1152 tokens a row: the window's 128 and 1024 of the fp4 cache, in tiles of 64
    (
        "v41-fp4-layer-topk1152-T64",
        Workload("fp8_v41", 16, 128, 32, 128),
        Workload("fp4_v41", 16, 1024, 32, 1100),
        KernelConfig(BLOCK_T=64, num_warps=4, num_stages=1, TARGET_CTAS=16, PREFETCH=2),
        1,
        None,
        True,
    ),
    # the merge in the split launch (MERGE=1): per-row and balanced deals
    ("nope-merge", NOPE, None, SPLITS.replace(MERGE=1), 3, None, True),
    ("v41-fp4-layer-merge-balanced", V41_WINDOW, FP4, BALANCED.replace(MERGE=1), 3, 2, True),
    ("v41-fp8-layer-one-loop", V41_WINDOW, V41_MAIN, PREFETCH.replace(PREFETCH=3), 3, None, True),
    ("v41-fp8-layer-two-page-sizes", V41_WINDOW, Workload("fp8_v41", 16, 100, 16, 300), SPLITS, 3, 2, True),
]


@pytest.mark.parametrize(
    "main, extra, cfg, B, q_tokens, sink, seed",
    [pytest.param(*c[1:], i % 2, id=c[0]) for i, c in enumerate(CASES)],
)
def test_kernel_matches_reference(main, extra, cfg, B, q_tokens, sink, seed, monkeypatch, device):
    monkeypatch.setattr(decode, "POISON_OUTPUTS", True)  # an unwritten element is NaN and fails the gate
    bt = make_batch(
        main,
        B,
        device=device,
        seed=seed,
        with_topk_length=seed == 1,
        invalid_fraction=0.1,
        q_tokens=q_tokens,
        extra=extra,
        with_sink=sink,
    )
    bt.indices.view(B, -1)[0, 3] = -1
    if B == 3:  # a row with no valid token in either cache
        bt.indices[1] = -1
        if bt.extra_indices is not None:
            bt.extra_indices[1] = -1
    out, lse = sparse_mla_decode(*bt.args(), **bt.kwargs(), config=cfg)
    ok, _, _, reason = compare(out, lse, *sparse_mla_decode_ref(*bt.args(), **bt.kwargs()))
    assert ok, reason
    if B == 3:
        assert torch.isposinf(lse[1]).all() and (out[1] == 0).all()


def test_fp4_cache_is_read_at_its_own_page_size_and_stride(device):
    """A padded page stride (SGLang pads V4.1 pages to whole 512 / 256-byte units) is read in place."""
    bt = make_batch(V41_WINDOW, 2, device=device, seed=3, extra=FP4, with_sink=True)
    pages, ps, bpt = bt.extra_kv_cache.shape
    padded = torch.zeros(pages, ps * bpt + 256, dtype=torch.uint8, device=device)
    padded[:, : ps * bpt] = bt.extra_kv_cache.reshape(pages, -1)
    view = padded.as_strided((pages, ps, bpt), (ps * bpt + 256, bpt, 1))
    ref = sparse_mla_decode_ref(*bt.args(), **bt.kwargs())
    kw = {**bt.kwargs(), "extra_kv_cache": view}
    ok, _, _, reason = compare(*sparse_mla_decode(*bt.args(), **kw, config=SPLITS), *ref)
    assert ok, reason
    assert torch.equal(dequantize(view, "fp4_v41"), dequantize(bt.extra_kv_cache, "fp4_v41"))


def test_the_comparison_catches_a_wrong_nibble_order(device):
    """The gate can fail: the fp4 cache with every byte's nibbles swapped must not pass."""
    bt = make_batch(V41_WINDOW, 1, device=device, seed=0, extra=FP4)
    ref = sparse_mla_decode_ref(*bt.args(), **bt.kwargs())
    ps = bt.extra_kv_cache.shape[1]
    swapped = bt.extra_kv_cache.clone().reshape(bt.extra_kv_cache.shape[0], -1)
    data = swapped[:, : ps * 256]
    swapped[:, : ps * 256] = (data >> 4) | (data << 4)
    kw = {**bt.kwargs(), "extra_kv_cache": swapped.reshape(bt.extra_kv_cache.shape)}
    ok, _, _, _ = compare(*sparse_mla_decode(*bt.args(), **kw, config=ONE_SPLIT), *ref)
    assert not ok


@pytest.mark.parametrize(
    "main, extra, message",
    [
        ("fp4_v41", None, "fp4_v41 is an extra cache only"),
        ("fp8_v32_nope", "fp4_v41", "cannot go with a fp8_v32_nope main cache"),
        ("fp8_v41", "fp8_model1", "allowed: \\['fp8_v41', 'fp4_v41'\\]"),
    ],
)
def test_format_pairs_outside_flashmla_s_are_refused_in_one_sentence(main, extra, message):
    with pytest.raises(ValueError, match=message):
        check_pair(main, extra)
    if extra is not None:
        with pytest.raises(ValueError, match=message):
            Workload(main, 16, 64, extra=Workload(extra, 16, 64))
    bt = make_batch(V41_WINDOW, 1, extra=FP4)
    if extra is None:
        cache = quantize(torch.randn(32, 512), main, 32)
        with pytest.raises(ValueError, match=message):
            sparse_mla_decode(bt.q, cache, bt.indices, kv_format=main)
    else:
        with pytest.raises(ValueError, match=message):
            sparse_mla_decode(
                bt.q,
                quantize(torch.randn(32, 512), main, 32),
                bt.indices,
                kv_format=main,
                extra_kv_cache=quantize(torch.randn(32, 512), extra, 32),
                extra_indices=bt.extra_indices,
                extra_kv_format=extra,
            )


# --- the byte layouts, at the offsets FlashMLA's docstring states (sgl-flash-mla 1.0.0, flash_mla_interface.py) ---


def _e4m3_byte(x: float) -> int:
    return torch.tensor(x).to(torch.float8_e4m3fn).view(torch.uint8).item()


def test_v41_fp8_bytes_at_documented_offsets():
    """'a page block stores page_block_size data rows first and page_block_size scale rows afterwards ... the data
    row is 512 float8_e4m3 values ... the scale row is 16 Bytes of float8_e8m0 scales, each covering 32'."""
    page_size = 4
    kv = torch.zeros(8, 512)
    t = 6  # page 1, offset 2
    kv[t, 0] = 1.0  # group 0: amax 1 -> scale 2^ceil(log2(1/448)) = 2^-8, stored 256
    kv[t, 480] = -448.0  # group 15 (a rope dim, quantized too): scale 1
    cache = quantize(kv, "fp8_v41", page_size).view(-1)
    page = 1 * page_size * 528
    data = page + 2 * 512
    assert cache[data].item() == _e4m3_byte(256.0)
    assert cache[data + 480].item() == _e4m3_byte(-448.0)
    scale_row = page + page_size * 512 + 2 * 16
    assert cache[scale_row].item() == 127 - 8  # ue8m0 of 2^-8
    assert cache[scale_row + 15].item() == 127
    assert cache[page + page_size * 528 - 1].item() == 127 - 13  # the page's last byte: token 3's last scale (zeros)


def test_v41_fp4_bytes_at_documented_offsets():
    """'the data row is 256 Bytes containing 512 e2m1 values (2 values per byte, the even-indexed one in the low
    nibble), and the scale row is 32 Bytes of float8_e4m3 scales, each covering 16 consecutive e2m1 values'."""
    page_size = 2
    kv = torch.zeros(4, 512)
    kv[3, 16:18] = torch.tensor([6.0, -1.5])  # group 1: amax 6 -> scale 1; codes 7 and 8 | 3
    kv[3, 511] = 12.0  # group 31: scale 2, value 6 -> code 7 in the high nibble of byte 255
    cache = quantize(kv, "fp4_v41", page_size).view(-1)
    page = 1 * page_size * 288
    data = page + 1 * 256
    assert cache[data + 8].item() == 0x7 | (0xB << 4)
    assert cache[data + 255].item() == 0x7 << 4
    scale_row = page + page_size * 256 + 1 * 32
    assert cache[scale_row + 1].item() == _e4m3_byte(1.0)
    assert cache[scale_row + 31].item() == _e4m3_byte(2.0)
    assert cache[scale_row].item() == _e4m3_byte(2.0**-9)  # an all-zero group: the smallest scale


def test_v32_nope_bytes_at_documented_offsets():
    """'structured as the first 528 Bytes of the V3.2 layout: 512 float8_e4m3 NoPE values followed by 4 float32
    scale factors, and no RoPE part'."""
    kv = torch.zeros(4, 512)
    kv[3, 130] = -448.0  # group 1, scale 1
    kv[3, 511] = 1.0  # group 3, scale 2^-8
    cache = quantize(kv, "fp8_v32_nope", page_size=2).view(-1)
    tok = 3 * 528
    assert cache[tok + 130].item() == _e4m3_byte(-448.0)
    assert cache[tok + 511].item() == _e4m3_byte(256.0)
    assert cache[tok + 512 : tok + 528].view(torch.float32).tolist() == [2.0**-13, 1.0, 2.0**-13, 2.0**-8]


# --- quantizers ---


@pytest.mark.parametrize("kv_format", ["fp8_v32_nope", "fp8_v41"])
def test_fp8_round_trip_within_e4m3_precision(kv_format):
    fmt = get_format(kv_format)
    g = torch.Generator().manual_seed(0)
    kv = torch.randn(70, 512, generator=g) * torch.logspace(-3, 2, 70)[:, None]
    cache = quantize(kv, kv_format, page_size=32)
    assert cache.shape == (3, 32, fmt.bytes_per_token) and cache.dtype == torch.uint8
    back = dequantize(cache, kv_format)[:70]
    scale = kv.abs().reshape(70, fmt.n_groups, fmt.group).amax(-1, keepdim=True) / 448
    step = (2.0 ** torch.ceil(torch.log2(scale.clamp_min(1e-4))) * 2.0**-10).expand(-1, -1, fmt.group).reshape(70, -1)
    assert ((back - kv).abs() <= kv.abs() * 2.0**-4 + step).all()
    assert torch.equal(dequantize(quantize(back, kv_format, page_size=32), kv_format)[:70], back)  # a fixed point


def test_fp4_round_trip_within_e2m1_precision():
    g = torch.Generator().manual_seed(0)
    kv = torch.randn(70, 512, generator=g) * torch.logspace(-2, 2, 70)[:, None]
    cache = quantize(kv, "fp4_v41", page_size=16)
    assert cache.shape == (5, 16, 288)
    back = dequantize(cache, "fp4_v41")[:70]
    scale = (kv.abs().reshape(70, 32, 16).amax(-1, keepdim=True) / 6).expand(-1, -1, 16).reshape(70, 512)
    # e2m1 steps are at most a quarter of the magnitude from 2 up, and half a step (0.25) below: half a step of
    # error, plus the scale's e4m3 rounding (a value may saturate at 6)
    assert ((back - kv).abs() <= kv.abs() * 0.25 + scale * 0.5).all()
    # a fixed point where the scales are normal e4m3 numbers (rows 32..63: amax >= 0.1, scales >= 2^-6); a
    # subnormal scale may round up enough that the largest value rounds to 4, and the next scale is smaller
    assert torch.equal(quantize(back[32:64], "fp4_v41", page_size=16), cache[2:4])


def test_e2m1_rounding_ties_to_even_and_saturates():
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.26, -0.3, 7.0, -100.0, -0.0, 4.9])
    codes = e2m1_codes(x)
    assert codes.tolist() == [0, 2, 2, 4, 4, 6, 6, 1, 9, 7, 15, 8, 6]
    every = torch.arange(16, dtype=torch.uint8)
    assert e2m1_values(every).tolist() == list(E2M1_VALUES) + [-v for v in E2M1_VALUES]
    assert torch.equal(e2m1_codes(e2m1_values(every)), every)  # -0.0 keeps its sign: code 8


# --- FlashMLA's call (kernels/flashmla_compat.py): the format from the bytes per token, or its kv_format name ---


@pytest.mark.parametrize(
    "main, extra, kv_format",
    [
        pytest.param(V41_WINDOW, FP4, None, id="V41-fp4-extra"),
        pytest.param(V41_WINDOW, V41_MAIN, "V41", id="V41-V41-extra"),
        pytest.param(NOPE, None, "V32_NO_ROPE", id="V32_NO_ROPE"),
    ],
)
def test_flashmla_call_reads_the_new_formats(main, extra, kv_format, device):
    import sparse_mla_tuner.kernels.flashmla_compat as flash_mla

    bt = make_batch(main, 2, device=device, seed=1, q_tokens=2, extra=extra, with_sink=True, invalid_fraction=0.1)
    kw = {"softmax_scale": 0.06, "is_fp8_kvcache": True, "indices": bt.indices, "attn_sink": bt.attn_sink}
    if extra is not None:
        kw |= {"extra_k_cache": bt.extra_kv_cache.unsqueeze(2), "extra_indices_in_kvcache": bt.extra_indices}
    k_cache = bt.kv_cache.unsqueeze(2)
    assert flash_mla.kv_format_of(k_cache, kv_format) == main.kv_format
    meta = flash_mla.get_mla_metadata()[0]
    out, lse = flash_mla.flash_mla_with_kvcache(bt.q, k_cache, None, None, 512, meta, kv_format=kv_format, **kw)
    ok, _, _, reason = compare(out, lse, *sparse_mla_decode_ref(*bt.args(), **bt.kwargs(), sm_scale=0.06))
    assert ok, reason


def test_flashmla_call_refuses_what_flashmla_refuses():
    import sparse_mla_tuner.kernels.flashmla_compat as flash_mla

    nope = quantize(torch.randn(64, 512), "fp8_v32_nope", 64).unsqueeze(2)
    assert flash_mla.kv_format_of(nope) == "fp8_v41"  # 528 bytes without a name: V4.1, as FlashMLA reads it
    fp4 = quantize(torch.randn(64, 512), "fp4_v41", 64).unsqueeze(2)
    v32 = quantize(torch.randn(64, 576), "fp8_v32", 64).unsqueeze(2)
    with pytest.raises(ValueError, match="288 bytes per token .* only as extra_k_cache"):
        flash_mla.kv_format_of(fp4)
    with pytest.raises(ValueError, match="kv_format='V41' has 528 bytes per token, but k_cache has 656"):
        flash_mla.kv_format_of(v32, "V41")
    with pytest.raises(ValueError, match="kv_format must be one of"):
        flash_mla.kv_format_of(nope, "v41")
    q = torch.randn(1, 1, 16, 512).bfloat16()
    idx = torch.zeros(1, 1, 16, dtype=torch.int32)
    kw = {"is_fp8_kvcache": True, "indices": idx, "extra_k_cache": fp4, "extra_indices_in_kvcache": idx}
    with pytest.raises(ValueError, match="V4.1 fp4 tokens, which FlashMLA pairs only with V32_NO_ROPE"):
        meta = flash_mla.get_mla_metadata()[0]
        flash_mla.flash_mla_with_kvcache(q, nope, None, None, 512, meta, kv_format="V32_NO_ROPE", **kw)


@pytest.mark.parametrize("native", [False, True], ids=["bit-assembly", "native-e4m3"])
@pytest.mark.parametrize(
    "main, extra, cfg",
    [
        pytest.param(NOPE, None, SPLITS, id="nope-bytes"),
        pytest.param(NOPE, None, PREFETCH, id="nope-words"),
        pytest.param(V41_WINDOW, FP4, PREFETCH, id="v41-fp4-layer"),
    ],
)
def test_the_gpu_path_fp16_operands_match_the_reference(main, extra, cfg, native, monkeypatch):
    """The GPU's code path (fp16 dot operands: e4m3 and e2m1 values and their scales in fp16), not the
    interpreter's fp32 one, with both e4m3 conversions (the bit assembly, and sm_89+'s native one)."""
    if torch.cuda.is_available():
        pytest.skip("on a GPU the other tests already run this path compiled")
    monkeypatch.setattr(decode, "POISON_OUTPUTS", True)
    real_plan = decode._plan

    def gpu_plan(*args, **kwargs):  # the launches a GPU gets: DOT_F32 off, NATIVE_FP8 as the arch has it
        plan = real_plan(*args, **kwargs)
        for launch in plan.launches:
            if launch.name == "split":
                launch.constexprs.update(DOT_F32=False, NATIVE_FP8=native)
        return plan

    bt = make_batch(main, 3, seed=1, extra=extra, with_sink=extra is not None, with_topk_length=True)
    ref = sparse_mla_decode_ref(*bt.args(), **bt.kwargs())
    _, rel_f32, _, _ = compare(*sparse_mla_decode(*bt.args(), **bt.kwargs(), config=cfg), *ref)
    monkeypatch.setattr(decode, "_plan", gpu_plan)
    ok, rel, _, reason = compare(*sparse_mla_decode(*bt.args(), **bt.kwargs(), config=cfg), *ref)
    assert ok, reason
    assert rel <= 1.25 * rel_f32 + 1e-3, (rel, rel_f32)  # fp16 operands: no worse than fp32 ones, up to noise


def test_the_shipped_spaces_of_the_new_formats():
    """One small space per model: V4.1-Flash's layer call at TP4 (fp8 window on pages of 32, fp4 compressed cache,
    sink) and GLM-5.3's no-RoPE cache at TP4, both at the 15 levels, their baselines inside."""
    from sparse_mla_tuner.tuner.space import load_space

    v41, nope = load_space("v41_flash_layer_tp4"), load_space("glm53_nope_tp4")
    for sp in (v41, nope):
        assert sp.baseline in sp.configs() and len(sp.concurrency) == 15 and sp.workloads[0].local_heads == 16
    wl = v41.workloads[0].workload()
    assert (wl.kv_format, wl.topk, wl.page_size, wl.attn_sink) == ("fp8_v41", 128, 32, True)
    assert (wl.extra.kv_format, wl.extra.topk, wl.extra.page_size) == ("fp4_v41", 512, 32)
    assert nope.workloads[0].workload().kv_format == "fp8_v32_nope"


@pytest.mark.parametrize(
    "workload, where, message",
    [
        ("kv_format: fp4_v41", "workloads\\[0\\].kv_format", "fp4_v41 is an extra cache only"),
        (
            "kv_format: fp8_v32_nope\n    extra: {kv_format: fp4_v41, topk: 64}",
            "workloads\\[0\\].extra.kv_format",
            "cannot go with a fp8_v32_nope main cache",
        ),
    ],
)
def test_a_space_with_a_pair_flashmla_does_not_have_is_one_sentence(tmp_path, workload, where, message):
    from sparse_mla_tuner.tuner.space import SpaceError
    from sparse_mla_tuner.tuner.space import load_space

    text = (Path(__file__).parent.parent / "search_spaces" / "glm53_nope_tp4.yaml").read_text()
    path = tmp_path / "bad.yaml"
    path.write_text(text.replace("kv_format: fp8_v32_nope", workload))
    with pytest.raises(SpaceError, match=f"{where}.*{message}"):
        load_space(str(path))
