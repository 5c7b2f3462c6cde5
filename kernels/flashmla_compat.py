"""FlashMLA's sparse-decode entry points, with its names, exact signatures, assertions, shapes and return layout.

An engine that calls FlashMLA for sparse FP8 decode switches by changing one import::

    import sparse_mla_tuner.kernels.flashmla_compat as flash_mla

    sched_meta, _ = flash_mla.get_mla_metadata()
    out, lse = flash_mla.flash_mla_with_kvcache(q, k_cache, None, None, 512, sched_meta, softmax_scale=s,
                                                is_fp8_kvcache=True, indices=idx)

``FlashMLASchedMeta``, ``get_mla_metadata`` and ``flash_mla_with_kvcache`` have FlashMLA's names and
signatures, parameter for parameter (``tests/fixtures/flashmla_interface.json``, taken from FlashMLA's
``flash_mla/flash_mla_interface.py``, is compared in a test). So are FlashMLA's assertions, raised as
:class:`FlashMLAAssertionError` (an ``AssertionError``, as FlashMLA's ``assert`` gives, and a
``ValueError``, as this project's bad input gives): ``num_splits`` must be ``None``, sparse decode needs
``is_fp8_kvcache=True`` and ``causal=False``, and a scheduler object records the call it was first used
with (b, s_q, h_q, page size, h_k, causal, is_fp8_kvcache, topk, the extra cache's page size and topk) and
checks every later call against it.

Every call runs :func:`kernels.sparse_mla_decode` (config from the exported autotune table). The KV format
comes, as in FlashMLA (the ``sgl-flash-mla`` 1.0.0 interface), from ``k_cache``'s bytes per token: 584 is
FlashMLA's "V4"/MODEL1 layout, our ``fp8_model1``; 656 its "V32" layout, ``fp8_v32``; 528 its "V41", our
``fp8_v41``, unless ``kv_format="V32_NO_ROPE"`` names the V3.2-without-RoPE layout of the same size
(``fp8_v32_nope``); 288, FlashMLA's V4.1 fp4, our ``fp4_v41``, only as ``extra_k_cache`` next to a V41 one. An
extra cache of 528 bytes has the main cache's format. :func:`kv_format_of` tells which. What FlashMLA ignores
in sparse decode (``block_table``, ``cache_seqlens``) is ignored here too. What this kernel cannot do (dense
decode, a bf16 cache, ``head_dim_v`` other than 512, pages with a stride other than ``page_block_size *
bytes_per_token``) raises one :class:`ValueError` sentence.

Semantics match FlashMLA's, with one widening: FlashMLA treats only ``-1`` as invalid and does not
bounds-check, while here every negative index and every index past the cache is masked.
"""

from __future__ import annotations

import dataclasses

import torch

from .decode import sparse_mla_decode
from .kv_format import FLASHMLA_NAMES
from .kv_format import FORMATS

# bytes per token -> our format when ``kv_format`` is not given (FlashMLA: "528 Bytes per token means V4.1")
FORMAT_BY_BYTES = {584: "fp8_model1", 656: "fp8_v32", 528: "fp8_v41", 288: "fp4_v41"}
BY_FLASHMLA_NAME = {v: k for k, v in FLASHMLA_NAMES.items()}  # "V4" -> fp8_model1, ... "V32_NO_ROPE" -> fp8_v32_nope
_BYTE_DTYPES = (torch.uint8, torch.int8, torch.float8_e4m3fn)
_HELP = (
    " Your input arguments are inconsistent with sched_meta. Please make sure the input arguments are consistent"
    " across different invocations of flash_mla_with_kvcache on the same sched_meta."
)


class FlashMLAAssertionError(AssertionError, ValueError):
    """One of FlashMLA's own assertions failed (FlashMLA raises ``AssertionError`` there)."""


def _require(ok: bool, message: str) -> None:
    if not ok:  # not an ``assert`` statement: python -O must not drop FlashMLA's checks
        raise FlashMLAAssertionError(message)


@dataclasses.dataclass
class FlashMLASchedMeta:
    """FlashMLA's scheduler metadata: empty until the first call, which records the call's shape in
    :attr:`config`; every later call with this object must match it.

    This kernel needs no scheduler pass (its split count is computed from shapes on the host), so
    ``tile_scheduler_metadata`` and ``num_splits`` stay ``None``.
    """

    @dataclasses.dataclass
    class Config:
        b: int
        s_q: int
        h_q: int
        page_block_size: int
        h_k: int

        causal: bool
        is_fp8_kvcache: bool
        topk: int | None

        extra_page_block_size: int | None
        extra_topk: int | None

    have_initialized: bool = False

    config: Config | None = None

    tile_scheduler_metadata: torch.Tensor | None = None
    num_splits: torch.Tensor | None = None


