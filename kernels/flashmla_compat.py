"""FlashMLA's sparse-decode entry points, with its names, argument order, shapes and return layout.

An engine that calls FlashMLA for sparse FP8 decode switches by changing one import::

    import kernels.flashmla_compat as flash_mla

    meta = flash_mla.get_mla_metadata()[0]
    out, lse = flash_mla.flash_mla_with_kvcache(q, k_cache, None, None, 512, meta, softmax_scale=s,
                                                is_fp8_kvcache=True, indices=idx)

Every call runs :func:`kernels.sparse_mla_decode` (config from the exported autotune table). The KV
format comes from ``k_cache``'s bytes per token: 584 is FlashMLA's "V4"/MODEL1 layout (our
``fp8_model1``), 656 its "V32" layout (``fp8_v32``). What FlashMLA ignores in sparse decode
(``block_table``, ``cache_seqlens``, ``num_splits``, the scheduler metadata, ``use_legacy``) is
accepted and ignored here too. What this kernel cannot do (dense decode, ``causal=True``, a bf16
cache, ``head_dim_v`` other than 512, pages with a stride other than ``page_block_size *
bytes_per_token``) raises one :class:`ValueError` sentence.

Semantics match FlashMLA's, with one widening: FlashMLA treats only ``-1`` as invalid and does not
bounds-check, while here every negative index and every index past the cache is masked.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.decode import sparse_mla_decode
from kernels.kv_format import FORMATS

FORMAT_BY_BYTES = {fmt.bytes_per_token: name for name, fmt in FORMATS.items()}  # 584 -> fp8_model1, 656 -> fp8_v32
FLASHMLA_NAMES = {"fp8_model1": "V4", "fp8_v32": "V32"}
_HINTS = {"V4": "fp8_model1", "MODEL1": "fp8_model1", "V32": "fp8_v32", **{n: n for n in FORMATS}}
_BYTE_DTYPES = (torch.uint8, torch.int8, torch.float8_e4m3fn)


@dataclass
class SchedMeta:
    """Stands for FlashMLA's ``FlashMLASchedMeta``: opaque, reusable across calls of one shape.

    This kernel needs no scheduler pass (its split count is computed from shapes on the host), so the
    object carries nothing; it exists so that engine code written for FlashMLA runs unchanged.
    """


def get_mla_metadata(*args, **kwargs) -> tuple[SchedMeta, None]:
    """FlashMLA's ``get_mla_metadata``: any arguments (old or new API) are accepted and ignored.

    Returns ``(meta, None)``; pass ``meta`` (``get_mla_metadata()[0]``) as ``tile_scheduler_metadata``.
    """
    return SchedMeta(), None


def _cache_format(cache: torch.Tensor, name: str) -> str:
    if not isinstance(cache, torch.Tensor) or cache.dim() != 4 or cache.shape[2] != 1:
        shape = list(cache.shape) if isinstance(cache, torch.Tensor) else type(cache).__name__
        raise ValueError(f"{name} must be [num_blocks, page_block_size, 1, bytes_per_token], got {shape}")
    if cache.dtype not in _BYTE_DTYPES:
        raise ValueError(f"{name} must hold FP8 cache bytes (uint8, int8 or float8_e4m3fn), got {cache.dtype}")
    fmt = FORMAT_BY_BYTES.get(cache.shape[3])
    if fmt is None:
        raise ValueError(
            f"{name} has {cache.shape[3]} bytes per token; only 584 (V4) and 656 (V32) FP8 layouts are supported"
        )
    return fmt


def _as_pages(cache: torch.Tensor, name: str) -> torch.Tensor:
    """``[num_blocks, page_block_size, 1, bpt]`` FP8 bytes -> the kernel's ``[num_blocks, page_block_size, bpt]``."""
    pages = cache.view(torch.uint8).squeeze(2)
    if not pages.is_contiguous():
        raise ValueError(
            f"{name} must have contiguous pages (strides {list(pages.stride())} for [blocks, page, bytes]); "
            "a padded page stride is not supported"
        )
    return pages


def _check_mode(indices, causal: bool, is_fp8_kvcache: bool | None, head_dim_v: int) -> None:
    """The FlashMLA modes this call implements: sparse, non-causal, FP8 cache, D_v = 512."""
    if indices is None:
        raise ValueError("only sparse decode is supported: pass indices [B, s_q, topk] (dense decode is not)")
    if causal:
        raise ValueError("causal=True is not supported: sparse decode has no causal mask (FlashMLA requires False)")
    if is_fp8_kvcache is not None and not is_fp8_kvcache:
        raise ValueError("is_fp8_kvcache=False is not supported: the cache must use the V4 or V32 FP8 layout")
    if head_dim_v != 512:
        raise ValueError(f"head_dim_v must be 512, got {head_dim_v}")


