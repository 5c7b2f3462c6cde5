"""``kernels.flashmla_compat``: FlashMLA's call, shapes and layout on top of the Triton kernel."""

import pytest
import torch

import kernels.decode as decode
import kernels.flashmla_compat as flash_mla
from kernels import Workload
from kernels import make_batch
from kernels.reference import compare
from kernels.reference import sparse_mla_decode_ref

H = 16


@pytest.fixture(autouse=True)
def poisoned(monkeypatch):
    monkeypatch.setattr(decode, "POISON_OUTPUTS", True)


def _flashmla_batch(fmt, device, extra=False, seed=0):
    """A 4-D batch, its caches as FlashMLA's ``[num_blocks, page_block_size, 1, bytes_per_token]``."""
    bt = make_batch(
        Workload(fmt, H, 64, page_size=64, context=200),
        2,
        device=device,
        seed=seed,
        invalid_fraction=0.1,
        q_tokens=2,
        extra=Workload(fmt, H, 32, page_size=16, context=100) if extra else None,
        with_sink=True,
        with_topk_length=True,
    )
    k_cache = bt.kv_cache.unsqueeze(2)
    extra_k = None if bt.extra_kv_cache is None else bt.extra_kv_cache.unsqueeze(2)
    return bt, k_cache, extra_k


@pytest.mark.parametrize(
    "fmt, hint, extra",
    [
        pytest.param("fp8_model1", "V4", True, id="V4-sink-extra-sq2"),
        pytest.param("fp8_v32", "V32", False, id="V32-sink-sq2"),
    ],
)
def test_flashmla_call_shapes_and_values(fmt, hint, extra, device):
    bt, k_cache, extra_k = _flashmla_batch(fmt, device, extra)
    meta = flash_mla.get_mla_metadata()[0]
    kw = {
        "softmax_scale": 0.07,
        "is_fp8_kvcache": True,
        "indices": bt.indices,
        "attn_sink": bt.attn_sink,
        "topk_length": bt.topk_length,
    }
    if extra:
        kw |= {"extra_k_cache": extra_k, "extra_indices_in_kvcache": bt.extra_indices}
        kw |= {"extra_topk_length": bt.extra_topk_length}
    out, lse = flash_mla.flash_mla_with_kvcache(bt.q, k_cache, None, None, 512, meta, **kw)
    assert out.shape == (2, 2, H, 512) and out.dtype == torch.bfloat16
    assert lse.shape == (2, H, 2) and lse.dtype == torch.float32 and lse.is_contiguous()
    ref_out, ref_lse = sparse_mla_decode_ref(*bt.args(), **bt.kwargs(), sm_scale=0.07)
    ok, _, _, reason = compare(out, lse, ref_out, ref_lse)
    assert ok, reason
    # what FlashMLA ignores for sparse decode is ignored; the metadata is reusable; float8 bytes are accepted
    again, again_lse = flash_mla.flash_mla_with_kvcache(
        bt.q,
        k_cache.view(torch.float8_e4m3fn),
        torch.zeros(2, 4, dtype=torch.int32, device=device),  # block_table
        torch.full((2,), 200, dtype=torch.int32, device=device),  # cache_seqlens
        512,
        meta,
        None,
        **kw,
        use_legacy=True,
        kv_format=hint,
    )
    assert torch.equal(again, out) and torch.equal(again_lse, lse)


def test_get_mla_metadata_accepts_the_old_and_new_arguments(device):
    seqlens = torch.full((2,), 100, dtype=torch.int32, device=device)
    meta, second = flash_mla.get_mla_metadata(seqlens, 2 * 64, 1, 64, True, 2048)
    assert second is None and isinstance(meta, flash_mla.SchedMeta)
    assert isinstance(flash_mla.get_mla_metadata()[0], flash_mla.SchedMeta)


def _errors(device):
    bt, k_cache, _ = _flashmla_batch("fp8_model1", device)
    v32, v32_cache, _ = _flashmla_batch("fp8_v32", device)
    meta = flash_mla.get_mla_metadata()[0]
    base = (bt.q, k_cache, None, None, 512, meta)
    kw = {"indices": bt.indices}
    odd = torch.zeros(2, 64, 1, 600, dtype=torch.uint8, device=device)
    return [
        ("causal", base, {**kw, "causal": True}, "causal=True is not supported"),
        ("bf16-cache", base, {**kw, "is_fp8_kvcache": False}, "is_fp8_kvcache=False is not supported"),
        ("bytes600", (bt.q, odd, *base[2:]), kw, "600 bytes per token; only 584 .V4. and 656 .V32."),
        ("head-dim-v", (*base[:4], 576, meta), kw, "head_dim_v must be 512, got 576"),
        ("no-indices", base, {}, "only sparse decode is supported"),
        ("hint", base, {**kw, "kv_format": "V32"}, "kv_format='V32' does not match k_cache's 584 bytes"),
        (
            "extra-head-dim",
            base,
            {**kw, "extra_k_cache": v32_cache, "extra_indices_in_kvcache": v32.indices},
            "extra_k_cache holds V32 tokens .head dim 576. but k_cache holds V4 tokens .head dim 512.",
        ),
        ("cache-3d", (bt.q, bt.kv_cache, *base[2:]), kw, r"k_cache must be \[num_blocks, page_block_size, 1"),
        ("q-3d", (bt.q[:, 0], *base[1:]), kw, r"q must be \[B, s_q, H, D_qk\]"),
    ]


ERROR_CASES = "causal bf16-cache bytes600 head-dim-v no-indices hint extra-head-dim cache-3d q-3d".split()


@pytest.mark.parametrize("case", ERROR_CASES)
def test_unsupported_arguments_raise_one_sentence(case, device):
    cases = {e[0]: e[1:] for e in _errors(device)}
    assert sorted(cases) == sorted(ERROR_CASES)
    args, kw, match = cases[case]
    with pytest.raises(ValueError, match=match) as err:
        flash_mla.flash_mla_with_kvcache(*args, **kw)
    assert "\n" not in str(err.value)