def get_mla_metadata(*args, **kwargs) -> tuple[FlashMLASchedMeta, None]:
    """FlashMLA's ``get_mla_metadata``: any arguments (old or new API) are accepted and ignored.

    Returns ``(FlashMLASchedMeta(), None)``; pass the first as ``tile_scheduler_metadata``.
    """
    return FlashMLASchedMeta(), None


def kv_format_of(k_cache: torch.Tensor, kv_format: str | None = None) -> str:
    """The KV format a call on ``k_cache`` runs: ``fp8_model1`` (584 bytes per token, FlashMLA's V4), ``fp8_v32``
    (656, V32), ``fp8_v41`` (528, V41) or, with ``kv_format="V32_NO_ROPE"``, ``fp8_v32_nope`` (528); ValueError
    for any other cache, or a ``kv_format`` that names another size."""
    fmt = _cache_format(k_cache, "k_cache")
    if fmt == "fp4_v41":
        raise ValueError("k_cache has 288 bytes per token (V4.1 fp4), which FlashMLA takes only as extra_k_cache")
    if kv_format is None:
        return fmt
    named = BY_FLASHMLA_NAME.get(kv_format)
    if named is None:
        raise ValueError(f"kv_format must be one of {sorted(BY_FLASHMLA_NAME)} or None, got {kv_format!r}")
    if FORMATS[named].bytes_per_token != k_cache.shape[3]:
        raise ValueError(
            f"kv_format={kv_format!r} has {FORMATS[named].bytes_per_token} bytes per token, "
            f"but k_cache has {k_cache.shape[3]}"
        )
    return named


