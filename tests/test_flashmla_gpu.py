"""``kernels.flashmla_compat`` against FlashMLA itself (GPU only; skipped when ``import flash_mla`` fails).

FlashMLA's sparse FP8 decode needs H in {64, 128} and an sm_90 GPU for its "legacy" path, which takes
our byte layouts directly: V4 = ``fp8_model1``, V32 = ``fp8_v32``. Both are also checked against the
fp32 reference, so a disagreement says which side is off.
"""

import pytest
import torch

import kernels.flashmla_compat as compat
from kernels import Workload
from kernels import make_batch
from kernels.reference import compare
from kernels.reference import sparse_mla_decode_ref

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
