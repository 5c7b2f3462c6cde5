"""Byte-exact FP8 KV-cache formats of DeepSeek's sparse MLA, as FlashMLA's tests quantize them.

A cache is a ``[num_pages, page_size, bytes_per_token]`` uint8 tensor, contiguous; an ``fp8_model1`` cache may
also have padded pages (``stride(0) > page_size * 584``, as SGLang allocates them: ``ceil(page_size * 584 / 576) *
576`` bytes), which the kernel reads in place.

``fp8_model1`` (DeepSeek-V4, 584 B/token, D_qk = D_v = 512, V includes the rope part).
    Inside one page (``page_size * 584`` bytes) every token's 576 data bytes come first:
    token ``t`` at ``t * 576``: 448 x e4m3 "nope" values, then 64 x bf16 rope values.
    Then every token's 8-byte scale row at ``page_size * 576 + t * 8``: 7 x ue8m0 (one per 64
    nope values, value = 2^(byte - 127)) and one pad byte.

``fp8_v32`` (DeepSeek-V3.2 / GLM-5, 656 B/token, D_qk = 576, D_v = 512, V = the nope part).
    Tokens are interleaved, 656 bytes each: 512 x e4m3, 4 x fp32 scales (one per 128 values),
    64 x bf16 rope values.

Scales are powers of two: ``amax(|tile|) / 448`` rounded up to a power of two
(FlashMLA ``tests/quant.py::_cast_scale_inv_to_ue8m0``), so dequantization is exact in bf16.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

E4M3_MAX = 448.0


@dataclass(frozen=True)
class KVFormat:
    """Geometry of one cache format; every number is in elements unless it says bytes."""

    name: str
    bytes_per_token: int
    d_qk: int  # q.k dims: nope then rope
    d_v: int  # output dims
    d_nope: int  # e4m3-quantized dims
    d_rope: int  # bf16 dims
    group: int  # nope values per scale
    data_stride: int  # bytes between consecutive tokens' data rows inside a page

    @property
    def n_groups(self) -> int:
        return self.d_nope // self.group


FORMATS: dict[str, KVFormat] = {
    "fp8_model1": KVFormat("fp8_model1", 584, 512, 512, 448, 64, 64, 576),
    "fp8_v32": KVFormat("fp8_v32", 656, 576, 512, 512, 64, 128, 656),
}


def get_format(kv_format: str) -> KVFormat:
    try:
        return FORMATS[kv_format]
    except (KeyError, TypeError):
        raise ValueError(f"kv_format must be one of {sorted(FORMATS)}, got {kv_format!r}") from None


def _pow2_scale(amax: torch.Tensor) -> torch.Tensor:
    """amax/448 rounded up to a power of two (FlashMLA: 2^ceil(log2(max(s, 1e-4))))."""
    s = (amax / E4M3_MAX).clamp_min(1e-4)
    return torch.exp2(torch.ceil(torch.log2(s)))


def quantize(kv: torch.Tensor, kv_format: str, page_size: int) -> torch.Tensor:
    """Quantize ``kv [num_tokens, D_qk]`` float into a paged cache ``[num_pages, page_size, bpt]`` uint8.

    ``num_tokens`` is padded with zero tokens up to a multiple of ``page_size``.
    """
    fmt = get_format(kv_format)
    if kv.dim() != 2 or kv.shape[1] != fmt.d_qk:
        raise ValueError(f"kv must be [num_tokens, {fmt.d_qk}] for {fmt.name}, got {list(kv.shape)}")
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    n = kv.shape[0]
    num_pages = -(-n // page_size)
    x = torch.zeros(num_pages * page_size, fmt.d_qk, dtype=torch.float32, device=kv.device)
    x[:n] = kv.float()
    nope = x[:, : fmt.d_nope].reshape(-1, fmt.n_groups, fmt.group)
    scale = _pow2_scale(nope.abs().amax(dim=-1))  # [T, G]
    q8 = (nope / scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    nope_bytes = q8.reshape(-1, fmt.d_nope).view(torch.uint8)
    rope_bytes = x[:, fmt.d_nope :].to(torch.bfloat16).contiguous().view(torch.uint8)  # [T, 128]
    T = x.shape[0]
    if fmt.name == "fp8_v32":
        scale_bytes = scale.contiguous().view(torch.uint8)  # [T, 16]
        tok = torch.cat([nope_bytes, scale_bytes, rope_bytes], dim=1)
        return tok.reshape(num_pages, page_size, fmt.bytes_per_token).contiguous()
    # fp8_model1: data rows then scale rows inside each page
    data = torch.cat([nope_bytes, rope_bytes], dim=1).reshape(num_pages, page_size * fmt.data_stride)
    e8m0 = (torch.log2(scale).round() + 127).to(torch.uint8)  # [T, 7]
    srow = torch.cat([e8m0, torch.zeros(T, 1, dtype=torch.uint8, device=kv.device)], dim=1)
    srow = srow.reshape(num_pages, page_size * 8)
    page = torch.cat([data, srow], dim=1)
    return page.reshape(num_pages, page_size, fmt.bytes_per_token).contiguous()


def dequantize(kv_cache: torch.Tensor, kv_format: str) -> torch.Tensor:
    """Dequantize a paged cache into ``[num_pages * page_size, D_qk]`` float32."""
    fmt = get_format(kv_format)
    check_cache(kv_cache, fmt)
    num_pages, page_size, _ = kv_cache.shape
    T = num_pages * page_size
    if fmt.name == "fp8_v32":
        tok = kv_cache.reshape(T, fmt.bytes_per_token)
        nope_b = tok[:, : fmt.d_nope]
        scale = tok[:, fmt.d_nope : fmt.d_nope + 16].contiguous().view(torch.float32)  # [T, 4]
        rope_b = tok[:, fmt.d_nope + 16 :]
    else:
        page = kv_cache.reshape(num_pages, page_size * fmt.bytes_per_token)
        data = page[:, : page_size * fmt.data_stride].reshape(T, fmt.data_stride)
        nope_b = data[:, : fmt.d_nope]
        rope_b = data[:, fmt.d_nope :]
        srow = page[:, page_size * fmt.data_stride :].reshape(T, 8)
        scale = torch.exp2(srow[:, : fmt.n_groups].float() - 127)
    nope = nope_b.contiguous().view(torch.float8_e4m3fn).float().reshape(T, fmt.n_groups, fmt.group)
    nope = (nope * scale[..., None]).reshape(T, fmt.d_nope)
    rope = rope_b.contiguous().view(torch.bfloat16).float()
    return torch.cat([nope, rope], dim=1)


def check_cache(kv_cache: torch.Tensor, fmt: KVFormat) -> None:
    if kv_cache.dtype != torch.uint8 or kv_cache.dim() != 3 or kv_cache.shape[2] != fmt.bytes_per_token:
        raise ValueError(
            f"kv_cache must be a [num_pages, page_size, {fmt.bytes_per_token}] uint8 tensor for {fmt.name}, "
            f"got {list(kv_cache.shape)} {kv_cache.dtype}"
        )
    if kv_cache.is_contiguous():
        return
    num_pages, page_size, bpt = kv_cache.shape
    page_bytes = kv_cache.stride(0)
    padded = (
        fmt.name == "fp8_model1"
        and kv_cache.stride()[1:] == (bpt, 1)
        and page_bytes >= page_size * bpt
        and page_bytes % 4 == 0
    )
    if not padded:
        raise ValueError(
            f"kv_cache must be contiguous, or for fp8_model1 pages of [page_size, {fmt.bytes_per_token}] bytes "
            f"with a page stride of at least page_size * {fmt.bytes_per_token} bytes and a multiple of 4; "
            f"got strides {list(kv_cache.stride())}"
        )
