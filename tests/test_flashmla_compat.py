"""``kernels.flashmla_compat``: FlashMLA's call, signature, assertions, shapes and layout on the Triton kernel."""

import dataclasses
import inspect
import json
from pathlib import Path

import pytest
import torch

import sparse_mla_tuner.kernels.decode as decode
import sparse_mla_tuner.kernels.flashmla_compat as flash_mla
from sparse_mla_tuner.kernels import Workload
from sparse_mla_tuner.kernels import make_batch
from sparse_mla_tuner.kernels.reference import compare
from sparse_mla_tuner.kernels.reference import sparse_mla_decode_ref
from tests.conftest import HAS_CUDA

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
    assert flash_mla.kv_format_of(k_cache) == fmt
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
    assert meta.have_initialized and meta.config.topk == 64 and meta.config.b == 2 and meta.config.s_q == 2
    assert meta.config.extra_topk == (32 if extra else None) and meta.config.is_fp8_kvcache is True
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
    )
    assert torch.equal(again, out) and torch.equal(again_lse, lse)
    assert flash_mla.FLASHMLA_NAMES[fmt] == hint


def test_get_mla_metadata_accepts_the_old_and_new_arguments(device):
    seqlens = torch.full((2,), 100, dtype=torch.int32, device=device)
    meta, second = flash_mla.get_mla_metadata(seqlens, 2 * 64, 1, 64, True, 2048)
    assert second is None and isinstance(meta, flash_mla.FlashMLASchedMeta) and not meta.have_initialized
    assert isinstance(flash_mla.get_mla_metadata()[0], flash_mla.FlashMLASchedMeta)


FIXTURE = Path(__file__).parent / "fixtures" / "flashmla_interface.json"


def test_the_signatures_are_flashmlas_exactly():
    """Parameter names, order, kinds and defaults of FlashMLA's functions and scheduler class, as its interface
    file declares them (tests/fixtures/flashmla_interface.json): nothing added, nothing renamed."""
    doc = json.loads(FIXTURE.read_text())
    for fn, params in doc["functions"].items():
        sig = inspect.signature(getattr(flash_mla, fn))
        ours = [
            {"name": p.name, "kind": p.kind.name}
            | ({} if p.default is inspect.Parameter.empty else {"default": p.default})
            for p in sig.parameters.values()
        ]
        assert ours == params, fn
    meta = doc["classes"]["FlashMLASchedMeta"]
    fields = [{"name": f.name, "default": f.default} for f in dataclasses.fields(flash_mla.FlashMLASchedMeta)]
    assert fields == meta["fields"]
    assert [f.name for f in dataclasses.fields(flash_mla.FlashMLASchedMeta.Config)] == meta["Config"]


def test_flashmlas_assertions(device):
    """num_splits must be None; sparse decode needs is_fp8_kvcache=True (its default is False, as FlashMLA's);
    the scheduler object must be FlashMLA's type. Raised as AssertionError, as FlashMLA's asserts are."""
    bt, k_cache, _ = _flashmla_batch("fp8_model1", device)
    base = (bt.q, k_cache, None, None, 512)
    kw = {"indices": bt.indices, "is_fp8_kvcache": True}
    cases = [
        ((*base, flash_mla.get_mla_metadata()[0], 1), kw, "num_splits must be None"),
        ((*base, flash_mla.get_mla_metadata()[0]), {"indices": bt.indices}, "is_fp8_kvcache must be True"),
        ((*base, object()), kw, "tile_scheduler_metadata must be of type FlashMLASchedMeta"),
        ((*base, None), kw, "tile_scheduler_metadata must be of type FlashMLASchedMeta"),
        ((*base, flash_mla.get_mla_metadata()[0]), {**kw, "causal": True}, "causal must be False"),
    ]
    for args, kwargs, match in cases:
        with pytest.raises(AssertionError, match=match) as err:
            flash_mla.flash_mla_with_kvcache(*args, **kwargs)
        assert isinstance(err.value, ValueError) and "\n" not in str(err.value)  # also this project's bad input


