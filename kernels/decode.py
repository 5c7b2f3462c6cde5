"""Sparse MLA decode (MQA form) over one or two paged FP8 / FP4 KV caches, in Triton.

The cache format is the constexpr ``FORMAT`` (``FORMAT_IDS``): fp8_model1 0, fp8_v32 1, fp8_v32_nope 2, fp8_v41 3,
fp4_v41 4 (``kernels/kv_format.py``; docs/kernel.md, "The cache formats"). The formats without a bf16 part (2-4)
are loaded and dequantized by their own helpers (``_gather_quant_tile``, ``_dequant_quant_tile``).

Two kernels:
  ``_split_kernel``   One program takes BLOCK_H heads of one query token and one contiguous slice of its
                      row (the main cache's top-k list in whole tiles, then the extra cache's), walks it
                      in BLOCK_T-token tiles (gather, dequantize, q.k^T, online softmax, p.v) and writes
                      bf16 partials and their fp32 lse -- or, when the whole call is one split per row,
                      the final bf16 output (times the sink factor)
                      and lse directly. How the slices are dealt (``BALANCED``, searched per level):
                      0: grid (B * s_q * head_blocks, num_splits), every row cut alike. 1: grid
                      (programs, head_blocks), the batch's tiles cut into equal runs that may cross a
                      row's end (one partial per row touched), so no partial wave of whole rows' splits.
  ``_combine_kernel`` grid (B * s_q * H,). Merges the splits of one (query token, head) by log-sum-exp
                      in fp32, then applies the attention sink. Not launched when the call is a single split,
                      nor with ``MERGE=1``.

The merge in the split launch (``MERGE``, searched): each program of a row, its partial stored, takes a ticket
from the row's counter (one int32 per row and head block, an acquire/release atomic); the one that gets the last
ticket sets the counter back to 0 and merges the row's slots in slot order, whichever program it is (the same
bits on a repeat), and adds the sink (:func:`_merge_row`). The counters are zeroed once and left at zero by every
call (:func:`merge_counters`), so a captured graph replays without a memset. It reads every partial in one CTA
(splits x heads x 1 KB), so it pays with few splits per row; the combine spreads many over the GPU.

Latency hiding (``PREFETCH``, searched per concurrency level): a tile needs two dependent global loads,
its indices and then the KV bytes they point to. 0: both wait at the top of the tile. 1: tile i+1's indices
and KV bytes are loaded into registers before tile i's math, so the KV latency hides behind the dots at the
cost of a second tile in registers (Triton's pipeliner then leaves the loop alone, so num_stages changes
nothing); the gather still waits for the indices it was just given. 3: as 1, with tile i+2's indices loaded
too, so no gather waits for its addresses (the index registers of a third tile: fp8_model1 spills more).
2: only tile i+1's indices are loaded ahead (one register per token), so the KV gather's address is ready
when the tile starts; the choice where the whole tile does not fit in the registers.

Programmatic dependent launch (sm_90+, sm_120 included): both kernels are launched with ``launch_pdl``,
wait for the kernel before them (``griddepcontrol.wait``) before reading anything and then let the next
one launch, so each launch overlaps the tail of the kernel before it.

A call launches the split kernel once (over both caches when there is an extra one) and, unless a row is one split
or ``MERGE=1``, the combine once; see :func:`sparse_mla_decode`.
Partial outputs are bf16, like the final output: at V4 C=96 they halve the split's own traffic
(about 19 MB written and read back in fp32), while the lse that weights them stays fp32.

Head blocking: BLOCK_H = max(16, next_pow2(H)) capped at 32 (tl.dot needs M >= 16; 32 heads of
fp32 accumulators [32, 512] are already 128 registers/thread at 4 warps), so head_blocks = ceil(H / 32)
for H > 32. Every KV tile is read once per head block.

KV loads: fp8_v32's (and fp8_v32_nope's) 512 e4m3 bytes per token are loaded as 128 32-bit words when the tile
loop is not staged (``WORDS``, see :func:`kv_words`); the tile is then dequantized as four interleaved slices (byte j
of word m is dim 4m + j), q is split the same way, and P.V fills four [BLOCK_H, 128] accumulators that are
interleaved once per program, so no byte shuffle is left in the loop.

Dots in chunks (fp8_model1): the dequantized tile [BLOCK_T, 512] is split into four chunks of 128 contiguous
dims, and q . k and P . V are four dots each, into four [BLOCK_H, 128] accumulators placed side by side once
per program. With one dot over all 512 dims every warp held the whole q operand [BLOCK_H, 512] (the mma's
warps split the tokens and the output columns, not the reduced dims): 128 registers per thread at 16 heads.
In chunks, T32-w4-s1 with PREFETCH=1 (V4's pick from C=48 up) keeps 255 registers and loses its 64 B spill,
and T16-w4-s1 with PREFETCH=2 drops from 254 to 168 (compiled for sm_90). Measured on the H200
(docs/benchmarks.md, kernel v10 candidate): V4 C=96 38.0 -> 33.6 us at v9's config. At BLOCK_T >= 32, q . k's
four dots (the word path's five: its slices and the rope) are independent, each scaled before a tree sum, so their
mma chains are a quarter as long (added straight together, Triton's combiner fuses them back: dot(a, b, 0) + c ->
dot(a, b, c)); at BLOCK_T 16 that cost T16-w4-s1-p2 14 registers and a CTA per SM, so it keeps one chain (168).

Dequantization (see :func:`_dequant`): the dots take fp16 operands on the GPU. e4m3 converts to fp16
exactly (one native cvt per byte pair on sm_89+, sm_120 included), and one fp16 multiply applies the
group's scale; K and V never pass through fp32. Without native fp8 the bit assembly
``sign<<15 | (byte & 0x7f)<<7`` gives the same number times 2^-8 in fp16, subnormals included, and
the 2^8 is folded into the scale. q and the rope part are converted from bf16 to fp16 (fp16's finer
mantissa; its range, 6e-8 to 65504, holds attention's q and K). Dequantizing to bf16 instead, with
the scale multiply in bf16, measured up to 8 % slower on the H200 (docs/benchmarks.md, kernel v3).

Interpreter workaround: Triton 3.6's interpreter multiplies the raw bits of bf16 ``tl.dot`` operands.
Under ``TRITON_INTERPRET=1`` the constexpr ``DOT_F32`` makes both dots take fp32 operands (decoded by
the bit assembly); the GPU path feeds fp16 to the tensor cores with fp32 accumulation.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents
from triton.language.extra.cuda import gdc_wait

from sparse_mla_tuner.kernels.config import DEFAULT_CONFIG
from sparse_mla_tuner.kernels.config import MAX_TARGET_CTAS
from sparse_mla_tuner.kernels.config import KernelConfig
from sparse_mla_tuner.kernels.config import block_h_for
from sparse_mla_tuner.kernels.config import split_grid
from sparse_mla_tuner.kernels.kv_format import KVFormat
from sparse_mla_tuner.kernels.kv_format import check_cache
from sparse_mla_tuner.kernels.kv_format import check_pair
from sparse_mla_tuner.kernels.kv_format import get_format
from sparse_mla_tuner.kernels.table import lookup_config
from sparse_mla_tuner.kernels.workload import Workload

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
FORMAT_IDS = {"fp8_model1": 0, "fp8_v32": 1, "fp8_v32_nope": 2, "fp8_v41": 3, "fp4_v41": 4}

# Fill outputs and workspace with NaN before launching, so an unwritten element fails the
# correctness gate loudly (the tuner's gate and the tests set it; never needed in production).
POISON_OUTPUTS = False

# The combine's shape (combine_shape). A call of many splits and few rows, at least COMBINE_TILE_MIN_SPLITS
# splits and at most COMBINE_TILE_MAX_ROWS partial rows (rows x heads x splits), splits the 512 columns over
# 8 programs, each merging a [splits, 64] tile (up to COMBINE_TILE elements) per iteration; other calls of up
# to COMBINE_UNROLL_MAX_SPLITS splits and COMBINE_UNROLL_MAX_ROWS partial rows merge 8 rows of 512 per
# iteration, and larger calls one. Measured on the H200 (docs/benchmarks.md, kernels v7 and v8): the tile
# cut V3.2's calls of 32 splits at C=1, 2 and 4 by 0.4-1.9 us and of 64 splits at C=1-4 by 5-8 us; it lost
# 0.1-4.6 us with 8 or 16 splits from 64 rows x heads up, and 64 columns beat 128 and 256 per program. The
# rows of 512 saved 0.3-1.9 us at up to 1024 partial rows of up to 32 splits, and cost 0.9-2.0 us beyond.
COMBINE_TILE_MIN_SPLITS = 32
COMBINE_TILE_MAX_ROWS = 4096
COMBINE_TILE = 4096
COMBINE_UNROLL_MAX_SPLITS = 32
COMBINE_UNROLL_MAX_ROWS = 1024

# Under programmatic dependent launch the split kernel lets the combine launch at the split's start, so that the
# combine's programs wait on SMs the split leaves idle and its launch is hidden; when the split launch has more
# programs than the GPU has SMs, after its stores instead (LATE_TRIGGER), so that they do not take SMs the split's
# programs still need. Measured on the H200 (docs/benchmarks.md, kernel v8, the launch order): the late trigger
# saved 0.3-2.5 us on V4 from C=24 up and 1.4-4.4 us on V3.2 from C=4 up, and cost up to 1.4 us with fewer
# programs than SMs.

# The smallest BLOCK_T of a call with this extra cache format (others: 16). Triton 3.6 computes P @ V over the
# fp4_v41 tile wrongly at BLOCK_T 16 (H200: out garbage, lse right; docs/kernel.md, "The cache formats"): the
# tile's def chain starts from bytes, so the compiler gives the dot's fp16 operands kWidth 8, which a dot of K = 16
# (the tile's tokens) cannot hold (4 lanes x 8 > 16; fixed upstream after 3.6, triton-lang/triton#11691).
MIN_BLOCK_T = {"fp4_v41": 32}


def min_block_t(extra_format: str | None) -> int:
    """The smallest BLOCK_T a call with an extra cache of ``extra_format`` (None: no extra cache) may use."""
    return MIN_BLOCK_T.get(extra_format, 16) if extra_format else 16


def check_block_t(config: KernelConfig, extra_format: str | None) -> None:
    """ValueError in one sentence when ``config``'s BLOCK_T is below :func:`min_block_t` for this extra cache."""
    need = min_block_t(extra_format)
    if config.BLOCK_T < need:
        raise ValueError(
            f"config {config}: a call with an {extra_format} extra cache needs BLOCK_T >= {need} (Triton 3.6 "
            f"computes its P.V wrongly at BLOCK_T 16 on the GPU), got BLOCK_T {config.BLOCK_T}"
        )


# Called as fn(kernel_name, config, grid) before every launch; the tests count and inspect launches with it.
LAUNCH_LISTENERS: list[Callable[[str, KernelConfig, tuple], None]] = []


@triton.jit
def _dequant(b_u8, b_scale, NATIVE_FP8: tl.constexpr, DOT_F32: tl.constexpr):
    """e4m3 bytes times their fp32 scale (``b_scale`` broadcasts against the bytes), as the dots' operand.

    GPU: fp16. The decode is exact (one native cvt per byte pair on sm_89+, else the bit trick, which
    yields the value times 2^-8), then one fp16 multiply by the scale rounded to fp16. Interpreter:
    fp32 (its bf16 and fp16 dots are not trusted), by the bit trick.
    """
    if DOT_F32:
        b = b_u8.to(tl.uint16)
        x = (((b & 0x80) << 8) | ((b & 0x7F) << 7)).to(tl.float16, bitcast=True).to(tl.float32)
        return x * (b_scale * 256.0)
    if NATIVE_FP8:
        return b_u8.to(tl.float8e4nv, bitcast=True).to(tl.float16) * b_scale.to(tl.float16)
    b = b_u8.to(tl.uint16)
    x = (((b & 0x80) << 8) | ((b & 0x7F) << 7)).to(tl.float16, bitcast=True)
    return x * (b_scale * 256.0).to(tl.float16)