def _main_format(k_cache: torch.Tensor, kv_format: str | None) -> str:
    """The main cache's format from its bytes per token; FlashMLA's ``kv_format`` hint must agree."""
    fmt = _cache_format(k_cache, "k_cache")
    if kv_format is not None:
        hinted = _HINTS.get(kv_format)
        if hinted is None:
            raise ValueError(f"kv_format must be one of {sorted(_HINTS)}, got {kv_format!r}")
        if hinted != fmt:
            raise ValueError(
                f"kv_format={kv_format!r} does not match k_cache's {k_cache.shape[3]} bytes per token "
                f"({FLASHMLA_NAMES[fmt]})"
            )
    return fmt


def _extra_cache(fmt: str, extra_k_cache, extra_indices, extra_topk_length) -> dict:
    """``sparse_mla_decode``'s keywords for FlashMLA's second cache (none without one)."""
    if (extra_k_cache is None) != (extra_indices is None):
        raise ValueError("extra_k_cache and extra_indices_in_kvcache must be given together")
    if extra_k_cache is None:
        if extra_topk_length is not None:
            raise ValueError("extra_topk_length needs extra_k_cache and extra_indices_in_kvcache")
        return {}
    extra_fmt = _cache_format(extra_k_cache, "extra_k_cache")
    if FORMATS[extra_fmt].d_qk != FORMATS[fmt].d_qk:
        raise ValueError(
            f"extra_k_cache holds {FLASHMLA_NAMES[extra_fmt]} tokens (head dim {FORMATS[extra_fmt].d_qk}) "
            f"but k_cache holds {FLASHMLA_NAMES[fmt]} tokens (head dim {FORMATS[fmt].d_qk}); "
            "both caches must share the head dim"
        )
    return {
        "extra_kv_cache": _as_pages(extra_k_cache, "extra_k_cache"),
        "extra_indices": extra_indices,
        "extra_kv_format": extra_fmt,
        "extra_topk_length": extra_topk_length,
    }


def flash_mla_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: torch.Tensor | None,
    cache_seqlens: torch.Tensor | None,
    head_dim_v: int,
    tile_scheduler_metadata: object,
    num_splits: object = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    is_fp8_kvcache: bool | None = None,
    indices: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices_in_kvcache: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    use_legacy: bool | None = None,
    kv_format: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashMLA's sparse FP8 decode.

    Args:
        q: ``[B, s_q, H, D_qk]`` bf16 (D_qk = 512 for V4, 576 for V32).
        k_cache: ``[num_blocks, page_block_size, 1, bytes_per_token]`` uint8 (or float8_e4m3fn/int8 bytes).
        block_table, cache_seqlens, tile_scheduler_metadata, num_splits, use_legacy: ignored, as FlashMLA
            ignores them for sparse decode (indices already hold flat token positions).
        head_dim_v: must be 512.
        softmax_scale: default ``D_qk ** -0.5``.
        causal: must be False; is_fp8_kvcache: True or None.
        indices: ``[B, s_q, topk]`` int32, ``block * page_block_size + offset``; ``-1`` is invalid.
        attn_sink: ``[H]`` fp32; the output is scaled by ``exp(lse) / (exp(lse) + exp(sink))``.
        extra_k_cache, extra_indices_in_kvcache: a second cache (own page size, same head dim) attended
            in the same softmax.
        topk_length, extra_topk_length: ``[B]`` int32; only the leftmost entries count.
        kv_format: FlashMLA's layout hint (``"V4"`` or ``"V32"``); must agree with ``k_cache``.

    Returns:
        ``out [B, s_q, H, 512]`` bf16 and ``softmax_lse [B, H, s_q]`` fp32 (natural log); a query with
        no valid index gives ``out = 0`` and ``lse = +inf``.
    """
    _check_mode(indices, causal, is_fp8_kvcache, head_dim_v)
    fmt = _main_format(k_cache, kv_format)
    if q.dim() != 4:
        raise ValueError(f"q must be [B, s_q, H, D_qk], got {list(q.shape)}")
    extra = _extra_cache(fmt, extra_k_cache, extra_indices_in_kvcache, extra_topk_length)
    return sparse_mla_decode(
        q,
        _as_pages(k_cache, "k_cache"),
        indices,
        kv_format=fmt,
        sm_scale=softmax_scale,
        topk_length=topk_length,
        attn_sink=attn_sink,
        **extra,
    )