def _reuse_cases(device):
    """(what changes, the second call's arguments): each must fail against a scheduler object of the first."""
    bt, k_cache, extra_k = _flashmla_batch("fp8_model1", device, extra=True)
    small, small_cache, _ = _flashmla_batch("fp8_model1", device)
    kw = {"is_fp8_kvcache": True, "indices": bt.indices}
    kw_extra = {**kw, "extra_k_cache": extra_k, "extra_indices_in_kvcache": bt.extra_indices}
    first = ((bt.q, k_cache, None, None, 512), kw_extra)
    return first, [
        ("b", (bt.q[:1], k_cache, None, None, 512), {**kw_extra, "indices": bt.indices[:1],
                                                     "extra_indices_in_kvcache": bt.extra_indices[:1]}),
        ("s_q", (bt.q[:, :1], k_cache, None, None, 512), {**kw_extra, "indices": bt.indices[:, :1],
                                                          "extra_indices_in_kvcache": bt.extra_indices[:, :1]}),
        ("h_q", (bt.q[:, :, :8], k_cache, None, None, 512), kw_extra),
        ("page_block_size", (bt.q, k_cache.reshape(-1, 32, 1, 584), None, None, 512), kw_extra),
        ("topk", (bt.q, k_cache, None, None, 512), {**kw_extra, "indices": bt.indices[..., :32]}),
        ("extra_page_block_size", (bt.q, k_cache, None, None, 512),
         {**kw_extra, "extra_k_cache": extra_k.reshape(-1, 8, 1, 584)}),
        ("extra_topk", (bt.q, k_cache, None, None, 512),
         {**kw_extra, "extra_indices_in_kvcache": bt.extra_indices[..., :16]}),
        ("extra_page_block_size", (bt.q, k_cache, None, None, 512), kw),  # the extra cache dropped
        ("is_fp8_kvcache", (bt.q, k_cache, None, None, 512), {**kw_extra, "is_fp8_kvcache": False}),
        ("causal", (bt.q, k_cache, None, None, 512), {**kw_extra, "causal": True}),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def scheduled():
    """A scheduler object that a call and a second one of the same shapes used (two launches under the interpreter,
    once for the module), the first call's config, and the later calls that must each fail against it."""
    (args, kw), cases = _reuse_cases("cuda" if HAS_CUDA else "cpu")
    meta = flash_mla.get_mla_metadata()[0]
    flash_mla.flash_mla_with_kvcache(*args, meta, **kw)
    recorded = dataclasses.replace(meta.config)
    flash_mla.flash_mla_with_kvcache(*args, meta, **kw)  # the same shapes again: fine
    assert meta.config == recorded
    return meta, recorded, cases


@pytest.mark.parametrize(
    "field",
    ["b", "s_q", "h_q", "page_block_size", "topk", "extra_page_block_size", "extra_topk", "is_fp8_kvcache", "causal"],
)
def test_a_reused_scheduler_object_checks_every_later_call(field, scheduled):
    """Each later call that differs in ``field`` fails before it launches, and leaves the scheduler object as the
    first call made it (so the module's one object serves every field)."""
    meta, recorded, cases = scheduled
    checked = 0
    for name, args2, kw2 in cases:
        if name != field:
            continue
        with pytest.raises(AssertionError, match=f"sched_meta.config.{name} must be equal to") as err:
            flash_mla.flash_mla_with_kvcache(*args2, meta, **kw2)
        assert "inconsistent with sched_meta" in str(err.value)
        assert meta.config == recorded  # the first call's shape stays the reference
        checked += 1
    assert checked >= 1


def _errors(device):
    bt, k_cache, _ = _flashmla_batch("fp8_model1", device)
    v32, v32_cache, _ = _flashmla_batch("fp8_v32", device)
    meta = flash_mla.get_mla_metadata()[0]
    base = (bt.q, k_cache, None, None, 512, meta)
    kw = {"indices": bt.indices, "is_fp8_kvcache": True}
    odd = torch.zeros(2, 64, 1, 600, dtype=torch.uint8, device=device)
    return [
        ("causal", base, {**kw, "causal": True}, "causal must be False"),
        ("bf16-cache", base, {**kw, "is_fp8_kvcache": False}, "is_fp8_kvcache must be True"),
        ("bytes600", (bt.q, odd, *base[2:]), kw, "600 bytes per token; only 584 .V4., 656 .V32., 528 .V41"),
        ("head-dim-v", (*base[:4], 576, meta), kw, "head_dim_v must be 512, got 576"),
        ("no-indices", base, {}, "only sparse decode is supported"),
        (
            "extra-head-dim",
            base,
            {**kw, "extra_k_cache": v32_cache, "extra_indices_in_kvcache": v32.indices},
            "extra_k_cache holds V32 tokens .head dim 576. but k_cache holds V4 tokens .head dim 512.",
        ),
        ("cache-3d", (bt.q, bt.kv_cache, *base[2:]), kw, r"k_cache must be \[num_blocks, page_block_size, 1"),
        ("q-3d", (bt.q[:, 0], *base[1:]), kw, r"q must be \[B, s_q, H, D_qk\]"),
    ]


ERROR_CASES = "causal bf16-cache bytes600 head-dim-v no-indices extra-head-dim cache-3d q-3d".split()


@pytest.mark.parametrize("case", ERROR_CASES)
def test_unsupported_arguments_raise_one_sentence(case, device):
    cases = {e[0]: e[1:] for e in _errors(device)}
    assert sorted(cases) == sorted(ERROR_CASES)
    args, kw, match = cases[case]
    args = (*args[:5], flash_mla.get_mla_metadata()[0], *args[6:])  # a fresh scheduler object per call
    with pytest.raises(ValueError, match=match) as err:
        flash_mla.flash_mla_with_kvcache(*args, **kw)
    assert "\n" not in str(err.value)
