"""Byte-exact FP8 / FP4 KV-cache formats of DeepSeek's and GLM's sparse MLA, as FlashMLA's tests quantize them.

A cache is a ``[num_pages, page_size, bytes_per_token]`` uint8 tensor, contiguous; a block-split cache
(``fp8_model1``, ``fp8_v41``, ``fp4_v41``) may also have padded pages (``stride(0) > page_size * bytes_per_token``,
as SGLang allocates them: ``ceil(page_size * 584 / 576) * 576`` bytes for ``fp8_model1``, a multiple of 512 for
``fp8_v41`` and of 256 for ``fp4_v41``), which the kernel reads in place.

``fp8_model1`` (DeepSeek-V4, 584 B/token, D_qk = D_v = 512, V includes the rope part).
    Inside one page (``page_size * 584`` bytes) every token's 576 data bytes come first:
    token ``t`` at ``t * 576``: 448 x e4m3 "nope" values, then 64 x bf16 rope values.
    Then every token's 8-byte scale row at ``page_size * 576 + t * 8``: 7 x ue8m0 (one per 64
    nope values, value = 2^(byte - 127)) and one pad byte.

``fp8_v32`` (DeepSeek-V3.2 / GLM-5, 656 B/token, D_qk = 576, D_v = 512, V = the nope part).
    Tokens are interleaved, 656 bytes each: 512 x e4m3, 4 x fp32 scales (one per 128 values),
    64 x bf16 rope values.

``fp8_v32_nope`` (DeepSeek-V3.2 without RoPE, GLM-5.3; SGLang's and FlashMLA's ``kv_format="V32_NO_ROPE"``,
    528 B/token, D_qk = D_v = 512). The first 528 bytes of ``fp8_v32``: tokens interleaved, 528 bytes each,
    512 x e4m3, then 4 x fp32 scales (one per 128 values), no rope part.

``fp8_v41`` (DeepSeek-V4.1, FlashMLA's "V41", SGLang's ``KVLayout.V41``; 528 B/token, D_qk = D_v = 512, the 64
    rope dims quantized too). Block-split, like ``fp8_model1``: inside one page every token's 512 x e4m3 data
    row comes first (token ``t`` at ``t * 512``), then every token's 16-byte scale row at
    ``page_size * 512 + t * 16``: 16 x ue8m0, one per 32 consecutive values.

``fp4_v41`` (DeepSeek-V4.1's compressed cache, FlashMLA's "V41 fp4", SGLang's ``KVLayout.V41_FP4``; 288 B/token,
    only as the extra cache next to an ``fp8_v41`` main cache). Block-split: token ``t``'s 256-byte data row at
    ``t * 256`` holds 512 x e2m1, value ``2i`` in the low nibble of byte ``i`` and ``2i + 1`` in the high one; its
    32-byte scale row at ``page_size * 256 + t * 32``: 32 x e4m3, one per 16 consecutive values.

Sources of every offset (none of their code is copied):
  - FlashMLA's docstring of ``flash_mla_with_kvcache`` (``flash_mla/flash_mla_interface.py``, sgl-project/FlashMLA,
    the ``sgl-flash-mla`` 1.0.0 wheel): the V3.2-no-RoPE bytes ("the first 528 Bytes of the V3.2 layout"), and for
    V4 / V4.1 / V4.1 fp4 "a page block stores page_block_size data rows first and page_block_size scale rows
    afterwards", with the byte counts, groups and nibble order above; its ``tests/quant.py`` (``KVCacheLayout``
    ``V41_FP8Sparse``, ``V41_FP4``, ``V32_NO_ROPE_FP8Sparse``) for the scale rules below.
  - SGLang 0.5.23: ``sglang/kernels/ops/attention/dsv4/kv_layout.py`` (``KVLayout.V41``: data 512 + scales 16,
    tile 32; ``V41_FP4``: 256 + 32, tile 16; ``row_addressing``: slot ``i``'s data at ``i * data_bytes``, its scales
    at ``page_size * data_bytes + i * scale_bytes``), its test oracle
    ``sglang/test/kernels/deepseek_v4/dsv41_kv_quant_reference.py``, and
    ``sglang/kernels/ops/quantization/dsa_quant_k_cache.py`` (the V3.2 / no-RoPE writer: ``[512 e4m3 | 4 fp32]``).
  - FlashInfer's ``tests/attention/sparse_mla_test_utils.py`` (``quantize_kv_dsv4_1``: the "FOOTER" layout,
    ``[bs * 512 data | bs * 16 scales]`` per page; ``quantize_kv_dsv4_1_fp4``).

Which arrangement the engines write (checked in SGLang 0.5.23's ``srt/mem_cache/deepseek_v4_memory_pool.py``,
``select_dsv4_kv_layout``): the block-split ``V41`` by default, and ``V41_FP4`` for the compressed caches of ratio 1
and 2 (ratios 4 and 128 stay ``V41`` fp8); the token-interleaved ``V41_NEW`` / ``V41_FP4_NEW`` (each token's scales
right after its data, FlashMLA's 2026.09.30 kernels) only when ``SGLANG_DSV4_KV_LAYOUT=v41_new`` is set, and SGLang
writes V4.1 at all only on SM100/SM103 (sm_120 keeps V4). FlashInfer's sm_120 ``dsv4_1`` tests pack the block-split
one. So the block-split arrangement is the one implemented; the interleaved one is not.

Scales: ``fp8_model1``, ``fp8_v32``, ``fp8_v32_nope`` and ``fp8_v41`` are powers of two here, ``amax(|tile|) / 448``
rounded up (FlashMLA ``tests/quant.py::_cast_scale_inv_to_ue8m0``), so dequantization is exact in bf16; the kernel
also reads the arbitrary fp32 scales SGLang's V3.2 writer stores (``amax / 448``). ``fp4_v41``: the scale is
``amax / 6`` clamped to ``[2^-9, 448]`` and rounded to e4m3, the values ``x / scale`` rounded to the nearest e2m1
(ties to even, saturating at 6), as FlashMLA's ``tests/quant.py`` and SGLang's oracle describe it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: torch is imported where a tensor is made or read
    import torch

E4M3_MAX = 448.0


@dataclass(frozen=True)
class KVFormat:
    """Geometry of one cache format; every number is in elements unless it says bytes."""

    name: str
    bytes_per_token: int
    d_qk: int  # q.k dims: nope then rope
    d_v: int  # output dims
    d_nope: int  # quantized dims (fp8_v41 and fp4_v41: all 512, the rope dims included)
    d_rope: int  # bf16 dims
    group: int  # quantized values per scale
    data_stride: int  # bytes between consecutive tokens' data rows inside a page
    scale: str = "ue8m0"  # how a scale is stored: ue8m0 (one byte, 2^(b - 127)), fp32 or e4m3
    element: str = "e4m3"  # how a value is stored: e4m3 (one byte) or e2m1 (a nibble)
    block_split: bool = False  # a page's data rows, then its scale rows (else one row per token, scales inside)
    scale_row: int = 0  # block-split: bytes of one token's scale row
    extra_only: bool = False  # only as the extra cache, next to a main cache of ``EXTRA_PAIRS``

    @property
    def n_groups(self) -> int:
        return self.d_nope // self.group


FORMATS: dict[str, KVFormat] = {
    "fp8_model1": KVFormat("fp8_model1", 584, 512, 512, 448, 64, 64, 576, block_split=True, scale_row=8),
    "fp8_v32": KVFormat("fp8_v32", 656, 576, 512, 512, 64, 128, 656, scale="fp32"),
    "fp8_v32_nope": KVFormat("fp8_v32_nope", 528, 512, 512, 512, 0, 128, 528, scale="fp32"),
    "fp8_v41": KVFormat("fp8_v41", 528, 512, 512, 512, 0, 32, 512, block_split=True, scale_row=16),
    "fp4_v41": KVFormat(
        "fp4_v41",
        288,
        512,
        512,
        512,
        0,
        16,
        256,
        scale="e4m3",
        element="e2m1",
        block_split=True,
        scale_row=32,
        extra_only=True,
    ),  # fmt: skip
}

# (main, extra) pairs of different formats one call may attend (FlashMLA ``is_valid_kv_format_pair``: the fp4
# cache only next to a V4.1 fp8 main cache); any format pairs with itself unless it is extra-only.
EXTRA_PAIRS = {("fp8_v41", "fp4_v41")}

# FlashMLA's ``kv_format`` names (``flash_mla_with_kvcache(..., kv_format=...)``); the fp4 cache has none of its
# own (FlashMLA tells it by its 288 bytes per token).
FLASHMLA_NAMES = {"fp8_model1": "V4", "fp8_v32": "V32", "fp8_v32_nope": "V32_NO_ROPE", "fp8_v41": "V41"}


def check_pair(kv_format: str, extra_kv_format: str | None) -> None:
    """ValueError unless ``kv_format`` may be a main cache and ``extra_kv_format`` (None: none) its extra cache."""
    fmt = get_format(kv_format)
    if fmt.extra_only:
        mains = sorted(m for m, x in EXTRA_PAIRS if x == fmt.name)
        raise ValueError(f"{fmt.name} is an extra cache only (next to a {' or '.join(mains)} main cache)")
    if extra_kv_format is None:
        return
    efmt = get_format(extra_kv_format)
    if efmt.name != fmt.name and (fmt.name, efmt.name) not in EXTRA_PAIRS:
        allowed = [fmt.name] + sorted(x for m, x in EXTRA_PAIRS if m == fmt.name)
        raise ValueError(f"an extra cache of {efmt.name} cannot go with a {fmt.name} main cache; allowed: {allowed}")


def get_format(kv_format: str) -> KVFormat:
    try:
        return FORMATS[kv_format]
    except (KeyError, TypeError):
        raise ValueError(f"kv_format must be one of {sorted(FORMATS)}, got {kv_format!r}") from None


def _pow2_scale(amax: torch.Tensor) -> torch.Tensor:
    """amax/448 rounded up to a power of two (FlashMLA: 2^ceil(log2(max(s, 1e-4))))."""
    import torch

    s = (amax / E4M3_MAX).clamp_min(1e-4)
    return torch.exp2(torch.ceil(torch.log2(s)))


def quantize(kv: torch.Tensor, kv_format: str, page_size: int) -> torch.Tensor:
    """Quantize ``kv [num_tokens, D_qk]`` float into a paged cache ``[num_pages, page_size, bpt]`` uint8.

    ``num_tokens`` is padded with zero tokens up to a multiple of ``page_size``.
    """
    import torch

    fmt = get_format(kv_format)
    if kv.dim() != 2 or kv.shape[1] != fmt.d_qk:
        raise ValueError(f"kv must be [num_tokens, {fmt.d_qk}] for {fmt.name}, got {list(kv.shape)}")
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    n = kv.shape[0]
    num_pages = -(-n // page_size)
    x = torch.zeros(num_pages * page_size, fmt.d_qk, dtype=torch.float32, device=kv.device)
    x[:n] = kv.float()
    if fmt.name in _ROW_FORMATS:
        return _quantize_rows(x, fmt, page_size).reshape(num_pages, page_size, fmt.bytes_per_token).contiguous()
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
    import torch

    fmt = get_format(kv_format)
    check_cache(kv_cache, fmt)
    num_pages, page_size, _ = kv_cache.shape
    T = num_pages * page_size
    if fmt.name in _ROW_FORMATS:
        return decode_rows(*gather_rows(kv_cache, torch.arange(T, device=kv_cache.device), fmt), fmt)
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


# The formats quantized and decoded by rows (_quantize_rows, gather_rows, decode_rows): the V4.1 and no-RoPE ones.
_ROW_FORMATS = ("fp8_v32_nope", "fp8_v41", "fp4_v41")

E2M1_MAX = 6.0
# e2m1 magnitudes by the code's low three bits (bit 3 is the sign): 1 exponent bit pair (bias 1), 1 mantissa bit
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """Round float ``x`` to the nearest e2m1 value, ties to the even code, saturating at +-6: 4-bit codes (uint8).

    The rounding of PTX ``cvt.rn.satfinite.e2m1x2.f32``, as FlashMLA's and SGLang's quantizers describe it.
    """
    import torch

    values = torch.tensor(E2M1_VALUES, device=x.device)
    mids = (values[1:] + values[:-1]) / 2  # the 7 rounding boundaries
    a = x.float().abs().clamp_max(E2M1_MAX)
    code = torch.bucketize(a, mids)  # a on a boundary -> the lower neighbour
    on_mid = (code < 7) & (a == mids[code.clamp(max=6)])
    code = code + (on_mid & (code % 2 == 1)).long()  # a tie goes to the even code
    return (code | (torch.signbit(x).long() << 3)).to(torch.uint8)


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """4-bit e2m1 codes (uint8) -> float32."""
    import torch

    mag = torch.tensor(E2M1_VALUES, device=codes.device)[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -mag, mag)


def _quantize_rows(x: torch.Tensor, fmt: KVFormat, page_size: int) -> torch.Tensor:
    """``x [T, 512]`` float32, T a whole number of pages -> the cache's bytes, ``T * bytes_per_token`` of them
    in order (see the module docstring: token rows for fp8_v32_nope; per page, its data rows then its scale rows
    for fp8_v41 and fp4_v41)."""
    import torch

    T = x.shape[0]
    tiles = x.reshape(T, fmt.n_groups, fmt.group)
    amax = tiles.abs().amax(dim=-1)  # [T, G]
    if fmt.element == "e2m1":
        scale = (amax / E2M1_MAX).clamp(2.0**-9, E4M3_MAX).to(torch.float8_e4m3fn)
        codes = e2m1_codes(tiles / scale.float()[..., None]).reshape(T, fmt.d_nope)
        data = codes[:, 0::2] | (codes[:, 1::2] << 4)  # [T, 256]: value 2i low nibble, 2i + 1 high
        scale_bytes = scale.view(torch.uint8)  # [T, 32]
    else:
        scale = _pow2_scale(amax)
        data = (tiles / scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        data = data.reshape(T, fmt.d_nope).view(torch.uint8)
        if fmt.scale == "fp32":  # fp8_v32_nope: one row per token, [512 e4m3 | 4 fp32]
            return torch.cat([data, scale.contiguous().view(torch.uint8)], dim=1)
        scale_bytes = (torch.log2(scale).round() + 127).to(torch.uint8)  # ue8m0 [T, 16]
    # block-split: a page's data rows, then its scale rows
    num_pages = T // page_size
    return torch.cat([data.reshape(num_pages, -1), scale_bytes.reshape(num_pages, -1)], dim=1)


def gather_rows(kv_cache: torch.Tensor, idx: torch.Tensor, fmt: KVFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """The data and scale bytes of flat token positions ``idx`` (any shape, all valid) of a row format's cache
    (padded pages included): ``(data [..., data_bytes], scales [..., scale_bytes])`` uint8."""
    import torch

    num_pages, page_size, bpt = kv_cache.shape
    page_bytes = kv_cache.stride(0)
    flat = kv_cache.as_strided(((num_pages - 1) * page_bytes + page_size * bpt,), (1,))
    idx = idx.long()
    if fmt.block_split:
        base = (idx // page_size) * page_bytes
        off = idx % page_size
        o_data = base + off * fmt.data_stride
        o_scale = base + page_size * fmt.data_stride + off * fmt.scale_row
        n_scale = fmt.scale_row
    else:
        o_data = idx * bpt  # contiguous token rows
        o_scale = o_data + fmt.d_nope
        n_scale = bpt - fmt.d_nope
    data = flat[o_data[..., None] + torch.arange(fmt.data_stride if fmt.block_split else fmt.d_nope, device=idx.device)]
    scales = flat[o_scale[..., None] + torch.arange(n_scale, device=idx.device)]
    return data, scales


def decode_rows(data: torch.Tensor, scales: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """Token rows' bytes (:func:`gather_rows`) -> their values ``[..., 512]`` float32."""
    import torch

    if fmt.element == "e2m1":
        codes = torch.stack([data & 0xF, data >> 4], dim=-1).flatten(-2)  # [..., 512]: low nibble first
        values = e2m1_values(codes)
        scale = scales.contiguous().view(torch.float8_e4m3fn).float()
    else:
        values = data.contiguous().view(torch.float8_e4m3fn).float()
        if fmt.scale == "fp32":
            scale = scales.contiguous().view(torch.float32)
        else:
            scale = torch.exp2(scales.float() - 127)
    return (values.unflatten(-1, (fmt.n_groups, fmt.group)) * scale[..., None]).flatten(-2)


def check_cache(kv_cache: torch.Tensor, fmt: KVFormat) -> None:
    import torch

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
        fmt.block_split and kv_cache.stride()[1:] == (bpt, 1) and page_bytes >= page_size * bpt and page_bytes % 4 == 0
    )
    if not padded:
        raise ValueError(
            f"kv_cache must be contiguous, or for a block-split format pages of [page_size, {fmt.bytes_per_token}] "
            "bytes "
            f"with a page stride of at least page_size * {fmt.bytes_per_token} bytes and a multiple of 4; "
            f"got strides {list(kv_cache.stride())}"
        )