@triton.jit
def _gather_kv_tile(
    KV8, KV16, KV32, b_idx, m_tok, in_x, FORMAT: tl.constexpr, PAGE_SIZE: tl.constexpr, PAGE_BYTES: tl.constexpr,
    X_PAGE_SIZE: tl.constexpr, X_PAGE_BYTES: tl.constexpr, WORDS: tl.constexpr,
):  # fmt: skip
    """Issue the loads of one tile: (e4m3 bytes, their scales as stored, the bf16 rope part).

    fp8_model1: bytes [T, 8, 64] (group 7 is not read), ue8m0 exponents [T, 8] (uint8), rope [T, 64],
    which is dims 448..511 of the key and of V. fp8_v32: bytes [T, 4, 128], or with ``WORDS`` the same
    512 bytes as 128 32-bit words [T, 128] (word m holds dims 4m..4m+3); fp32 scales [T, 4], rope [T, 64]
    (keys only). Masked-out tokens (``m_tok`` false) are never read. Offsets are written per view (bytes,
    bf16 or fp32 elements) from the token index so that Triton can prove their alignment and vectorize
    the loads. Nothing here waits for the data: the loop issues the next tile's gather before it
    computes on this one. ``in_x`` (a scalar) says the tile is the extra cache's, whose pages are
    ``X_PAGE_SIZE`` tokens ``X_PAGE_BYTES`` apart (fp8_model1; the same as the main cache's when one loop
    walks one cache or two caches of one page layout).
    """
    o_rope = tl.arange(0, 64)
    if FORMAT == 0:
        o_g = tl.arange(0, 8)
        o_j = tl.arange(0, 64)
        if X_PAGE_SIZE == PAGE_SIZE and X_PAGE_BYTES == PAGE_BYTES:
            if (PAGE_SIZE & (PAGE_SIZE - 1)) == 0:  # int32 shift and mask (the indices are >= 0 here)
                b_page = (b_idx >> (PAGE_SIZE.bit_length() - 1)).to(tl.int64)
                b_tok = (b_idx & (PAGE_SIZE - 1)).to(tl.int64)
            else:
                b_idx = b_idx.to(tl.int64)
                b_page = b_idx // PAGE_SIZE
                b_tok = b_idx % PAGE_SIZE
            o_data = b_page * PAGE_BYTES + b_tok * 576  # [T] bytes
            o_scale = b_page * PAGE_BYTES + PAGE_SIZE * 576 + b_tok * 8
            o_rope16 = b_page * (PAGE_BYTES // 2) + b_tok * 288 + 224  # bf16 elements
        else:
            # two page layouts in one loop (the host checks both strides are whole 16-byte units): the
            # tile's cache selects its page size and stride; offsets are built in 16- and 8-byte units and
            # then scaled by constants, so that Triton still proves the alignment that vectorizes the loads
            if (PAGE_SIZE & (PAGE_SIZE - 1)) == 0 and (X_PAGE_SIZE & (X_PAGE_SIZE - 1)) == 0:
                # page sizes of powers of two: one shift and one mask per token, chosen once per tile
                # (the indices are >= 0 here: _tile_indices replaced the masked ones by 0)
                LOG: tl.constexpr = PAGE_SIZE.bit_length() - 1
                X_LOG: tl.constexpr = X_PAGE_SIZE.bit_length() - 1
                sh = tl.where(in_x, X_LOG, LOG)
                b_page = (b_idx >> sh).to(tl.int64)
                b_tok = (b_idx & ((1 << sh) - 1)).to(tl.int64)
            else:
                b_idx = b_idx.to(tl.int64)
                b_page = tl.where(in_x, b_idx // X_PAGE_SIZE, b_idx // PAGE_SIZE)
                b_tok = tl.where(in_x, b_idx % X_PAGE_SIZE, b_idx % PAGE_SIZE)
            b_row16 = b_page * tl.where(in_x, X_PAGE_BYTES // 16, PAGE_BYTES // 16) + b_tok * 36
            o_data = b_row16 * 16
            o_scale = (b_page * tl.where(in_x, X_PAGE_BYTES // 8, PAGE_BYTES // 8) + b_tok) * 8 + tl.where(
                in_x, X_PAGE_SIZE * 576, PAGE_SIZE * 576
            )
            o_rope16 = b_row16 * 8 + 224
        o_nope = o_data[:, None, None] + o_g[None, :, None] * 64 + o_j[None, None, :]
        m_nope = m_tok[:, None, None] & (o_g[None, :, None] < 7)
        b_q8 = tl.load(KV8 + o_nope, mask=m_nope, other=0)
        m_scale = m_tok[:, None] & (o_g[None, :] < 7)
        b_sc = tl.load(KV8 + o_scale[:, None] + o_g[None, :], mask=m_scale, other=127)
        b_rope = tl.load(KV16 + o_rope16[:, None] + o_rope[None, :], mask=m_tok[:, None], other=0.0)
    elif FORMAT == 1:
        b_idx = b_idx.to(tl.int64)
        o_g = tl.arange(0, 4)
        if WORDS:
            o_w = tl.arange(0, 128)
            b_q8 = tl.load(KV32 + b_idx[:, None] * 164 + o_w[None, :], mask=m_tok[:, None], other=0.0)
            b_q8 = b_q8.to(tl.int32, bitcast=True)  # [T, 128]
        else:
            o_j = tl.arange(0, 128)
            o_nope = b_idx[:, None, None] * 656 + o_g[None, :, None] * 128 + o_j[None, None, :]
            b_q8 = tl.load(KV8 + o_nope, mask=m_tok[:, None, None], other=0)
        b_sc = tl.load(KV32 + (b_idx * 164 + 128)[:, None] + o_g[None, :], mask=m_tok[:, None], other=0.0)
        b_rope = tl.load(KV16 + (b_idx * 328 + 264)[:, None] + o_rope[None, :], mask=m_tok[:, None], other=0.0)
    else:  # the formats without a bf16 part (no rope tile: the scales stand in for it)
        b_q8, b_sc = _gather_quant_tile(KV8, KV32, b_idx, m_tok, FORMAT, PAGE_SIZE, PAGE_BYTES, WORDS)
        b_rope = b_sc
    return b_q8, b_sc, b_rope


@triton.jit
def _dequant_kv_tile(
    b_q8, b_sc, b_rope, FORMAT: tl.constexpr, BLOCK_T: tl.constexpr, DOT_F32: tl.constexpr, NATIVE_FP8: tl.constexpr
):
    """One gathered byte tile as the dots' operands: (k [BLOCK_T, 512], k_rope [BLOCK_T, 64]).

    fp8_model1: k is the whole 512-dim key (448 nope + 64 rope, which is also V); k_rope is unused.
    fp8_v32:    k is the 512 nope dims (also V) and k_rope the 64 rope dims (keys only).
    fp8_v32_nope, fp8_v41, fp4_v41: k is the whole key (also V), every dim quantized; k_rope is unused.
    """
    if FORMAT == 0:
        o_g = tl.arange(0, 8)
        b_scale = (b_sc.to(tl.uint32) << 23).to(tl.float32, bitcast=True)  # 2^(e - 127) exactly
        b_nope = _dequant(b_q8, b_scale[:, :, None], NATIVE_FP8, DOT_F32)
        b_k3 = tl.where((o_g == 7)[None, :, None], b_rope.to(b_nope.dtype)[:, None, :], b_nope)
        b_k = tl.reshape(b_k3, (BLOCK_T, 512))
        b_kr = tl.zeros((BLOCK_T, 64), dtype=b_k.dtype)
    elif FORMAT == 1:
        b_k3 = _dequant(b_q8, b_sc[:, :, None], NATIVE_FP8, DOT_F32)
        b_k = tl.reshape(b_k3, (BLOCK_T, 512))
        b_kr = b_rope.to(b_k.dtype)
    else:
        b_k = _dequant_quant_tile(b_q8, b_sc, FORMAT, BLOCK_T, DOT_F32, NATIVE_FP8)
        b_kr = tl.zeros((BLOCK_T, 64), dtype=b_k.dtype)
    return b_k, b_kr


@triton.jit
def _dequant_word_byte(
    b_w, b_sc, J: tl.constexpr, BLOCK_T: tl.constexpr, DOT_F32: tl.constexpr, NATIVE_FP8: tl.constexpr
):
    """Byte J of every word [T, 128] as dims 4m + J of the key, scaled: [T, 128] (dim 4m + J is in group m // 32)."""
    b_u8 = ((b_w >> (8 * J)) & 0xFF).to(tl.uint8)
    b_x = _dequant(tl.reshape(b_u8, (BLOCK_T, 4, 32)), b_sc[:, :, None], NATIVE_FP8, DOT_F32)
    return tl.reshape(b_x, (BLOCK_T, 128))


@triton.jit
def _gather_block_split(
    KV8, b_idx, m_tok, PAGE_SIZE: tl.constexpr, PAGE_BYTES: tl.constexpr, ROW: tl.constexpr, G: tl.constexpr,
    GROUP_BYTES: tl.constexpr,
):  # fmt: skip
    """A block-split page layout's tile: data [T, G, GROUP_BYTES] (token t's ROW-byte data row at ``t * ROW`` of its
    page) and one scale byte per group [T, G] (its scale row at ``PAGE_SIZE * ROW + t * G``)."""
    if (PAGE_SIZE & (PAGE_SIZE - 1)) == 0:  # int32 shift and mask (the indices are >= 0 here)
        b_page = (b_idx >> (PAGE_SIZE.bit_length() - 1)).to(tl.int64)
        b_tok = (b_idx & (PAGE_SIZE - 1)).to(tl.int64)
    else:
        b_idx = b_idx.to(tl.int64)
        b_page = b_idx // PAGE_SIZE
        b_tok = b_idx % PAGE_SIZE
    o_g = tl.arange(0, G)
    o_j = tl.arange(0, GROUP_BYTES)
    o_data = b_page * PAGE_BYTES + b_tok * ROW  # [T] bytes
    o_scale = b_page * PAGE_BYTES + PAGE_SIZE * ROW + b_tok * G
    b_q8 = tl.load(
        KV8 + o_data[:, None, None] + o_g[None, :, None] * GROUP_BYTES + o_j[None, None, :],
        mask=m_tok[:, None, None],
        other=0,
    )
    b_sc = tl.load(KV8 + o_scale[:, None] + o_g[None, :], mask=m_tok[:, None], other=0)
    return b_q8, b_sc


@triton.jit
def _gather_quant_tile(
    KV8, KV32, b_idx, m_tok, FORMAT: tl.constexpr, PAGE_SIZE: tl.constexpr, PAGE_BYTES: tl.constexpr,
    WORDS: tl.constexpr,
):  # fmt: skip
    """Issue the loads of one tile of a format with every dim quantized: (data bytes, scales as stored).

    fp8_v32_nope (2): token rows of 528 bytes, bytes [T, 4, 128], or with ``WORDS`` the same 512 bytes as 128
    32-bit words [T, 128] (as fp8_v32's, see :func:`kv_words`), and fp32 scales [T, 4] at byte 512 of the row.
    fp8_v41 (3): block-split, bytes [T, 16, 32] and ue8m0 exponents [T, 16] (uint8).
    fp4_v41 (4): block-split, bytes [T, 32, 8] (two e2m1 values each) and e4m3 scales [T, 32] (uint8).
    Masked-out tokens (``m_tok`` false) are never read (see kernels/kv_format.py for the layouts).
    """
    if FORMAT == 2:
        b_row = b_idx.to(tl.int64)
        o_g = tl.arange(0, 4)
        if WORDS:
            o_w = tl.arange(0, 128)
            b_q8 = tl.load(KV32 + b_row[:, None] * 132 + o_w[None, :], mask=m_tok[:, None], other=0.0)
            b_q8 = b_q8.to(tl.int32, bitcast=True)  # [T, 128]
        else:
            o_j = tl.arange(0, 128)
            b_q8 = tl.load(
                KV8 + b_row[:, None, None] * 528 + o_g[None, :, None] * 128 + o_j[None, None, :],
                mask=m_tok[:, None, None],
                other=0,
            )
        b_sc = tl.load(KV32 + (b_row * 132 + 128)[:, None] + o_g[None, :], mask=m_tok[:, None], other=0.0)
    elif FORMAT == 3:
        b_q8, b_sc = _gather_block_split(KV8, b_idx, m_tok, PAGE_SIZE, PAGE_BYTES, 512, 16, 32)
    else:
        b_q8, b_sc = _gather_block_split(KV8, b_idx, m_tok, PAGE_SIZE, PAGE_BYTES, 256, 32, 8)
    return b_q8, b_sc


@triton.jit
def _dequant_e2m1(b_u8, b_sc, NATIVE_FP8: tl.constexpr, DOT_F32: tl.constexpr):
    """Packed e2m1 pairs [T, G, 8] (value 2i in byte i's low nibble) times their e4m3 scales [T, G]: [T, G, 16].

    A code's magnitude bits (exponent e, mantissa m) are placed straight into an fp16: ``(c & 7) << 9`` plus
    ``14 << 10`` rebiases the exponent (e2m1's bias is 1, fp16's 15) for e >= 1, and the one subnormal, 0.5 (code
    1), is ``0x3800``; the sign is bit 3 -> bit 15. Exact, and so is the product with the e4m3 scale in fp16
    (at most 2 + 4 significant bits, |value| <= 6 * 448).
    """
    # [T, G, 8, 2]: value 2i (low nibble), then 2i + 1, by a broadcast shift, not tl.join: Triton 3.6 halves the
    # dot operand's load width for a join in its chain (kWidth 8 from bytes), which a dot of K = 16 (P.V at
    # BLOCK_T 16) computes wrongly (see MIN_BLOCK_T); without it the tile gets fp8's kWidth 4
    b_c = (b_u8[:, :, :, None].to(tl.int32) >> (tl.arange(0, 2) * 4)[None, None, None, :]) & 0xF
    b_c = tl.reshape(b_c, (b_u8.shape[0], b_u8.shape[1], 16))
    b_bits = tl.where((b_c & 6) == 0, (b_c & 1) * 0x3800, ((b_c & 7) << 9) + 0x3800) | ((b_c & 8) << 12)
    b_x = b_bits.to(tl.uint16).to(tl.float16, bitcast=True)
    if NATIVE_FP8 and not DOT_F32:
        b_s = b_sc.to(tl.float8e4nv, bitcast=True).to(tl.float16)
    else:  # the e4m3 bit assembly of _dequant: the value times 2^-8, exact in fp16
        b = b_sc.to(tl.uint16)
        b_s = (((b & 0x80) << 8) | ((b & 0x7F) << 7)).to(tl.float16, bitcast=True) * 256.0
    if DOT_F32:
        return b_x.to(tl.float32) * b_s.to(tl.float32)[:, :, None]
    return b_x * b_s.to(tl.float16)[:, :, None]


@triton.jit
def _dequant_quant_tile(
    b_q8, b_sc, FORMAT: tl.constexpr, BLOCK_T: tl.constexpr, DOT_F32: tl.constexpr, NATIVE_FP8: tl.constexpr
):
    """A tile of :func:`_gather_quant_tile` as the dots' operand, the whole key [BLOCK_T, 512]."""
    if FORMAT == 2:  # fp32 scales, one per 128 values
        b_k3 = _dequant(b_q8, b_sc[:, :, None], NATIVE_FP8, DOT_F32)
    elif FORMAT == 3:  # ue8m0 scales, one per 32 values: 2^(e - 127) exactly
        b_scale = (b_sc.to(tl.uint32) << 23).to(tl.float32, bitcast=True)
        b_k3 = _dequant(b_q8, b_scale[:, :, None], NATIVE_FP8, DOT_F32)
    else:  # e2m1 pairs, e4m3 scales, one per 16 values
        b_k3 = _dequant_e2m1(b_q8, b_sc, NATIVE_FP8, DOT_F32)
    return tl.reshape(b_k3, (BLOCK_T, 512))


@triton.jit
def _tile_indices(p_idx, t_first, t_end, num_tokens, BLOCK_T: tl.constexpr):
    """Token indices of the tile starting at ``t_first`` and their mask (out of range: index 0, masked)."""
    o_t = t_first + tl.arange(0, BLOCK_T)
    b_idx = tl.load(p_idx + o_t, mask=o_t < t_end, other=-1)
    m_tok = (b_idx >= 0) & (b_idx < num_tokens)
    return tl.where(m_tok, b_idx, 0), m_tok


@triton.jit
def _tile_step(
    p_q,
    m_h,
    c_q8,
    c_sc,
    c_rope,
    m_tok,
    qk_scale,
    b_m,
    b_l,
    b_a0,
    b_a1,
    b_a2,
    b_a3,
    FORMAT: tl.constexpr,
    BLOCK_T: tl.constexpr,
    WORDS: tl.constexpr,
    DOT_F32: tl.constexpr,
    NATIVE_FP8: tl.constexpr,
):
    """One gathered tile into the online softmax of BLOCK_H heads (q at ``p_q``): the updated state."""
    o_d = tl.arange(0, 512)
    if WORDS:
        # q . k = sum over the four interleaved slices (dims 4m + j), so no byte shuffle is needed
        b_k0 = _dequant_word_byte(c_q8, c_sc, 0, BLOCK_T, DOT_F32, NATIVE_FP8)
        b_k1 = _dequant_word_byte(c_q8, c_sc, 1, BLOCK_T, DOT_F32, NATIVE_FP8)
        b_k2 = _dequant_word_byte(c_q8, c_sc, 2, BLOCK_T, DOT_F32, NATIVE_FP8)
        b_k3 = _dequant_word_byte(c_q8, c_sc, 3, BLOCK_T, DOT_F32, NATIVE_FP8)
        dt = b_k0.dtype
        # q read whole (vectorized), then split into its slices: dims 4m + 2a + b -> slice 2a + b
        b_q = tl.load(p_q + o_d[None, :], mask=m_h[:, None], other=0.0).to(dt)
        b_qa, b_qb = tl.split(tl.reshape(b_q, (b_q.shape[0], 128, 2, 2)))  # b = 0, 1
        b_q0, b_q2 = tl.split(b_qa)
        b_q1, b_q3 = tl.split(b_qb)
        if FORMAT == 1:  # fp8_v32's rope part (fp8_v32_nope has none)
            b_qr = tl.load(p_q + 512 + tl.arange(0, 64)[None, :], mask=m_h[:, None], other=0.0).to(dt)
        if BLOCK_T >= 32:
            # five independent dots (short mma chains), each scaled before the sum: a dot added straight
            # to another would be fused back into one chain (Triton's combiner: dot(a, b, 0) + c -> dot(a, b, c))
            b_s0 = tl.dot(b_q0, tl.trans(b_k0)) * qk_scale  # [BLOCK_H, BLOCK_T]
            b_s1 = tl.dot(b_q1, tl.trans(b_k1)) * qk_scale
            b_s2 = tl.dot(b_q2, tl.trans(b_k2)) * qk_scale
            b_s3 = tl.dot(b_q3, tl.trans(b_k3)) * qk_scale
            b_s = (b_s0 + b_s1) + (b_s2 + b_s3)
            if FORMAT == 1:
                b_s = b_s + tl.dot(b_qr, tl.trans(c_rope.to(dt))) * qk_scale
        else:  # one chain: at BLOCK_T 16 the independent dots cost 14 registers, a CTA per SM (168 -> 182)
            b_s = tl.dot(b_q0, tl.trans(b_k0))
            b_s = tl.dot(b_q1, tl.trans(b_k1), b_s)
            b_s = tl.dot(b_q2, tl.trans(b_k2), b_s)
            b_s = tl.dot(b_q3, tl.trans(b_k3), b_s)
            if FORMAT == 1:
                b_s = tl.dot(b_qr, tl.trans(c_rope.to(dt)), b_s)
            b_s = b_s * qk_scale
    elif FORMAT == 0 or FORMAT >= 3:  # fp8_model1, fp8_v41, fp4_v41
        # four dots of 128 contiguous dims each, so that no dot's q operand is the whole [BLOCK_H, 512]
        # (chunk j = dims 128j..128j+127; the reshape's dims are (a, b) with j = 2a + b)
        b_k, b_kr = _dequant_kv_tile(c_q8, c_sc, c_rope, FORMAT, BLOCK_T, DOT_F32, NATIVE_FP8)
        dt = b_k.dtype
        b_x0, b_x1 = tl.split(tl.permute(tl.reshape(b_k, (BLOCK_T, 2, 2, 128)), (0, 3, 1, 2)))  # [T, 128, a]
        b_k0, b_k2 = tl.split(b_x0)  # dims 0..127 and 256..383
        b_k1, b_k3 = tl.split(b_x1)
        o_c = tl.arange(0, 128)
        b_q0 = tl.load(p_q + o_c[None, :], mask=m_h[:, None], other=0.0).to(dt)
        b_q1 = tl.load(p_q + 128 + o_c[None, :], mask=m_h[:, None], other=0.0).to(dt)
        b_q2 = tl.load(p_q + 256 + o_c[None, :], mask=m_h[:, None], other=0.0).to(dt)
        b_q3 = tl.load(p_q + 384 + o_c[None, :], mask=m_h[:, None], other=0.0).to(dt)
        if BLOCK_T >= 32:
            # four independent dots (mma chains of 128 dims, not one of 512), scaled before the tree sum (see WORDS)
            b_s0 = tl.dot(b_q0, tl.trans(b_k0)) * qk_scale
            b_s1 = tl.dot(b_q1, tl.trans(b_k1)) * qk_scale
            b_s2 = tl.dot(b_q2, tl.trans(b_k2)) * qk_scale
            b_s3 = tl.dot(b_q3, tl.trans(b_k3)) * qk_scale
            b_s = (b_s0 + b_s1) + (b_s2 + b_s3)  # [BLOCK_H, BLOCK_T]
        else:  # one chain (see WORDS)
            b_s = tl.dot(b_q0, tl.trans(b_k0))
            b_s = tl.dot(b_q1, tl.trans(b_k1), b_s)
            b_s = tl.dot(b_q2, tl.trans(b_k2), b_s)
            b_s = tl.dot(b_q3, tl.trans(b_k3), b_s) * qk_scale
    else:
        b_k, b_kr = _dequant_kv_tile(c_q8, c_sc, c_rope, FORMAT, BLOCK_T, DOT_F32, NATIVE_FP8)
        dt = b_k.dtype
        # q is re-read every tile (an L1 hit) on purpose: kept live across the loop as an mma operand
        # it costs every warp 16 x 576 x 2 / 32 = 576 B of registers and halves occupancy.
        b_q = tl.load(p_q + o_d[None, :], mask=m_h[:, None], other=0.0).to(dt)  # [BLOCK_H, 512]
        b_s = tl.dot(b_q, tl.trans(b_k))  # [BLOCK_H, BLOCK_T]
        if FORMAT == 1:
            b_qr = tl.load(p_q + 512 + tl.arange(0, 64)[None, :], mask=m_h[:, None], other=0.0).to(dt)
            b_s = tl.dot(b_qr, tl.trans(b_kr), b_s)
        b_s = b_s * qk_scale
    b_s = tl.where(m_tok[None, :], b_s, float("-inf"))
    b_m_new = tl.maximum(b_m, tl.max(b_s, axis=1))
    b_m_use = tl.where(b_m_new == float("-inf"), 0.0, b_m_new)  # no (-inf) - (-inf)
    b_alpha = tl.exp2(b_m - b_m_use)
    b_p = tl.exp2(b_s - b_m_use[:, None])
    b_l = b_l * b_alpha + tl.sum(b_p, axis=1)
    b_pk = b_p.to(dt)
    if WORDS or FORMAT == 0 or FORMAT >= 3:
        b_a0 = b_a0 * b_alpha[:, None] + tl.dot(b_pk, b_k0)  # [BLOCK_H, 128]: output dims 4m + 0 (chunks: 0..127)
        b_a1 = b_a1 * b_alpha[:, None] + tl.dot(b_pk, b_k1)
        b_a2 = b_a2 * b_alpha[:, None] + tl.dot(b_pk, b_k2)
        b_a3 = b_a3 * b_alpha[:, None] + tl.dot(b_pk, b_k3)
    else:
        b_a0 = b_a0 * b_alpha[:, None] + tl.dot(b_pk, b_k)  # [BLOCK_H, 512]
    return b_m_new, b_l, b_a0, b_a1, b_a2, b_a3


@triton.jit
def _vtile(
    i_t,
    u_split,
    KV8,
    KV16,
    KV32,
    p_idx,
    t_begin,
    t_end,
    num_tokens,
    XKV8,
    XKV16,
    XKV32,
    XIdx,
    x_off,
    x_lim,
    x_num_tokens,
    BLOCK_T: tl.constexpr,
    TWO: tl.constexpr,
):
    """Tile ``i_t`` of a walk: its token indices, their mask, whether it is the extra cache's, and the cache
    they point into (KV8, KV16, KV32).

    Tile ``i_t`` starts at position ``t_begin + i_t * BLOCK_T``. One cache: that is its place in the list at
    ``p_idx``, valid below ``t_end``. ``TWO`` (two caches of one format and page size in one loop): positions
    from ``u_split`` on are the extra cache's, whose list entry for position u is ``XIdx[x_off + u]``, valid
    below ``x_lim``; scalar selects pick the list, its bound, its size and the cache's base pointers, and the
    gather its page layout (the extra
    cache's offset and bound are two integers, so that little stays live across the loop)."""
    t_first = t_begin + i_t * BLOCK_T
    in_x = t_first >= u_split  # the extra cache's tile (``TWO``); unused otherwise
    if TWO:
        p = tl.where(in_x, XIdx + x_off, p_idx)
        b_idx, m_tok = _tile_indices(
            p, t_first, tl.where(in_x, x_lim, t_end), tl.where(in_x, x_num_tokens, num_tokens), BLOCK_T
        )
        return (
            b_idx, m_tok, in_x, tl.where(in_x, XKV8, KV8), tl.where(in_x, XKV16, KV16), tl.where(in_x, XKV32, KV32)
        )  # fmt: skip
    else:
        b_idx, m_tok = _tile_indices(p_idx, t_first, t_end, num_tokens, BLOCK_T)
        return b_idx, m_tok, in_x, KV8, KV16, KV32


@triton.jit
def _walk(
    p_q,
    m_h,
    qk_scale,
    b_m,
    b_l,
    b_a0,
    b_a1,
    b_a2,
    b_a3,
    KV8,
    KV16,
    KV32,
    p_idx,
    t_begin,
    t_end,
    num_tokens,
    XKV8,
    XKV16,
    XKV32,
    XIdx,
    x_start,
    x_begin,
    x_end,
    x_num_tokens,
    FORMAT: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    PAGE_BYTES: tl.constexpr,
    X_PAGE_SIZE: tl.constexpr,
    X_PAGE_BYTES: tl.constexpr,
    BLOCK_T: tl.constexpr,
    PREFETCH: tl.constexpr,
    WORDS: tl.constexpr,
    DOT_F32: tl.constexpr,
    NATIVE_FP8: tl.constexpr,
    TWO: tl.constexpr,
):
    """The tile loop over tokens [t_begin, t_end) of one cache's top-k list (at ``p_idx``), then with ``TWO``
    over [x_begin, x_end) of the extra cache's list (at ``XIdx + x_start``; same format, its own page size
    ``X_PAGE_SIZE`` and stride ``X_PAGE_BYTES``; see :func:`_vtile`), into the online softmax state (b_m, b_l,
    b_a0..b_a3): the updated state."""
    # tiles wholly past t_end (topk_length) are skipped, not masked
    n_tiles = tl.maximum(t_end - t_begin + BLOCK_T - 1, 0) // BLOCK_T
    u_split = t_begin + n_tiles * BLOCK_T  # the extra cache's tiles follow at these positions
    x_off = x_start
    x_lim = x_end
    if TWO:
        n_tiles += tl.maximum(x_end - x_begin + BLOCK_T - 1, 0) // BLOCK_T
        x_off = (x_start + x_begin - u_split).to(tl.int32)  # position u is entry x_begin + (u - u_split)
        x_lim = x_end - x_begin + u_split
    if PREFETCH == 1 or PREFETCH == 3:
        # Tile prefetch: tile i+1's indices and KV bytes are loaded before tile i's math, so the KV latency
        # overlaps the dots, but the gather first waits for the indices just loaded. 3 also loads tile
        # i+2's indices, so no gather waits for its addresses, for the index registers of a third tile
        # (fp8_model1 spills more). A tile past the end is fully masked.
        b_idx, m_next, i_x, k8, k16, k32 = _vtile(
            0, u_split, KV8, KV16, KV32, p_idx, t_begin, t_end, num_tokens,
            XKV8, XKV16, XKV32, XIdx, x_off, x_lim, x_num_tokens, BLOCK_T, TWO,
        )  # fmt: skip
        r_q8, r_sc, r_rope = _gather_kv_tile(
            k8, k16, k32, b_idx, m_next, i_x, FORMAT, PAGE_SIZE, PAGE_BYTES, X_PAGE_SIZE, X_PAGE_BYTES, WORDS
        )
        if PREFETCH == 3:
            n_idx, m_after, n_x, n8, n16, n32 = _vtile(
                1, u_split, KV8, KV16, KV32, p_idx, t_begin, t_end, num_tokens,
                XKV8, XKV16, XKV32, XIdx, x_off, x_lim, x_num_tokens, BLOCK_T, TWO,
            )  # fmt: skip
    elif PREFETCH == 2:
        # Index prefetch only: one register per token instead of the whole tile; the KV gather's
        # address is ready at the top of the iteration, so one of the two latencies is hidden.
        n_idx, m_next, n_x, n8, n16, n32 = _vtile(
            0, u_split, KV8, KV16, KV32, p_idx, t_begin, t_end, num_tokens,
            XKV8, XKV16, XKV32, XIdx, x_off, x_lim, x_num_tokens, BLOCK_T, TWO,
        )  # fmt: skip
    for i_t in range(0, n_tiles):
        if PREFETCH == 2:
            b_idx, m_tok = n_idx, m_next
            c_q8, c_sc, c_rope = _gather_kv_tile(
                n8, n16, n32, b_idx, m_tok, n_x, FORMAT, PAGE_SIZE, PAGE_BYTES, X_PAGE_SIZE, X_PAGE_BYTES, WORDS
            )
            n_idx, m_next, n_x, n8, n16, n32 = _vtile(
                i_t + 1, u_split, KV8, KV16, KV32, p_idx, t_begin, t_end, num_tokens,
                XKV8, XKV16, XKV32, XIdx, x_off, x_lim, x_num_tokens, BLOCK_T, TWO,
            )  # fmt: skip
        elif PREFETCH == 1:
            m_tok = m_next
            c_q8, c_sc, c_rope = r_q8, r_sc, r_rope
            b_idx, m_next, i_x, k8, k16, k32 = _vtile(
                i_t + 1, u_split, KV8, KV16, KV32, p_idx, t_begin, t_end, num_tokens,
                XKV8, XKV16, XKV32, XIdx, x_off, x_lim, x_num_tokens, BLOCK_T, TWO,
            )  # fmt: skip
            r_q8, r_sc, r_rope = _gather_kv_tile(
                k8, k16, k32, b_idx, m_next, i_x, FORMAT, PAGE_SIZE, PAGE_BYTES, X_PAGE_SIZE, X_PAGE_BYTES, WORDS
            )
        elif PREFETCH == 3:
            m_tok, m_next = m_next, m_after
            c_q8, c_sc, c_rope = r_q8, r_sc, r_rope
            r_q8, r_sc, r_rope = _gather_kv_tile(
                n8, n16, n32, n_idx, m_next, n_x, FORMAT, PAGE_SIZE, PAGE_BYTES, X_PAGE_SIZE, X_PAGE_BYTES, WORDS
            )
            n_idx, m_after, n_x, n8, n16, n32 = _vtile(
                i_t + 2, u_split, KV8, KV16, KV32, p_idx, t_begin, t_end, num_tokens,
                XKV8, XKV16, XKV32, XIdx, x_off, x_lim, x_num_tokens, BLOCK_T, TWO,
            )  # fmt: skip
        else:
            b_idx, m_tok, i_x, k8, k16, k32 = _vtile(
                i_t, u_split, KV8, KV16, KV32, p_idx, t_begin, t_end, num_tokens,
                XKV8, XKV16, XKV32, XIdx, x_off, x_lim, x_num_tokens, BLOCK_T, TWO,
            )  # fmt: skip
            c_q8, c_sc, c_rope = _gather_kv_tile(
                k8, k16, k32, b_idx, m_tok, i_x, FORMAT, PAGE_SIZE, PAGE_BYTES, X_PAGE_SIZE, X_PAGE_BYTES, WORDS
            )
        b_m, b_l, b_a0, b_a1, b_a2, b_a3 = _tile_step(
            p_q, m_h, c_q8, c_sc, c_rope, m_tok, qk_scale, b_m, b_l, b_a0, b_a1, b_a2, b_a3,
            FORMAT, BLOCK_T, WORDS, DOT_F32, NATIVE_FP8,
        )  # fmt: skip
    return b_m, b_l, b_a0, b_a1, b_a2, b_a3


# fmt: off
@triton.jit
def _attend(
    Out, Lse, OPart, LPart, Q, KV8, KV16, KV32, Idx, TopkLen, Sink, XKV8, XKV16, XKV32, XIdx, XTopkLen,
    stride_qb, stride_qs, stride_qh, sm_scale, topk, num_tokens, x_topk, x_num_tokens, total_splits, q_tokens, i_r,
    i_hb, i_slot, t_begin, t_stop,
    H: tl.constexpr, FORMAT: tl.constexpr, PAGE_SIZE: tl.constexpr, PAGE_BYTES: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_T: tl.constexpr, PREFETCH: tl.constexpr, WORDS: tl.constexpr, HAS_TOPK_LEN: tl.constexpr,
    HAS_SINK: tl.constexpr, WRITE_FINAL: tl.constexpr, DOT_F32: tl.constexpr, NATIVE_FP8: tl.constexpr,
    HAS_EXTRA: tl.constexpr, X_FORMAT: tl.constexpr, X_PAGE_SIZE: tl.constexpr, X_PAGE_BYTES: tl.constexpr,
    X_HAS_TOPK_LEN: tl.constexpr,
):
    # fmt: on
    """BLOCK_H heads of query row ``i_r`` over tokens [t_begin, t_stop) of its row, then the final output
    (WRITE_FINAL) or the partial output and lse in slot ``i_slot`` of the row.

    A row is the main cache's top-k list, padded to whole tiles (``cdiv(topk, BLOCK_T) * BLOCK_T`` tokens),
    then (``HAS_EXTRA``) the extra cache's: one online softmax runs over both, each walked with its own
    format, page size, indices and topk_length; a tile never holds tokens of both."""
    i_b = i_r // q_tokens
    i_q = i_r % q_tokens
    n_valid = topk
    if HAS_TOPK_LEN:
        n_valid = tl.minimum(tl.maximum(tl.load(TopkLen + i_b), 0), topk)
    t_end = tl.minimum(t_stop, n_valid)

    o_h = i_hb * BLOCK_H + tl.arange(0, BLOCK_H)
    m_h = o_h < H
    p_q = Q + i_b * stride_qb + i_q * stride_qs + o_h[:, None] * stride_qh
    qk_scale = sm_scale * 1.4426950408889634  # softmax in base 2
    # the empty softmax: the output accumulates in a0 [BLOCK_H, 512], or with WORDS as four interleaved
    # slices a_j [BLOCK_H, 128] (output dims 4m + j), or for fp8_model1 and the V4.1 formats as four chunks
    # a_j [BLOCK_H, 128] (output dims 128j..128j+127); unused ones are [1, 1]
    b_m = tl.full((BLOCK_H,), float("-inf"), dtype=tl.float32)
    b_l = tl.zeros((BLOCK_H,), dtype=tl.float32)
    if WORDS or FORMAT == 0 or FORMAT >= 3:
        b_a0 = tl.zeros((BLOCK_H, 128), dtype=tl.float32)
        b_a1 = tl.zeros((BLOCK_H, 128), dtype=tl.float32)
        b_a2 = tl.zeros((BLOCK_H, 128), dtype=tl.float32)
        b_a3 = tl.zeros((BLOCK_H, 128), dtype=tl.float32)
    else:
        b_a0 = tl.zeros((BLOCK_H, 512), dtype=tl.float32)
        b_a1 = tl.zeros((1, 1), dtype=tl.float32)
        b_a2 = tl.zeros((1, 1), dtype=tl.float32)
        b_a3 = tl.zeros((1, 1), dtype=tl.float32)
    p_idx = Idx + i_r * topk
    if HAS_EXTRA:
        # the extra cache's tokens start at the main cache's whole tiles: its part of [t_begin, t_stop)
        span = tl.cdiv(topk, BLOCK_T) * BLOCK_T
        x_valid = x_topk
        if X_HAS_TOPK_LEN:
            x_valid = tl.minimum(tl.maximum(tl.load(XTopkLen + i_b), 0), x_topk)
        x_begin = tl.maximum(t_begin - span, 0)
        x_end = tl.minimum(t_stop - span, x_valid)
        # one loop over both: one format and, for fp8_model1, one page layout or page strides of whole 16-byte
        # units (see _gather_kv_tile), for fp8_v41 one page layout; fp8_v32's and fp8_v32_nope's rows are
        # addressed by token, not by page
        if X_FORMAT == FORMAT and (
            FORMAT == 1
            or FORMAT == 2
            or (X_PAGE_SIZE == PAGE_SIZE and X_PAGE_BYTES == PAGE_BYTES)
            or (FORMAT == 0 and PAGE_BYTES % 16 == 0 and X_PAGE_BYTES % 16 == 0)
        ):
            b_m, b_l, b_a0, b_a1, b_a2, b_a3 = _walk(
                p_q, m_h, qk_scale, b_m, b_l, b_a0, b_a1, b_a2, b_a3, KV8, KV16, KV32, p_idx, t_begin, t_end,
                num_tokens, XKV8, XKV16, XKV32, XIdx, i_r * x_topk, x_begin, x_end, x_num_tokens,
                FORMAT, PAGE_SIZE, PAGE_BYTES, X_PAGE_SIZE, X_PAGE_BYTES, BLOCK_T, PREFETCH, WORDS, DOT_F32,
                NATIVE_FP8, True,
            )  # fmt: skip
        else:  # one loop per cache, each with its own format and page size
            b_m, b_l, b_a0, b_a1, b_a2, b_a3 = _walk(
                p_q, m_h, qk_scale, b_m, b_l, b_a0, b_a1, b_a2, b_a3, KV8, KV16, KV32, p_idx, t_begin, t_end,
                num_tokens, KV8, KV16, KV32, Idx, 0, 0, 0, 0,
                FORMAT, PAGE_SIZE, PAGE_BYTES, PAGE_SIZE, PAGE_BYTES, BLOCK_T, PREFETCH, WORDS, DOT_F32,
                NATIVE_FP8, False,
            )  # fmt: skip
            b_m, b_l, b_a0, b_a1, b_a2, b_a3 = _walk(
                p_q, m_h, qk_scale, b_m, b_l, b_a0, b_a1, b_a2, b_a3, XKV8, XKV16, XKV32, XIdx + i_r * x_topk,
                x_begin, x_end, x_num_tokens, XKV8, XKV16, XKV32, XIdx, 0, 0, 0, 0,
                X_FORMAT, X_PAGE_SIZE, X_PAGE_BYTES, X_PAGE_SIZE, X_PAGE_BYTES, BLOCK_T, PREFETCH, WORDS, DOT_F32,
                NATIVE_FP8, False,
            )  # fmt: skip
    else:
        b_m, b_l, b_a0, b_a1, b_a2, b_a3 = _walk(
            p_q, m_h, qk_scale, b_m, b_l, b_a0, b_a1, b_a2, b_a3, KV8, KV16, KV32, p_idx, t_begin, t_end,
            num_tokens, KV8, KV16, KV32, Idx, 0, 0, 0, 0,
            FORMAT, PAGE_SIZE, PAGE_BYTES, PAGE_SIZE, PAGE_BYTES, BLOCK_T, PREFETCH, WORDS, DOT_F32, NATIVE_FP8,
            False,
        )  # fmt: skip

    if WORDS:  # dims 4m + 2a + b <- slice 2a + b: one interleave per program, outside the tile loop
        b_acc = tl.reshape(tl.join(tl.join(b_a0, b_a2), tl.join(b_a1, b_a3)), (BLOCK_H, 512))
    elif FORMAT == 0 or FORMAT >= 3:  # the four chunks side by side: [a0 | a1 | a2 | a3]
        b_a01 = tl.reshape(tl.permute(tl.join(b_a0, b_a1), (0, 2, 1)), (BLOCK_H, 256))
        b_a23 = tl.reshape(tl.permute(tl.join(b_a2, b_a3), (0, 2, 1)), (BLOCK_H, 256))
        b_acc = tl.reshape(tl.permute(tl.join(b_a01, b_a23), (0, 2, 1)), (BLOCK_H, 512))
    else:
        b_acc = b_a0
    m_empty = b_l == 0.0  # no valid token: o = 0
    b_o = b_acc / tl.where(m_empty, 1.0, b_l)[:, None]
    b_lse = (b_m + tl.log2(tl.where(m_empty, 1.0, b_l))) * 0.6931471805599453  # natural log
    o_d = tl.arange(0, 512)
    if WRITE_FINAL:
        if HAS_SINK:
            # exp(lse) / (exp(lse) + exp(sink)); an empty row stays zero whatever the sink
            b_sink = tl.load(Sink + o_h, mask=m_h, other=0.0)
            b_w = 1.0 / (1.0 + tl.exp(b_sink - tl.where(m_empty, 0.0, b_lse)))
            b_o = b_o * tl.where(m_empty, 0.0, b_w)[:, None]
        p_o = Out + (i_r * H + o_h)[:, None] * 512 + o_d[None, :]  # Out [B, s_q, H, 512]
        tl.store(p_o, b_o.to(tl.bfloat16), mask=m_h[:, None])
        p_lse = Lse + (i_b * H + o_h) * q_tokens + i_q  # Lse [B, H, s_q]
        tl.store(p_lse, tl.where(m_empty, float("inf"), b_lse), mask=m_h)
    else:
        # bf16 partial and fp32 lse (-inf for a split that saw no valid token); OPart [B * s_q, total_splits, H, 512]
        o_row = (i_r * total_splits + i_slot) * H + o_h
        tl.store(OPart + o_row[:, None] * 512 + o_d[None, :], b_o.to(OPart.dtype.element_ty), mask=m_h[:, None])
        tl.store(LPart + o_row, tl.where(m_empty, float("-inf"), b_lse), mask=m_h)


@triton.jit
def _row_slots(i_r, row_tiles, n_progs, n_units):
    """The balanced deal's programs that touch row ``i_r``: the owner of its last tile minus the owner of its
    first, plus one (unit u belongs to program ``((u + 1) * programs - 1) // units``)."""
    first = ((i_r * row_tiles + 1) * n_progs - 1) // n_units
    last = ((i_r + 1) * row_tiles * n_progs - 1) // n_units
    return (last - first + 1).to(tl.int32)


@triton.jit
def _merge_row(
    Out,
    Lse,
    OPart,
    LPart,
    Sink,
    Count,
    i_r,
    i_hb,
    n_slots,
    total_splits,
    q_tokens,
    H: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HAS_SINK: tl.constexpr,
    UNROLL: tl.constexpr,
):
    """The merge in the split launch (``MERGE``): called by each of row ``i_r``'s ``n_slots`` programs (head
    block ``i_hb``) once its partial is stored. Each takes a ticket from the row's counter (acquire/release, so
    that the last one sees every partial); the one that gets the last ticket sets the counter back to 0 for the
    next call (no host round trip, graph-safe) and merges slots 0..n_slots-1 in that order, whichever program it
    is, so the same inputs give the same bits: out = sum_s exp(lse_s - lse) * o_s, lse = logsumexp_s(lse_s), then
    the sink, as the combine kernel does. Under the interpreter the programs run one by one and the last one
    merges. The partials are read through L2 (``.cg``): they were written by other SMs."""
    head_blocks: tl.constexpr = (H + BLOCK_H - 1) // BLOCK_H
    p_cnt = Count + i_r * head_blocks + i_hb
    tl.debug_barrier()  # every thread's partial stores are issued before the release
    ticket = tl.atomic_add(p_cnt, 1, sem="acq_rel", scope="gpu")
    if ticket == n_slots - 1:
        tl.store(p_cnt, 0)
        o_h = i_hb * BLOCK_H + tl.arange(0, BLOCK_H)
        m_h = o_h < H
        o_base = i_r * total_splits
        # lse over the slots, 16 at a time (one iteration up to 16 splits)
        o_c = tl.arange(0, 16)
        b_max = tl.full((BLOCK_H,), float("-inf"), dtype=tl.float32)
        b_sum = tl.zeros((BLOCK_H,), dtype=tl.float32)
        for i_s in range(0, n_slots, 16):
            m_c = (i_s + o_c) < n_slots
            p_l = LPart + ((o_base + i_s + o_c) * H)[:, None] + o_h[None, :]
            b_ls = tl.load(p_l, mask=m_c[:, None] & m_h[None, :], other=float("-inf"), cache_modifier=".cg")
            b_new = tl.maximum(b_max, tl.max(b_ls, axis=0))  # [BLOCK_H]
            b_use = tl.where(b_new == float("-inf"), 0.0, b_new)
            b_sum = b_sum * tl.exp(b_max - b_use) + tl.sum(tl.exp(b_ls - b_use[None, :]), axis=0)
            b_max = b_new
        m_empty = b_max == float("-inf")
        b_lse = tl.where(m_empty, 0.0, b_max) + tl.log(tl.where(m_empty, 1.0, b_sum))
        o_d = tl.arange(0, 512)
        b_out = tl.zeros((BLOCK_H, 512), dtype=tl.float32)
        for i_s in range(0, n_slots, UNROLL):
            for i_u in tl.static_range(UNROLL):  # loads independent of each other and of the weights
                m_s = m_h & (i_s + i_u < n_slots)
                o_row = (o_base + i_s + i_u) * H + o_h
                b_w = tl.exp(tl.load(LPart + o_row, mask=m_s, other=float("-inf"), cache_modifier=".cg") - b_lse)
                p_o = OPart + o_row[:, None] * 512 + o_d[None, :]
                b_o = tl.load(p_o, mask=m_s[:, None], other=0.0, cache_modifier=".cg").to(tl.float32)
                b_out += tl.where(b_w[:, None] > 0.0, b_w[:, None] * b_o, 0.0)
        if HAS_SINK:
            b_sink = tl.load(Sink + o_h, mask=m_h, other=0.0)
            b_out = b_out * tl.where(m_empty, 0.0, 1.0 / (1.0 + tl.exp(b_sink - b_lse)))[:, None]
        tl.store(Out + (i_r * H + o_h)[:, None] * 512 + o_d[None, :], b_out.to(tl.bfloat16), mask=m_h[:, None])
        p_lse = Lse + ((i_r // q_tokens) * H + o_h) * q_tokens + i_r % q_tokens  # Lse [B, H, s_q]
        tl.store(p_lse, tl.where(m_empty, float("inf"), b_lse), mask=m_h)


# Integer arguments are not value-specialized (==1, %16): one compile per config and format serves
# every batch size and query-token count, which keeps the tuner's compile time to two variants
# (WRITE_FINAL) per config and format.
@triton.jit(
    do_not_specialize=[
        "topk",
        "num_tokens",
        "x_topk",
        "x_num_tokens",
        "tiles_per_split",
        "total_splits",
        "q_tokens",
        "rows",
        "slots",
    ]
)
def _split_kernel(
    Out,
    Lse,
    OPart,
    LPart,
    Q,
    KV8,
    KV16,
    KV32,
    Idx,
    TopkLen,
    Sink,
    XKV8,
    XKV16,
    XKV32,
    XIdx,
    XTopkLen,
    Count,
    stride_qb,
    stride_qs,
    stride_qh,
    sm_scale,
    topk,
    num_tokens,
    x_topk,
    x_num_tokens,
    tiles_per_split,
    total_splits,
    q_tokens,
    rows,
    slots,
    H: tl.constexpr,
    FORMAT: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    PAGE_BYTES: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_T: tl.constexpr,
    PREFETCH: tl.constexpr,
    BALANCED: tl.constexpr,
    MERGE: tl.constexpr,
    MERGE_UNROLL: tl.constexpr,
    WORDS: tl.constexpr,
    HAS_TOPK_LEN: tl.constexpr,
    HAS_SINK: tl.constexpr,
    WRITE_FINAL: tl.constexpr,
    DOT_F32: tl.constexpr,
    NATIVE_FP8: tl.constexpr,
    USE_PDL: tl.constexpr,
    LATE_TRIGGER: tl.constexpr,
    HAS_EXTRA: tl.constexpr,
    X_FORMAT: tl.constexpr,
    X_PAGE_SIZE: tl.constexpr,
    X_PAGE_BYTES: tl.constexpr,
    X_HAS_TOPK_LEN: tl.constexpr,
):
    if USE_PDL:  # programmatic dependent launch: wait for the kernel before, then let the next one start
        gdc_wait()
        if not LATE_TRIGGER:
            gdc_launch_dependents()
    if BALANCED:
        # grid (programs, head_blocks): the batch's rows * row_tiles tiles, row after row, are cut into
        # equal contiguous runs (floor or ceil of units / programs), one per program, so every program
        # does the same work whatever the batch size. Programs outnumber rows, so a run is at most
        # row_tiles long and touches at most two rows: the end of row i_r, then the start of the next.
        # A straight-line second segment, not a loop over segments: the loop nest spilled on sm_120.
        i_c = tl.program_id(0)
        i_hb = tl.program_id(1)
        n_progs = tl.num_programs(0)
        row_tiles = tl.cdiv(topk, BLOCK_T)
        if HAS_EXTRA:  # the extra cache's tiles follow the main cache's in the row
            row_tiles += tl.cdiv(x_topk, BLOCK_T)
        n_units = rows * row_tiles
        u = (i_c.to(tl.int64) * n_units // n_progs).to(tl.int32)
        u_end = ((i_c + 1).to(tl.int64) * n_units // n_progs).to(tl.int32)
        i_r = u // row_tiles
        row_end = (i_r + 1) * row_tiles
        seg_end = tl.minimum(u_end, row_end)
        # slot = this program's place among the row's: the row's first tile belongs to program
        # ((first tile + 1) * programs - 1) // units (the inverse of the deal)
        i_slot = i_c - (((i_r * row_tiles + 1).to(tl.int64) * n_progs - 1) // n_units).to(tl.int32)
        _attend(
            Out, Lse, OPart, LPart, Q, KV8, KV16, KV32, Idx, TopkLen, Sink, XKV8, XKV16, XKV32, XIdx, XTopkLen,
            stride_qb, stride_qs, stride_qh, sm_scale, topk, num_tokens, x_topk, x_num_tokens, total_splits, q_tokens,
            i_r.to(tl.int64), i_hb, i_slot,
            (u - i_r * row_tiles) * BLOCK_T, (seg_end - i_r * row_tiles) * BLOCK_T,
            H, FORMAT, PAGE_SIZE, PAGE_BYTES, BLOCK_H, BLOCK_T, PREFETCH, WORDS, HAS_TOPK_LEN, False, False, DOT_F32,
            NATIVE_FP8, HAS_EXTRA, X_FORMAT, X_PAGE_SIZE, X_PAGE_BYTES, X_HAS_TOPK_LEN,
        )  # fmt: skip
        if MERGE:  # the row's last program to finish merges its slots
            _merge_row(
                Out, Lse, OPart, LPart, Sink, Count, i_r.to(tl.int64), i_hb,
                _row_slots(i_r.to(tl.int64), row_tiles, n_progs, n_units), total_splits, q_tokens, H, BLOCK_H, HAS_SINK,
                MERGE_UNROLL,
            )  # fmt: skip
        elif seg_end == row_end:  # the row's last program marks the slots no program of this row uses
            o_h = i_hb * BLOCK_H + tl.arange(0, BLOCK_H)
            for i_k in range(i_slot + 1, slots):
                o_row = (i_r.to(tl.int64) * total_splits + i_k) * H + o_h
                tl.store(LPart + o_row, tl.full((BLOCK_H,), float("-inf"), tl.float32), mask=o_h < H)
        if u_end > row_end:  # the next row's first tiles: this program is that row's slot 0
            _attend(
                Out, Lse, OPart, LPart, Q, KV8, KV16, KV32, Idx, TopkLen, Sink, XKV8, XKV16, XKV32, XIdx, XTopkLen,
                stride_qb, stride_qs, stride_qh, sm_scale, topk, num_tokens, x_topk, x_num_tokens, total_splits,
                q_tokens, i_r.to(tl.int64) + 1, i_hb, 0,
                0, (u_end - row_end) * BLOCK_T,
                H, FORMAT, PAGE_SIZE, PAGE_BYTES, BLOCK_H, BLOCK_T, PREFETCH, WORDS, HAS_TOPK_LEN, False, False,
                DOT_F32, NATIVE_FP8, HAS_EXTRA, X_FORMAT, X_PAGE_SIZE, X_PAGE_BYTES, X_HAS_TOPK_LEN,
            )  # fmt: skip
            if MERGE:
                _merge_row(
                    Out, Lse, OPart, LPart, Sink, Count, i_r.to(tl.int64) + 1, i_hb,
                    _row_slots(i_r.to(tl.int64) + 1, row_tiles, n_progs, n_units), total_splits, q_tokens, H, BLOCK_H,
                    HAS_SINK, MERGE_UNROLL,
                )  # fmt: skip
    else:  # grid (rows * head_blocks, splits): split i_s of one row takes tiles_per_split tiles
        i_bh = tl.program_id(0).to(tl.int64)
        i_s = tl.program_id(1).to(tl.int64)
        head_blocks: tl.constexpr = (H + BLOCK_H - 1) // BLOCK_H
        t0 = i_s * tiles_per_split * BLOCK_T
        _attend(
            Out, Lse, OPart, LPart, Q, KV8, KV16, KV32, Idx, TopkLen, Sink, XKV8, XKV16, XKV32, XIdx, XTopkLen,
            stride_qb, stride_qs, stride_qh, sm_scale, topk, num_tokens, x_topk, x_num_tokens, total_splits, q_tokens,
            i_bh // head_blocks, i_bh % head_blocks,
            i_s, t0, t0 + tiles_per_split * BLOCK_T,
            H, FORMAT, PAGE_SIZE, PAGE_BYTES, BLOCK_H, BLOCK_T, PREFETCH, WORDS, HAS_TOPK_LEN, HAS_SINK, WRITE_FINAL,
            DOT_F32, NATIVE_FP8, HAS_EXTRA, X_FORMAT, X_PAGE_SIZE, X_PAGE_BYTES, X_HAS_TOPK_LEN,
        )  # fmt: skip
        if MERGE:  # every split of the row is a slot (WRITE_FINAL is false)
            _merge_row(
                Out, Lse, OPart, LPart, Sink, Count, i_bh // head_blocks, i_bh % head_blocks, total_splits,
                total_splits, q_tokens, H, BLOCK_H, HAS_SINK, MERGE_UNROLL,
            )  # fmt: skip
    if USE_PDL and LATE_TRIGGER:  # the next launch (the combine) starts as this program's stores are issued
        gdc_launch_dependents()


@triton.jit(do_not_specialize=["num_splits", "q_tokens"])
def _combine_kernel(
    Out,
    Lse,
    OPart,
    LPart,
    Sink,
    num_splits,
    q_tokens,
    H: tl.constexpr,
    BLOCK_S: tl.constexpr,
    CHUNK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_SINK: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """out = sum_s exp(lse_s - lse) * o_s, lse = logsumexp_s(lse_s), then the sink; empty rows: out 0, lse +inf.

    Program (row x head, column block) merges BLOCK_D of the 512 columns, CHUNK_S splits per iteration
    (see combine_shape).
    """
    if USE_PDL:  # launched while the split kernel still runs: wait for its partials
        gdc_wait()
        gdc_launch_dependents()
    i_rh = tl.program_id(0).to(tl.int64)
    i_d = tl.program_id(1) if BLOCK_D < 512 else 0
    i_r = i_rh // H
    i_h = i_rh % H
    o_s = tl.arange(0, BLOCK_S)
    p_l = LPart + (i_r * num_splits + o_s) * H + i_h
    b_ls = tl.load(p_l, mask=o_s < num_splits, other=float("-inf"))  # [BLOCK_S]
    b_max = tl.max(b_ls, axis=0)
    m_empty = b_max == float("-inf")
    b_max_use = tl.where(m_empty, 0.0, b_max)
    b_sum = tl.sum(tl.exp(b_ls - b_max_use), axis=0)
    b_lse = b_max_use + tl.log(tl.where(m_empty, 1.0, b_sum))
    o_d = i_d * BLOCK_D + tl.arange(0, BLOCK_D)
    if BLOCK_D == 512:  # CHUNK_S rows per iteration, their loads independent of each other and of the weights
        b_out = tl.zeros((512,), dtype=tl.float32)
        for i_s in range(0, num_splits, CHUNK_S):
            for i_u in tl.static_range(CHUNK_S):
                m_s = (i_s + i_u < num_splits) | (CHUNK_S == 1)  # no mask for one split per iteration
                o_row = (i_r * num_splits + i_s + i_u) * H + i_h
                # weight 0 for an empty split, a slot no program used, or past the last split
                b_w = tl.exp(tl.load(LPart + o_row, mask=m_s, other=float("-inf")) - b_lse)
                # loaded whatever the weight, so that the row load need not wait for the lse and exp (a load
                # masked on the weight cost up to 0.8 us at C=1); an unwritten slot's garbage is dropped below
                b_o = tl.load(OPart + o_row * 512 + o_d, mask=m_s, other=0.0).to(tl.float32)
                b_out += tl.where(b_w > 0.0, b_w * b_o, 0.0)
    else:  # a [CHUNK_S, BLOCK_D] tile per iteration, as above
        o_c = tl.arange(0, CHUNK_S)
        b_acc = tl.zeros((CHUNK_S, BLOCK_D), dtype=tl.float32)
        for i_s in range(0, num_splits, CHUNK_S):
            m_s = i_s + o_c < num_splits
            o_row = (i_r * num_splits + i_s + o_c) * H + i_h
            b_w = tl.exp(tl.load(LPart + o_row, mask=m_s, other=float("-inf")) - b_lse)[:, None]
            b_o = tl.load(OPart + o_row[:, None] * 512 + o_d[None, :], mask=m_s[:, None], other=0.0).to(tl.float32)
            b_acc += tl.where(b_w > 0.0, b_w * b_o, 0.0)
        b_out = tl.sum(b_acc, axis=0)
    if HAS_SINK:
        b_sink = tl.load(Sink + i_h)
        b_out = b_out * tl.where(m_empty, 0.0, 1.0 / (1.0 + tl.exp(b_sink - b_lse)))
    tl.store(Out + i_rh * 512 + o_d, b_out.to(tl.bfloat16))
    p_lse = Lse + ((i_r // q_tokens) * H + i_h) * q_tokens + i_r % q_tokens  # Lse [B, H, s_q]
    tl.store(p_lse, tl.where(m_empty, float("inf"), b_lse), mask=i_d == 0)


def combine_shape(rows: int, heads: int, splits: int) -> tuple[int, int]:
    """(CHUNK_S, BLOCK_D) of the combine that merges ``splits`` partials of each of ``rows`` x ``heads`` outputs."""
    partial_rows = rows * heads * splits
    if splits >= COMBINE_TILE_MIN_SPLITS and partial_rows <= COMBINE_TILE_MAX_ROWS:
        return min(triton.next_power_of_2(splits), COMBINE_TILE // 64), 64
    if splits <= COMBINE_UNROLL_MAX_SPLITS and partial_rows <= COMBINE_UNROLL_MAX_ROWS:
        return min(8, triton.next_power_of_2(splits)), 512
    return 1, 512


@dataclass(frozen=True)
class _Cache:
    """One paged cache of a call and what selects from it (indices are ``[B, s_q, topk]``)."""

    kv: torch.Tensor
    indices: torch.Tensor
    topk_length: torch.Tensor | None
    fmt: KVFormat


def _check_cache_args(name, kv_cache, indices, topk_length, fmt, B, s_q, squeeze):
    check_cache(kv_cache, fmt)
    want = f"[{B}, topk]" if squeeze else f"[{B}, {s_q}, topk]"
    lead = (B,) if squeeze else (B, s_q)
    if (
        indices.dim() != len(lead) + 1
        or tuple(indices.shape[:-1]) != lead
        or indices.dtype != torch.int32
        or not indices.is_contiguous()
    ):
        raise ValueError(f"{name} must be a contiguous {want} int32 tensor, got {list(indices.shape)} {indices.dtype}")
    if indices.shape[-1] < 1:
        raise ValueError(f"{name} must have topk >= 1")
    tl_name = "topk_length" if name == "indices" else "extra_topk_length"
    if topk_length is not None and (topk_length.shape != (B,) or topk_length.dtype != torch.int32):
        raise ValueError(f"{tl_name} must be a [{B}] int32 tensor, got {list(topk_length.shape)} {topk_length.dtype}")


def _validate(q, fmt, main, extra, attn_sink) -> bool:
    """Check a call's arguments; returns True for the 3-D form (one query token per request)."""
    check_pair(fmt.name, None)  # an extra-only format as the main cache
    if q.dim() not in (3, 4) or q.shape[-1] != fmt.d_qk or q.dtype != torch.bfloat16:
        raise ValueError(
            f"q must be [B, H, {fmt.d_qk}] or [B, s_q, H, {fmt.d_qk}] bf16 for {fmt.name}, "
            f"got {list(q.shape)} {q.dtype}"
        )
    if q.stride(-1) != 1:
        raise ValueError("q's last dimension must be contiguous")
    squeeze = q.dim() == 3
    B, H = q.shape[0], q.shape[-2]
    s_q = 1 if squeeze else q.shape[1]
    _check_cache_args("indices", *main, fmt, B, s_q, squeeze)
    tensors = [q, main[0], main[1], main[2]]
    if extra is not None:
        kv, idx, tl_, efmt = extra
        if efmt.d_qk != fmt.d_qk or efmt.d_v != fmt.d_v:
            raise ValueError(
                f"the extra cache's format {efmt.name} has D_qk={efmt.d_qk} but {fmt.name} has D_qk={fmt.d_qk}: "
                "both caches must share q's head dim"
            )
        check_pair(fmt.name, efmt.name)
        _check_cache_args("extra_indices", kv, idx, tl_, efmt, B, s_q, squeeze)
        tensors += [kv, idx, tl_]
    if attn_sink is not None:
        if attn_sink.shape != (H,) or attn_sink.dtype != torch.float32:
            raise ValueError(f"attn_sink must be a [{H}] float32 tensor, got {list(attn_sink.shape)} {attn_sink.dtype}")
        tensors.append(attn_sink)
    devices = {t.device for t in tensors if t is not None}
    if len(devices) != 1:
        raise ValueError(f"all inputs must be on one device, got {sorted(map(str, devices))}")
    return squeeze


@functools.cache
def _properties(device: torch.device):
    """The GPU's properties, read once per device (a call's plan needs them three times)."""
    return torch.cuda.get_device_properties(device)


def _compiled_for(device: torch.device, capability: tuple[int, int]) -> bool:
    """The kernels are compiled (not interpreted) for a GPU of at least this compute capability."""
    if device.type != "cuda" or INTERPRET:
        return False
    p = _properties(device)
    return (p.major, p.minor) >= capability


def native_fp8(device: torch.device) -> bool:
    """Use the hardware e4m3 conversion (sm_89+); the bit-assembly decoding elsewhere and in the interpreter."""
    return _compiled_for(device, (8, 9))


def use_pdl(device: torch.device) -> bool:
    """Programmatic dependent launch (sm_90+): each kernel's launch overlaps the tail of the one before."""
    return _compiled_for(device, (9, 0))


def sm_count(device: torch.device) -> int | None:
    """The GPU's SMs, for the split kernel's trigger (None off CUDA: the early trigger)."""
    return _properties(device).multi_processor_count if device.type == "cuda" else None


def merge_unroll(block_h: int, num_warps: int) -> int:
    """Partials the merge loads per iteration (``MERGE``): each iteration is one L2 round trip, so as many as fit
    in 512 B of registers per thread (128 registers; the accumulator [BLOCK_H, 512] fp32 takes half as many
    again): 4 at 16 heads and 4 warps, 8 at 8 warps, from 1 to 8."""
    return max(1, min(8, 512 * 32 * num_warps // (block_h * 512 * 2)))


def kv_words(fmt: KVFormat, config: KernelConfig) -> bool:
    """Whether the split kernel loads the cache's e4m3 bytes as 32-bit words (``WORDS``).

    fp8_v32 in a tile loop that Triton does not stage (one stage, or the register prefetch, which the
    pipeliner leaves alone): 4x fewer loads and no byte shuffle (measured -15 to -21 % at C >= 48 on
    the H200, docs/benchmarks.md, kernel v6). A staged loop keeps the byte tile: staged as words it
    grows to 109 824 B of shared memory at BLOCK_T 64, over sm_120's 101 376 B, where the byte tile fits.
    fp8_model1 keeps its byte path (a 448-byte nope part in 64-byte groups). fp8_v32_nope's rows are fp8_v32's
    first 528 bytes, loaded the same way (132 words a row); fp8_v41 and fp4_v41 keep their byte paths.
    """
    return fmt.name in ("fp8_v32", "fp8_v32_nope") and (config.num_stages == 1 or config.PREFETCH in (1, 3))


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu-interpreter"


@dataclass(frozen=True)
class Launch:
    """One kernel launch of a call: what :func:`sparse_mla_decode` runs and :func:`compile_spec` compiles."""

    name: str  # "split" | "combine"
    kernel: object  # the @triton.jit function
    grid: tuple[int, ...]
    args: dict  # runtime arguments (tensors and scalars), by name
    constexprs: dict
    options: dict  # num_warps, num_stages, maxnreg


@dataclass
class _Plan:
    out: torch.Tensor  # [B, s_q, H, D_v]
    lse: torch.Tensor  # [B, H, s_q]
    workspace: tuple[torch.Tensor, ...]
    launches: list[Launch]
    counters: torch.Tensor | None = None  # [rows * head_blocks] int32 (MERGE): zero before and after every call


# The merge's counters, one int32 per (row, head block), one buffer per device: zeroed once, when a call first needs
# them, and set back to zero by every call that uses them, so a call launches no memset, and a call of another
# shape (another CUDA-graph batch size) finds them allocated (a prepared call with ``buffers`` shares that call's).
# COUNTERS_MIN covers rows x head blocks of every decode batch an engine captures; a larger call allocates more.
# Two calls must not run at once on two streams of one device (they would share the counters).
COUNTERS_MIN = 1 << 16
_COUNTERS: dict[torch.device, torch.Tensor] = {}


def merge_counters(device: torch.device, n: int) -> torch.Tensor:
    """The merge's ``n`` counters on ``device`` (all zero between calls): on a GPU the first ``n`` of the device's
    buffer; elsewhere (the interpreter, meta tensors) a zeroed buffer of their own."""
    if device.type != "cuda":
        return torch.zeros(n, dtype=torch.int32, device=device)
    key = device if device.index is not None else torch.device("cuda", torch.cuda.current_device())
    if key not in _COUNTERS or _COUNTERS[key].numel() < n:
        _COUNTERS[key] = torch.zeros(max(n, COUNTERS_MIN), dtype=torch.int32, device=key)
    return _COUNTERS[key][:n]


def _plan(
    q: torch.Tensor,
    caches: list[_Cache],
    attn_sink: torch.Tensor | None,
    config: KernelConfig,
    sm_scale: float,
    *,
    native: bool,
    pdl: bool,
    sms: int | None = None,
    buffers: _Plan | None = None,
) -> _Plan:
    """Allocate the outputs and workspace and describe every launch of one call (nothing runs here).

    ``q`` is ``[B, s_q, H, D_qk]``; ``caches`` the main cache, then the extra one if any. The launcher
    runs exactly these launches, and :func:`compile_spec` compiles them from meta tensors, so the
    feasibility check cannot drift from what runs.

    One split launch for the whole call: a row's tiles are the main cache's, then the extra cache's
    (``split_grid`` with both topks), each cache walked with its own format, page size and constexprs; the
    combine merges the splits and applies the sink, or with ``MERGE=1`` the split kernel does (its counters:
    :func:`merge_counters`, or ``buffers``' own). A call of one split per row skips the combine (the
    split kernel then writes the output and applies the sink itself).

    ``buffers``: a plan of the same shapes and config whose output and workspace this one writes (the
    measurement's request sets share them, as the calls of one captured graph share freed blocks).
    """
    B, s_q, H, _ = q.shape
    rows = B * s_q  # query tokens are folded into the batch: each is an independent row
    dev = q.device
    if buffers is not None:
        out, lse = buffers.out, buffers.lse
    else:
        out = torch.empty(B, s_q, H, 512, dtype=torch.bfloat16, device=dev)
        lse = torch.empty(B, H, s_q, dtype=torch.float32, device=dev)
    block_h = block_h_for(H)
    head_blocks = -(-H // block_h)
    main = caches[0]
    extra = caches[1] if len(caches) > 1 else None
    check_pair(main.fmt.name, None if extra is None else extra.fmt.name)  # _validate: both share q's head dim
    check_block_t(config, None if extra is None else extra.fmt.name)
    topk = main.indices.shape[-1]
    x_topk = 0 if extra is None else extra.indices.shape[-1]
    grid = split_grid(config, rows, H, topk, x_topk)
    total_splits = grid.slots
    write_final = total_splits == 1
    if write_final:
        o_part, l_part = out, lse  # unused
    elif buffers is not None:
        o_part, l_part = buffers.workspace
        if o_part.shape != (rows, total_splits, H, 512):
            raise ValueError("buffers must be a prepared call of the same shapes and config")
    else:
        o_part = torch.empty(rows, total_splits, H, 512, dtype=torch.bfloat16, device=dev)
        l_part = torch.empty(rows, total_splits, H, dtype=torch.float32, device=dev)
    sink = lse if attn_sink is None else attn_sink  # a placeholder pointer when there is no sink
    pdl_option = {"launch_pdl": True} if pdl else {}
    num_pages, page_size, _ = main.kv.shape
    effective = grid.binary(config)
    merge = bool(effective.MERGE)  # the merge in the split launch (binary(): never with one split per row)
    counters = None
    if merge:
        n_counters = rows * head_blocks
        shared = None if buffers is None else buffers.counters
        counters = shared if shared is not None and shared.numel() == n_counters else merge_counters(dev, n_counters)
    # without an extra cache its pointers are the main cache's and its sizes 0 (never read)
    xc = main if extra is None else extra
    x_pages, x_page_size, _ = xc.kv.shape
    launches = [
        Launch(
            "split",
            _split_kernel,
            (grid.programs, head_blocks) if grid.balanced else (rows * head_blocks, grid.slots),
            {
                "Out": out,
                "Lse": lse,
                "OPart": o_part,
                "LPart": l_part,
                "Q": q,
                "KV8": main.kv,
                "KV16": main.kv.view(torch.bfloat16),
                "KV32": main.kv.view(torch.float32),
                "Idx": main.indices,
                "TopkLen": main.indices if main.topk_length is None else main.topk_length,
                "Sink": sink,
                "XKV8": xc.kv,
                "XKV16": xc.kv.view(torch.bfloat16),
                "XKV32": xc.kv.view(torch.float32),
                "XIdx": xc.indices,
                "XTopkLen": xc.indices if xc.topk_length is None else xc.topk_length,
                "Count": lse if counters is None else counters,  # a placeholder pointer without the merge
                "stride_qb": q.stride(0),
                "stride_qs": q.stride(1),
                "stride_qh": q.stride(2),
                "sm_scale": float(sm_scale),
                "topk": topk,
                "num_tokens": num_pages * page_size,
                "x_topk": x_topk,
                "x_num_tokens": 0 if extra is None else x_pages * x_page_size,
                "tiles_per_split": grid.tiles_per_split,
                "total_splits": total_splits,
                "q_tokens": s_q,
                "rows": rows,
                "slots": grid.slots,
            },
            {
                "H": H,
                "FORMAT": FORMAT_IDS[main.fmt.name],
                "PAGE_SIZE": page_size,
                "PAGE_BYTES": main.kv.stride(0),  # fp8_model1: the byte stride between pages (may be padded)
                "BLOCK_H": block_h,
                **effective.meta(),
                "MERGE_UNROLL": merge_unroll(block_h, effective.num_warps) if merge else 1,
                "WORDS": kv_words(main.fmt, effective),
                "HAS_TOPK_LEN": main.topk_length is not None,
                "HAS_SINK": (write_final or merge) and attn_sink is not None,
                "WRITE_FINAL": write_final,
                "DOT_F32": INTERPRET,
                "NATIVE_FP8": native,
                "USE_PDL": pdl,
                # see LATE_TRIGGER above; ``sms`` None (unknown): the early trigger
                "LATE_TRIGGER": pdl and not write_final and sms is not None and grid.programs * head_blocks > sms,
                "HAS_EXTRA": extra is not None,
                # the single-cache kernel's values, so that its binary stays one per config and format
                "X_FORMAT": FORMAT_IDS[xc.fmt.name],
                "X_PAGE_SIZE": x_page_size if extra is not None else page_size,
                "X_PAGE_BYTES": xc.kv.stride(0),
                "X_HAS_TOPK_LEN": extra is not None and extra.topk_length is not None,
            },
            {**config.options(), **pdl_option},
        )
    ]
    if not write_final and not merge:
        chunk_s, block_d = combine_shape(rows, H, total_splits)
        launches.append(
            Launch(
                "combine",
                _combine_kernel,
                (rows * H, 512 // block_d),
                {
                    "Out": out,
                    "Lse": lse,
                    "OPart": o_part,
                    "LPart": l_part,
                    "Sink": sink,
                    "num_splits": total_splits,
                    "q_tokens": s_q,
                },
                {
                    "H": H,
                    "BLOCK_S": triton.next_power_of_2(total_splits),
                    "CHUNK_S": chunk_s,
                    "BLOCK_D": block_d,
                    "HAS_SINK": attn_sink is not None,
                    "USE_PDL": pdl,
                },
                {"num_warps": 4, **pdl_option},
            )
        )
    workspace = () if write_final else (o_part, l_part)
    return _Plan(out, lse, workspace, launches, counters)


def sparse_mla_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    *,
    kv_format: str,
    sm_scale: float | None = None,
    topk_length: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    extra_kv_cache: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    extra_kv_format: str | None = None,
    extra_topk_length: torch.Tensor | None = None,
    config: KernelConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA decode attention over one or two paged caches, one latent KV head.

    Args:
        q: ``[B, H, D_qk]`` bf16 (one query token per request), or ``[B, s_q, H, D_qk]`` (s_q tokens
            per request, e.g. MTP); dims ordered nope then rope (D_qk = 576 for fp8_v32, 512 for the others).
        kv_cache: ``[num_pages, page_size, bytes_per_token]`` uint8, contiguous, or for a block-split format
            (fp8_model1, fp8_v41, fp4_v41) with padded pages (``stride(0) > page_size * bytes_per_token``, read in
            place; see ``kernels.kv_format``).
        indices: ``[B, topk]`` int32 (``[B, s_q, topk]`` with a 4-D q): flat token positions
            ``page * page_size + offset``; negative values and values ``>= num_pages * page_size`` are
            masked and never read.
        kv_format: ``"fp8_model1"``, ``"fp8_v32"``, ``"fp8_v32_nope"`` or ``"fp8_v41"`` (``"fp4_v41"`` is an
            extra cache only, next to an fp8_v41 main cache).
        sm_scale: softmax scale, default ``D_qk ** -0.5``.
        topk_length: optional ``[B]`` int32; only the first ``topk_length[b]`` indices of request b count
            (for every query token of the request).
        attn_sink: optional ``[H]`` fp32; the output is scaled by ``exp(lse) / (exp(lse) + exp(sink))``
            and ``lse`` is returned unchanged (``+inf`` zeroes the output, ``-inf`` changes nothing).
        extra_kv_cache, extra_indices, extra_kv_format, extra_topk_length: a second cache (its own page
            size and format, same D_qk; the format defaults to ``kv_format``) attended in the same softmax,
            with indices shaped like ``indices`` and the same rules.
        config: tunables; ``None`` looks the exported autotune table up (``kernels/configs``) by the main
            cache's workload at batch ``B * s_q``, else :data:`kernels.config.DEFAULT_CONFIG`, with BLOCK_T
            raised to :func:`min_block_t` of the extra cache (32 for fp4_v41; an explicit config below it is a
            ValueError).

    Returns:
        ``out [B, H, 512]`` bf16 and ``lse [B, H]`` fp32 (natural log) for a 3-D q; ``out [B, s_q, H, 512]``
        and ``lse [B, H, s_q]`` (FlashMLA's layout) for a 4-D q. A row with no valid index in either
        cache gives ``out = 0`` and ``lse = +inf``, whatever the sink.

    Design: query tokens are folded into the batch (each one is an independent row of the grid). With
    an extra cache, one split launch walks both: a row is the main cache's top-k tiles followed by the
    extra cache's (a tile never holds tokens of both; each cache keeps its page size and topk_length,
    as constexprs and arguments of its own), so the splits are dealt over the whole row at once and
    one online softmax per split spans the caches; the log-sum-exp combine (or with ``MERGE=1`` the row's
    last split program) merges the splits and applies the sink once, on the final lse. With one split per
    row the split kernel applies the sink itself and there is no combine.

    No host synchronisation and a workspace sized from shapes only, so the call is CUDA-graph capturable.
    """
    return prepare_decode(
        q,
        kv_cache,
        indices,
        kv_format=kv_format,
        sm_scale=sm_scale,
        topk_length=topk_length,
        attn_sink=attn_sink,
        extra_kv_cache=extra_kv_cache,
        extra_indices=extra_indices,
        extra_kv_format=extra_kv_format,
        extra_topk_length=extra_topk_length,
        config=config,
    )()


@dataclass
class DecodeCall:
    """One call of :func:`sparse_mla_decode`, checked and planned once (:func:`prepare_decode`), run by calling it.

    Each run writes the same output and workspace (returned by every run): graph-safe, and a replay of
    a captured run costs only its launches. The tuner's measurement captures many of these (one per
    request set); :func:`sparse_mla_decode` builds one and runs it once.
    """

    plan: _Plan | None  # None for an empty call (no rows or heads)
    out: torch.Tensor
    lse: torch.Tensor
    config: KernelConfig
    squeeze: bool

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.plan is not None:
            if POISON_OUTPUTS:
                for t in (self.plan.out, self.plan.lse, *self.plan.workspace):
                    t.fill_(float("nan"))
            for launch in self.plan.launches:
                for listener in LAUNCH_LISTENERS:
                    listener(launch.name, self.config, launch.grid)
                options = {} if INTERPRET else launch.options
                launch.kernel[launch.grid](**launch.args, **launch.constexprs, **options)
        if self.squeeze:
            return self.out.squeeze(1), self.lse.squeeze(2)
        return self.out, self.lse


def prepare_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    *,
    kv_format: str,
    sm_scale: float | None = None,
    topk_length: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    extra_kv_cache: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    extra_kv_format: str | None = None,
    extra_topk_length: torch.Tensor | None = None,
    config: KernelConfig | None = None,
    buffers: DecodeCall | None = None,
) -> DecodeCall:
    """:func:`sparse_mla_decode`'s checks and plan without running it: ``prepare_decode(...)()`` is
    ``sparse_mla_decode(...)``. ``buffers``: a prepared call of the same shapes and config whose output
    and workspace this one writes (otherwise it allocates its own)."""
    fmt = get_format(kv_format)
    if (extra_kv_cache is None) != (extra_indices is None):
        raise ValueError("extra_kv_cache and extra_indices must be given together")
    if extra_kv_cache is None and (extra_topk_length is not None or extra_kv_format is not None):
        raise ValueError("extra_topk_length and extra_kv_format need extra_kv_cache and extra_indices")
    main = (kv_cache, indices, topk_length)
    extra = None
    if extra_kv_cache is not None:
        extra = (extra_kv_cache, extra_indices, extra_topk_length, get_format(extra_kv_format or kv_format))
    squeeze = _validate(q, fmt, main, extra, attn_sink)
    if q.device.type != "cuda" and not INTERPRET:
        raise ValueError(
            "tensors on the CPU need Triton's interpreter: set TRITON_INTERPRET=1 before importing kernels"
        )
    if squeeze:  # views: the 3-D form is the 4-D one with s_q = 1
        q, indices = q.unsqueeze(1), indices.unsqueeze(1)
        extra_indices = None if extra is None else extra_indices.unsqueeze(1)
    B, s_q, H, _ = q.shape
    topk = indices.shape[-1]
    if config is None:
        rows = B * s_q
        config = lookup_config(device_name(q.device), kv_format, H, topk, rows) if rows > 0 else DEFAULT_CONFIG
        need = min_block_t(None if extra is None else extra[3].name)
        if config.BLOCK_T < need:  # the default (T16) or a table tuned without this extra cache
            config = config.replace(BLOCK_T=need)
    if sm_scale is None:
        sm_scale = fmt.d_qk**-0.5
    if B * s_q * H == 0:
        out = torch.empty(B, s_q, H, fmt.d_v, dtype=torch.bfloat16, device=q.device)
        lse = torch.empty(B, H, s_q, dtype=torch.float32, device=q.device)
    else:
        caches = [_Cache(kv_cache, indices, topk_length, fmt)]
        if extra is not None:
            caches.append(_Cache(extra_kv_cache, extra_indices, extra_topk_length, extra[3]))
        native, pdl, sms = native_fp8(q.device), use_pdl(q.device), sm_count(q.device)
        shared = None if buffers is None else buffers.plan
        if shared is not None and (tuple(shared.out.shape) != (B, s_q, H, 512) or buffers.config != config):
            raise ValueError("buffers must be a prepared call of the same shapes and config")
        plan = _plan(q, caches, attn_sink, config, sm_scale, native=native, pdl=pdl, sms=sms, buffers=shared)
        return DecodeCall(plan, plan.out, plan.lse, config, squeeze)
    return DecodeCall(None, out, lse, config, squeeze)


# --- compile-only: what the launcher would compile, for any target arch ----------------------------


@dataclass(frozen=True)
class CompileSpec:
    """Everything ``triton.compile(ASTSource(kernel, signature, constexprs, attrs), target, options)`` needs."""

    name: str
    kernel: object
    signature: dict[str, str]
    constexprs: dict
    attrs: dict
    options: dict

    def key(self) -> tuple:
        """Identifies the binary (two launches with one key run the same code)."""
        return (
            self.name,
            tuple(sorted(self.signature.items())),
            tuple(sorted(self.constexprs.items())),
            tuple(sorted((k, str(v)) for k, v in self.attrs.items())),
            tuple(sorted(self.options.items())),
        )


def _specialize(launch: Launch) -> tuple[dict[str, str], dict, dict]:
    """Signature, constexprs and attrs exactly as Triton's JIT derives them from the launch's arguments."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    params = {p.name: p for p in launch.kernel.params}
    signature, constexprs, attrs = {}, dict(launch.constexprs), {}
    for i, name in enumerate(launch.kernel.arg_names):
        if name in launch.constexprs:
            signature[name] = "constexpr"
            continue
        p = params[name]
        ty, attr = native_specialize_impl(
            BaseBackend, launch.args[name], False, not p.do_not_specialize, not p.do_not_specialize_on_alignment
        )
        if ty == "constexpr":  # an int equal to 1 is folded in, as the JIT does
            signature[name], constexprs[name] = "constexpr", attr
        else:
            signature[name] = ty
            if attr == "D":
                attrs[(i,)] = [["tt.divisibility", 16]]
    return signature, constexprs, attrs


def _meta_cache(workload: Workload, rows: int, q_tokens: int, topk_length: bool) -> _Cache:
    fmt = get_format(workload.kv_format)
    num_pages = -(-workload.context // workload.page_size)
    kv = torch.empty(num_pages, workload.page_size, fmt.bytes_per_token, dtype=torch.uint8, device="meta")
    idx = torch.empty(rows, q_tokens, workload.topk, dtype=torch.int32, device="meta")
    tl_ = torch.empty(rows, dtype=torch.int32, device="meta") if topk_length else None
    return _Cache(kv, idx, tl_, fmt)


def _rows_past_tile(workload: Workload) -> int:
    """Rows enough for the combine to merge one split per iteration at any split count."""
    return max(COMBINE_TILE_MAX_ROWS, COMBINE_UNROLL_MAX_ROWS) // workload.heads + 1


def compile_spec(
    config: KernelConfig,
    workload: Workload,
    arch: int | str,
    batch: int | None = None,
    *,
    topk_length: bool = False,
    extra: Workload | None = None,
    extra_topk_length: bool = False,
    attn_sink: bool = False,
    q_tokens: int = 1,
    sms: int | None = None,
) -> list[CompileSpec]:
    """The kernels a call would compile for ``arch`` (e.g. ``120`` or ``"sm_120"``), without a GPU.

    With ``batch``, exactly the launches of a call at that batch size. Without, every variant a call
    with this config can launch for this workload: the one-split kernel that writes the output, and
    the split kernel that writes partials with the combine kernel's code paths: at one row, with 16
    splits (rows of 512 per iteration) and with the most (a tile of splits, from 32), and at enough rows
    for the combine to merge one split per iteration.
    The keywords describe the call: ``topk_length``/``extra_topk_length`` given, an ``extra`` cache
    (its format, topk, page size and context; its heads are ``workload``'s), an ``attn_sink``, and
    ``q_tokens`` query tokens per request (s_q; it changes the grid, not the binary). ``sms``: with ``batch``,
    the GPU's SMs, which choose the split kernel's trigger (None: the early one); without, both are compiled.
    Runs the launcher's own planning on ``meta`` tensors, so it cannot differ from what runs.
    """
    if INTERPRET:
        raise RuntimeError("compile_spec needs a process started without TRITON_INTERPRET")
    cc = int(str(arch).removeprefix("sm_"))
    fmt = get_format(workload.kv_format)
    most = config.replace(TARGET_CTAS=MAX_TARGET_CTAS)  # the most splits
    if batch:
        cases = [(batch, config)]
    else:  # one split; the combine at one row, of 16 splits (rows of 512) and of the most (the tile from 32
        # splits), and at enough rows to merge one split at a time
        cases = [(1, config.replace(TARGET_CTAS=n)) for n in (1, 16, MAX_TARGET_CTAS)] + [
            (_rows_past_tile(workload), most)
        ]
    specs: dict[tuple, CompileSpec] = {}
    for b, cfg in cases:
        q = torch.empty(b, q_tokens, workload.heads, fmt.d_qk, dtype=torch.bfloat16, device="meta")
        caches = [_meta_cache(workload, b, q_tokens, topk_length)]
        if extra is not None:
            caches.append(_meta_cache(extra, b, q_tokens, extra_topk_length))
        sink = torch.empty(workload.heads, dtype=torch.float32, device="meta") if attn_sink else None
        for n in (sms,) if batch else (None, 0):  # without a batch, both triggers of the split kernel (0 SMs: late)
            plan = _plan(q, caches, sink, cfg, fmt.d_qk**-0.5, native=cc >= 89, pdl=cc >= 90, sms=n)
            for launch in plan.launches:
                sig, const, attrs = _specialize(launch)
                spec = CompileSpec(launch.name, launch.kernel, sig, const, attrs, dict(launch.options))
                specs.setdefault(spec.key(), spec)
    return list(specs.values())
