"""``kernels.flashmla_compat`` against FlashMLA itself (GPU only; skipped when ``import flash_mla`` fails).

FlashMLA's sparse FP8 decode needs H in {64, 128} and an sm_90 GPU for its "legacy" path, which takes
our byte layouts directly: V4 = ``fp8_model1``, V32 = ``fp8_v32``. Both are also checked against the
fp32 reference, so a disagreement says which side is off.
"""

import pytest
import torch

import sparse_mla_tuner.kernels.flashmla_compat as compat
from sparse_mla_tuner.kernels import Workload
from sparse_mla_tuner.kernels import make_batch
from sparse_mla_tuner.kernels.reference import compare
from sparse_mla_tuner.kernels.reference import sparse_mla_decode_ref

pytestmark = pytest.mark.gpu

H = 64

CASES = [
    pytest.param(
        Workload("fp8_model1", H, 128, page_size=256, context=2048),
        Workload("fp8_model1", H, 512, page_size=64, context=4096),
        "V4",
        id="V4-sink-extra-sq2-topk_length",
    ),
    pytest.param(Workload("fp8_v32", H, 2048, page_size=64, context=8192), None, "V32", id="V32-sink-sq2"),
]


@pytest.fixture(scope="module")
def flash_mla():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    fm = pytest.importorskip("flash_mla")
    if hasattr(fm, "has_legacy") and not fm.has_legacy():
        pytest.skip("this FlashMLA build has no legacy (sm_90) sparse FP8 decode")
    return fm


@pytest.mark.parametrize("main, extra, hint", CASES)
def test_compat_matches_flashmla(main, extra, hint, flash_mla):
    bt = make_batch(
        main,
        8,
        device="cuda",
        seed=11,
        invalid_fraction=0.05,  # -1 only: FlashMLA does not bounds-check other values
        q_tokens=2,
        extra=extra,
        with_sink=True,
        with_topk_length=extra is not None,
    )
    scale = 0.0625
    kw = {
        "softmax_scale": scale,
        "is_fp8_kvcache": True,
        "indices": bt.indices,
        "attn_sink": bt.attn_sink,
        "topk_length": bt.topk_length,
    }
    if extra is not None:
        kw |= {
            "extra_k_cache": bt.extra_kv_cache.unsqueeze(2).view(torch.float8_e4m3fn),
            "extra_indices_in_kvcache": bt.extra_indices,
            "extra_topk_length": bt.extra_topk_length,
        }
    k_cache = bt.kv_cache.unsqueeze(2).view(torch.float8_e4m3fn)
    theirs, theirs_lse = flash_mla.flash_mla_with_kvcache(
        bt.q, k_cache, None, None, 512, flash_mla.get_mla_metadata()[0], **kw, use_legacy=True, kv_format=hint
    )
    ours, ours_lse = compat.flash_mla_with_kvcache(bt.q, k_cache, None, None, 512, compat.get_mla_metadata()[0], **kw)
    torch.cuda.synchronize()
    assert ours.shape == theirs.shape == (8, 2, H, 512)
    assert ours_lse.shape == theirs_lse.shape == (8, H, 2)
    ref_out, ref_lse = sparse_mla_decode_ref(*bt.args(), **bt.kwargs(), sm_scale=scale)
    for name, out, lse in (("flash_mla", theirs, theirs_lse), ("compat", ours, ours_lse)):
        ok, rel, lse_err, reason = compare(out, lse, ref_out, ref_lse)
        assert ok, f"{name} vs reference: {reason}"
    ok, rel, lse_err, reason = compare(ours, ours_lse, theirs, theirs_lse)
    assert ok, f"compat vs flash_mla: {reason}"


# The V4-Flash layer call at TP4 (16 local heads): the window (topk 128) and the compressed cache (topk 512) in
# one split launch; FlashMLA gets q and the sink padded to 64 heads, as kernels.bench_call times it.
LAYER_WINDOW = Workload("fp8_model1", 16, 128, page_size=64, context=128)
LAYER_COMPRESSED = Workload("fp8_model1", 16, 512, page_size=64, context=8192)
LAYER_CONFIGS = [
    None,  # the exported table, as the engine calls it
    "T16-w4-s1-c1",  # one split over both caches: the split kernel applies the sink, no combine
    "T32-w4-s1-c512-p1",  # splits that end in the window and go on in the compressed cache
    "T16-w4-s1-c512-p2",
    "T32-w4-s1-c256-p3-b1",  # balanced runs across rows and caches
]


@pytest.mark.parametrize("config", LAYER_CONFIGS, ids=lambda c: c or "table")
@pytest.mark.parametrize("batch, q_tokens", [(1, 1), (8, 2), (96, 1)])
def test_the_layer_call_in_one_launch_matches_flashmla(config, batch, q_tokens, flash_mla):
    from sparse_mla_tuner.kernels import KernelConfig
    from sparse_mla_tuner.kernels import sparse_mla_decode

    bt = make_batch(
        LAYER_WINDOW,
        batch,
        device="cuda",
        seed=batch + q_tokens,
        invalid_fraction=0.05,
        q_tokens=q_tokens,
        extra=LAYER_COMPRESSED,
        with_sink=True,
        with_topk_length=True,
    )
    bt.indices[0, 0] = -1  # request 0's first token: the compressed cache alone
    scale = 512**-0.5
    cfg = None if config is None else KernelConfig.parse(config)
    ours, ours_lse = sparse_mla_decode(*bt.args(), **bt.kwargs(), sm_scale=scale, config=cfg)
    pad = H - 16
    q = torch.cat([bt.q, bt.q.new_zeros(*bt.q.shape[:2], pad, bt.q.shape[3])], dim=2)
    sink = torch.cat([bt.attn_sink, bt.attn_sink.new_zeros(pad)])
    theirs, theirs_lse = flash_mla.flash_mla_with_kvcache(
        q,
        bt.kv_cache.unsqueeze(2).view(torch.float8_e4m3fn),
        None,
        None,
        512,
        flash_mla.get_mla_metadata()[0],
        softmax_scale=scale,
        is_fp8_kvcache=True,
        indices=bt.indices,
        attn_sink=sink,
        topk_length=bt.topk_length,
        extra_k_cache=bt.extra_kv_cache.unsqueeze(2).view(torch.float8_e4m3fn),
        extra_indices_in_kvcache=bt.extra_indices,
        extra_topk_length=bt.extra_topk_length,
        use_legacy=True,
        kv_format="V4",
    )
    torch.cuda.synchronize()
    theirs, theirs_lse = theirs[:, :, :16], theirs_lse[:, :16]
    assert ours.shape == theirs.shape == (batch, q_tokens, 16, 512)
    ref_out, ref_lse = sparse_mla_decode_ref(*bt.args(), **bt.kwargs(), sm_scale=scale)
    ok, _, _, reason = compare(ours, ours_lse, ref_out, ref_lse)
    assert ok, f"ours vs reference: {reason}"
    ok, _, _, reason = compare(ours, ours_lse, theirs, theirs_lse)
    assert ok, f"ours vs flash_mla: {reason}"