def _cache_format(cache: torch.Tensor, name: str) -> str:
    if not isinstance(cache, torch.Tensor) or cache.dim() != 4 or cache.shape[2] != 1:
        shape = list(cache.shape) if isinstance(cache, torch.Tensor) else type(cache).__name__
        raise ValueError(f"{name} must be [num_blocks, page_block_size, 1, bytes_per_token], got {shape}")
    if cache.dtype not in _BYTE_DTYPES:
        raise ValueError(f"{name} must hold FP8 cache bytes (uint8, int8 or float8_e4m3fn), got {cache.dtype}")
    fmt = FORMAT_BY_BYTES.get(cache.shape[3])
    if fmt is None:
        raise ValueError(
            f"{name} has {cache.shape[3]} bytes per token; only 584 (V4), 656 (V32), 528 (V41 or V32_NO_ROPE) "
            "and, for extra_k_cache, 288 (V4.1 fp4) are supported"
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


def _extra_cache(fmt: str, extra_k_cache, extra_indices, extra_topk_length) -> dict:
    """``sparse_mla_decode``'s keywords for FlashMLA's second cache (none without one)."""
    if (extra_k_cache is None) != (extra_indices is None):
        raise ValueError("extra_k_cache and extra_indices_in_kvcache must be given together")
    if extra_k_cache is None:
        if extra_topk_length is not None:
            raise ValueError("extra_topk_length needs extra_k_cache and extra_indices_in_kvcache")
        return {}
    extra_fmt = _cache_format(extra_k_cache, "extra_k_cache")
    if FORMATS[extra_fmt].bytes_per_token == FORMATS[fmt].bytes_per_token:
        extra_fmt = fmt  # 528 bytes: the main cache's V41 or V32_NO_ROPE
    if FORMATS[extra_fmt].d_qk != FORMATS[fmt].d_qk:
        raise ValueError(
            f"extra_k_cache holds {_name(extra_fmt)} tokens (head dim {FORMATS[extra_fmt].d_qk}) "
            f"but k_cache holds {_name(fmt)} tokens (head dim {FORMATS[fmt].d_qk}); "
            "both caches must share the head dim"
        )
    if extra_fmt != fmt and (extra_fmt != "fp4_v41" or fmt != "fp8_v41"):
        raise ValueError(f"extra_k_cache holds {_name(extra_fmt)} tokens, which FlashMLA pairs only with {_name(fmt)}")
    return {
        "extra_kv_cache": _as_pages(extra_k_cache, "extra_k_cache"),
        "extra_indices": extra_indices,
        "extra_kv_format": extra_fmt,
        "extra_topk_length": extra_topk_length,
    }


def _name(fmt: str) -> str:
    return FLASHMLA_NAMES.get(fmt, "V4.1 fp4")


def _check_sched_meta(sched_meta: FlashMLASchedMeta, config: FlashMLASchedMeta.Config) -> None:
    """FlashMLA's check of a reused scheduler object, field by field, with its messages."""
    seen = sched_meta.config
    _require(seen is not None, "sched_meta.config must be set once sched_meta.have_initialized is True." + _HELP)
    checks = [
        ("b", "batch_size"),
        ("s_q", "seq_len_q"),
        ("h_q", "num_heads_q"),
        ("page_block_size", "page_block_size"),
        ("h_k", "num_heads_k"),
        ("causal", "causal"),
        ("is_fp8_kvcache", "is_fp8_kvcache"),
        ("topk", "the last dim of indices_in_kvcache"),
        ("extra_page_block_size", "the page_block_size of extra_k_cache"),
        ("extra_topk", "the last dim of extra_indices_in_kvcache"),
    ]
    for name, what in checks:
        _require(
            getattr(seen, name) == getattr(config, name),
            f"sched_meta.config.{name} must be equal to {what} (first call: {getattr(seen, name)!r}, "
            f"this call: {getattr(config, name)!r}).{_HELP}",
        )


def flash_mla_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: torch.Tensor | None,
    cache_seqlens: torch.Tensor | None,
    head_dim_v: int,
    tile_scheduler_metadata: FlashMLASchedMeta,
    num_splits: None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    is_fp8_kvcache: bool = False,
    indices: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices_in_kvcache: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    kv_format: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashMLA's sparse FP8 decode.

    Args:
        q: ``[B, s_q, H, D_qk]`` bf16 (D_qk = 576 for V32, 512 for the others).
        k_cache: ``[num_blocks, page_block_size, 1, bytes_per_token]`` uint8 (or float8_e4m3fn/int8 bytes);
            584 bytes per token is V4, 656 is V32, 528 V41 (or V32_NO_ROPE, see ``kv_format``).
        block_table, cache_seqlens: ignored, as FlashMLA ignores them for sparse decode (indices already
            hold flat token positions).
        head_dim_v: must be 512.
        tile_scheduler_metadata: a :class:`FlashMLASchedMeta` (``get_mla_metadata()[0]``); reusable only for
            calls of the same shapes, as FlashMLA checks.
        num_splits: must be None.
        softmax_scale: default ``D_qk ** -0.5``.
        causal: must be False for sparse decode; is_fp8_kvcache: must be True for sparse decode.
        indices: ``[B, s_q, topk]`` int32, ``block * page_block_size + offset``; ``-1`` is invalid.
        attn_sink: ``[H]`` fp32; the output is scaled by ``exp(lse) / (exp(lse) + exp(sink))``.
        extra_k_cache, extra_indices_in_kvcache: a second cache (own page size, same head dim) attended
            in the same softmax.
        topk_length, extra_topk_length: ``[B]`` int32; only the leftmost entries count.
        kv_format: ``"V32"``, ``"V32_NO_ROPE"``, ``"V4"`` or ``"V41"``, the layout of ``k_cache``; only needed for
            ``"V32_NO_ROPE"``, which has V41's 528 bytes per token (None: from the bytes per token, 528 = V41).

    Returns:
        ``out [B, s_q, H, 512]`` bf16 and ``softmax_lse [B, H, s_q]`` fp32 (natural log); a query with
        no valid index gives ``out = 0`` and ``lse = +inf``.
    """
    sched_meta = tile_scheduler_metadata
    _require(isinstance(sched_meta, FlashMLASchedMeta), "tile_scheduler_metadata must be of type FlashMLASchedMeta")
    _require(num_splits is None, "num_splits must be None")
    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        shape = list(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__
        raise ValueError(f"q must be [B, s_q, H, D_qk], got {shape}")
    if not isinstance(k_cache, torch.Tensor) or k_cache.dim() != 4:
        shape = list(k_cache.shape) if isinstance(k_cache, torch.Tensor) else type(k_cache).__name__
        raise ValueError(f"k_cache must be [num_blocks, page_block_size, 1, bytes_per_token], got {shape}")
    topk = indices.shape[-1] if indices is not None else None
    extra_page = extra_k_cache.shape[1] if extra_k_cache is not None else None
    extra_topk = extra_indices_in_kvcache.shape[-1] if extra_indices_in_kvcache is not None else None
    config = FlashMLASchedMeta.Config(
        q.shape[0], q.shape[1], q.shape[2], k_cache.shape[1], k_cache.shape[2],
        causal, is_fp8_kvcache, topk, extra_page, extra_topk,
    )  # fmt: skip
    if not sched_meta.have_initialized:
        if indices is not None:
            _require(
                not causal,
                "causal must be False when indices_in_kvcache is not None (i.e. sparse attention is enabled)",
            )
        sched_meta.have_initialized = True
        sched_meta.config = config
    else:
        _check_sched_meta(sched_meta, config)
    if topk is None:
        raise ValueError("only sparse decode is supported: pass indices [B, s_q, topk] (dense decode is not)")
    _require(not causal, "causal must be False when sparse attention is enabled")
    _require(bool(is_fp8_kvcache), "is_fp8_kvcache must be True when sparse attention is enabled")
    if head_dim_v != 512:
        raise ValueError(f"head_dim_v must be 512, got {head_dim_v}")
    fmt = kv_format_of(k_cache, kv_format)
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
