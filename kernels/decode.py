"""Sparse MLA decode (MQA form) over a paged FP8 KV cache, in Triton.

Two kernels:
  ``_split_kernel``   grid (B * head_blocks, num_splits). One program takes BLOCK_H heads of one
                      request and one contiguous slice of its top-k list, walks it in BLOCK_T-token
                      tiles (gather, dequantize, q.k^T, online softmax, p.v) and writes fp32 partials
                      and their lse -- or, when num_splits == 1, the final bf16 output and lse directly.
  ``_combine_kernel`` grid (B * H,). Merges the splits of one (request, head) by log-sum-exp.
                      Not launched at all when num_splits == 1.

Head blocking: BLOCK_H = max(16, next_pow2(H)) capped at 32 (tl.dot needs M >= 16; 32 heads of
fp32 accumulators [32, 512] are already 128 registers/thread at 4 warps), so head_blocks = ceil(H / 32)
for H > 32. Every KV tile is read once per head block.

Dequantization: e4m3 is decoded by bit assembly into fp16 (``sign<<15 | (byte & 0x7f)<<7`` is the
same number times 2^-8, subnormals included), so the kernel needs no fp8 hardware support and runs
unchanged for every target arch and in the interpreter; the 2^8 is folded into the per-group scale.

Interpreter workaround: Triton 3.6's interpreter multiplies the raw bits of bf16 ``tl.dot`` operands.
Under ``TRITON_INTERPRET=1`` the constexpr ``DOT_F32`` makes both dots take fp32 operands; the GPU
path always feeds bf16 to the tensor cores with fp32 accumulation.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.config import DEFAULT_CONFIG
from kernels.config import KernelConfig
from kernels.config import block_h_for
from kernels.config import num_splits_for
from kernels.kv_format import check_cache
from kernels.kv_format import get_format
from kernels.table import lookup_config
from kernels.workload import Workload

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
FORMAT_IDS = {"fp8_model1": 0, "fp8_v32": 1}

# Fill outputs and workspace with NaN before launching, so an unwritten element fails the
# correctness gate loudly (the tuner's gate and the tests set it; never needed in production).
POISON_OUTPUTS = False

# Called as fn(kernel_name, config, grid) before every launch; the tuner counts launches with it.
LAUNCH_LISTENERS: list[Callable[[str, KernelConfig, tuple], None]] = []


@triton.jit
def _e4m3_to_f32(b_u8, NATIVE_FP8: tl.constexpr):
    """e4m3 bytes -> fp32 values times 2^-8 (bit trick) or exact (native cvt on sm_89+)."""
    if NATIVE_FP8:
        return b_u8.to(tl.float8e4nv, bitcast=True).to(tl.float32) * 0.00390625
    b = b_u8.to(tl.uint16)
    return (((b & 0x80) << 8) | ((b & 0x7F) << 7)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _load_kv_tile(
    KV8,
    KV16,
    KV32,
    b_idx,
    m_tok,
    FORMAT: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    DOT_F32: tl.constexpr,
    NATIVE_FP8: tl.constexpr,
):
    """Gather and dequantize ``BLOCK_T`` tokens. Returns (k [BLOCK_T, 512], k_rope [BLOCK_T, 64]).

    fp8_model1: k is the whole 512-dim key (448 nope + 64 rope, which is also V); k_rope is unused.
    fp8_v32:    k is the 512 nope dims (also V) and k_rope the 64 rope dims (keys only).
    Masked-out tokens (``m_tok`` false) are never read and come back as zeros. Offsets are written
    per view (bytes, bf16 or fp32 elements) from the token index so that Triton can prove their
    alignment and vectorize the loads.
    """
    b_idx = b_idx.to(tl.int64)
    o_rope = tl.arange(0, 64)
    if FORMAT == 0:
        # [T, 8, 64]: groups 0..6 are e4m3 with a ue8m0 scale each, group 7 is the bf16 rope part
        o_g = tl.arange(0, 8)
        o_j = tl.arange(0, 64)
        b_page = b_idx // PAGE_SIZE
        b_tok = b_idx % PAGE_SIZE
        o_data = b_page * (PAGE_SIZE * 584) + b_tok * 576  # [T] bytes
        o_nope = o_data[:, None, None] + o_g[None, :, None] * 64 + o_j[None, None, :]
        m_nope = m_tok[:, None, None] & (o_g[None, :, None] < 7)
        b_q8 = tl.load(KV8 + o_nope, mask=m_nope, other=0)  # [T, 8, 64]
        o_scale = b_page * (PAGE_SIZE * 584) + PAGE_SIZE * 576 + b_tok * 8
        m_scale = m_tok[:, None] & (o_g[None, :] < 7)
        b_e8 = tl.load(KV8 + o_scale[:, None] + o_g[None, :], mask=m_scale, other=127).to(tl.uint32)  # [T, 8]
        # 2^(e - 127) exactly, times 2^8 to undo the e4m3 decoding's 2^-8
        b_scale = (b_e8 << 23).to(tl.float32, bitcast=True) * 256.0
        o_rope16 = b_page * (PAGE_SIZE * 292) + b_tok * 288 + 224  # bf16 elements
        b_rope = tl.load(KV16 + o_rope16[:, None] + o_rope[None, :], mask=m_tok[:, None], other=0.0)
        b_nope = _e4m3_to_f32(b_q8, NATIVE_FP8) * b_scale[:, :, None]
        b_k3 = tl.where((o_g == 7)[None, :, None], b_rope.to(tl.float32)[:, None, :], b_nope)
        b_k = tl.reshape(b_k3, (BLOCK_T, 512))
        b_kr = tl.zeros((BLOCK_T, 64), dtype=tl.float32)
    else:
        o_g = tl.arange(0, 4)
        o_j = tl.arange(0, 128)
        o_nope = b_idx[:, None, None] * 656 + o_g[None, :, None] * 128 + o_j[None, None, :]
        b_q8 = tl.load(KV8 + o_nope, mask=m_tok[:, None, None], other=0)  # [T, 4, 128]
        b_scale = tl.load(KV32 + (b_idx * 164 + 128)[:, None] + o_g[None, :], mask=m_tok[:, None], other=0.0)
        b_k3 = _e4m3_to_f32(b_q8, NATIVE_FP8) * (b_scale * 256.0)[:, :, None]
        b_k = tl.reshape(b_k3, (BLOCK_T, 512))
        b_kr = tl.load(KV16 + (b_idx * 328 + 264)[:, None] + o_rope[None, :], mask=m_tok[:, None], other=0.0)
        b_kr = b_kr.to(tl.float32)
    if DOT_F32:
        return b_k, b_kr
    return b_k.to(tl.bfloat16), b_kr.to(tl.bfloat16)


# Integer arguments are not value-specialized (==1, %16): one compile per config and format serves
# every batch size, which keeps the tuner's compile time to two variants (WRITE_FINAL) per config.
@triton.jit(do_not_specialize=["topk", "num_tokens", "tiles_per_split", "num_splits"])
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
    stride_qb,
    stride_qh,
    sm_scale,
    topk,
    num_tokens,
    tiles_per_split,
    num_splits,
    H: tl.constexpr,
    FORMAT: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_T: tl.constexpr,
    HAS_TOPK_LEN: tl.constexpr,
    WRITE_FINAL: tl.constexpr,
    DOT_F32: tl.constexpr,
    NATIVE_FP8: tl.constexpr,
):
    i_bh = tl.program_id(0).to(tl.int64)
    i_s = tl.program_id(1).to(tl.int64)
    head_blocks: tl.constexpr = (H + BLOCK_H - 1) // BLOCK_H
    i_b = i_bh // head_blocks
    i_hb = i_bh % head_blocks

    n_valid = topk
    if HAS_TOPK_LEN:
        n_valid = tl.minimum(tl.maximum(tl.load(TopkLen + i_b), 0), topk)
    t_begin = i_s * tiles_per_split * BLOCK_T
    t_end = tl.minimum(t_begin + tiles_per_split * BLOCK_T, n_valid)
    # tiles wholly past topk_length are skipped, not masked
    n_tiles = tl.maximum(t_end - t_begin + BLOCK_T - 1, 0) // BLOCK_T

    o_h = i_hb * BLOCK_H + tl.arange(0, BLOCK_H)
    m_h = o_h < H
    o_d = tl.arange(0, 512)
    p_q = Q + i_b * stride_qb + o_h[:, None] * stride_qh

    qk_scale = sm_scale * 1.4426950408889634  # softmax in base 2
    b_m = tl.full((BLOCK_H,), float("-inf"), dtype=tl.float32)
    b_l = tl.zeros((BLOCK_H,), dtype=tl.float32)
    b_acc = tl.zeros((BLOCK_H, 512), dtype=tl.float32)
    p_idx = Idx + i_b * topk
    for i_t in range(0, n_tiles):
        o_t = t_begin + i_t * BLOCK_T + tl.arange(0, BLOCK_T)
        b_idx = tl.load(p_idx + o_t, mask=o_t < t_end, other=-1)  # [BLOCK_T]
        m_tok = (b_idx >= 0) & (b_idx < num_tokens)
        b_idx = tl.where(m_tok, b_idx, 0)
        b_k, b_kr = _load_kv_tile(KV8, KV16, KV32, b_idx, m_tok, FORMAT, PAGE_SIZE, BLOCK_T, DOT_F32, NATIVE_FP8)
        # q is re-read every tile (an L1 hit) on purpose: kept live across the loop as an mma operand
        # it costs every warp 16 x 576 x 2 / 32 = 576 B of registers and halves occupancy.
        b_q = tl.load(p_q + o_d[None, :], mask=m_h[:, None], other=0.0).to(b_k.dtype)  # [BLOCK_H, 512]
        b_s = tl.dot(b_q, tl.trans(b_k))  # [BLOCK_H, BLOCK_T]
        if FORMAT == 1:
            b_qr = tl.load(p_q + 512 + tl.arange(0, 64)[None, :], mask=m_h[:, None], other=0.0).to(b_k.dtype)
            b_s = tl.dot(b_qr, tl.trans(b_kr), b_s)
        b_s = tl.where(m_tok[None, :], b_s * qk_scale, float("-inf"))
        b_m_new = tl.maximum(b_m, tl.max(b_s, axis=1))
        b_m_use = tl.where(b_m_new == float("-inf"), 0.0, b_m_new)  # no (-inf) - (-inf)
        b_alpha = tl.exp2(b_m - b_m_use)
        b_p = tl.exp2(b_s - b_m_use[:, None])
        b_l = b_l * b_alpha + tl.sum(b_p, axis=1)
        b_acc = b_acc * b_alpha[:, None] + tl.dot(b_p.to(b_k.dtype), b_k)  # [BLOCK_H, 512]
        b_m = b_m_new

    m_empty = b_l == 0.0
    b_o = b_acc / tl.where(m_empty, 1.0, b_l)[:, None]
    b_lse = (b_m + tl.log2(tl.where(m_empty, 1.0, b_l))) * 0.6931471805599453  # natural log
    if WRITE_FINAL:
        p_o = Out + (i_b * H + o_h)[:, None] * 512 + o_d[None, :]
        tl.store(p_o, b_o.to(tl.bfloat16), mask=m_h[:, None])
        tl.store(Lse + i_b * H + o_h, tl.where(m_empty, float("inf"), b_lse), mask=m_h)
    else:
        o_row = (i_b * num_splits + i_s) * H + o_h  # OPart [B, S, H, 512]
        tl.store(OPart + o_row[:, None] * 512 + o_d[None, :], b_o, mask=m_h[:, None])
        tl.store(LPart + o_row, tl.where(m_empty, float("-inf"), b_lse), mask=m_h)


@triton.jit(do_not_specialize=["num_splits"])
def _combine_kernel(Out, Lse, OPart, LPart, num_splits, H: tl.constexpr, BLOCK_S: tl.constexpr):
    """out = sum_s exp(lse_s - lse) * o_s, lse = logsumexp_s(lse_s); empty rows: out 0, lse +inf."""
    i_bh = tl.program_id(0).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    o_s = tl.arange(0, BLOCK_S)
    p_l = LPart + (i_b * num_splits + o_s) * H + i_h
    b_ls = tl.load(p_l, mask=o_s < num_splits, other=float("-inf"))  # [BLOCK_S]
    b_max = tl.max(b_ls, axis=0)
    m_empty = b_max == float("-inf")
    b_max_use = tl.where(m_empty, 0.0, b_max)
    b_sum = tl.sum(tl.exp(b_ls - b_max_use), axis=0)
    b_lse = b_max_use + tl.log(tl.where(m_empty, 1.0, b_sum))
    o_d = tl.arange(0, 512)
    b_acc = tl.zeros((512,), dtype=tl.float32)
    for i_s in range(0, num_splits):
        o_row = (i_b * num_splits + i_s) * H + i_h
        b_w = tl.exp(tl.load(LPart + o_row) - b_lse)  # 0 for an empty split
        b_acc += b_w * tl.load(OPart + o_row * 512 + o_d)
    tl.store(Out + i_bh * 512 + o_d, b_acc.to(tl.bfloat16))
    tl.store(Lse + i_bh, tl.where(m_empty, float("inf"), b_lse))


def _validate(q, kv_cache, indices, fmt, topk_length):
    if q.dim() == 4:
        raise ValueError("only one query token per request is supported: q must be [B, H, D_qk], got 4 dims")
    if q.dim() != 3 or q.shape[2] != fmt.d_qk or q.dtype != torch.bfloat16:
        raise ValueError(f"q must be [B, H, {fmt.d_qk}] bf16 for {fmt.name}, got {list(q.shape)} {q.dtype}")
    if q.stride(2) != 1:
        raise ValueError("q's last dimension must be contiguous")
    check_cache(kv_cache, fmt)
    B = q.shape[0]
    if indices.dim() != 2 or indices.shape[0] != B or indices.dtype != torch.int32 or not indices.is_contiguous():
        raise ValueError(
            f"indices must be a contiguous [{B}, topk] int32 tensor, got {list(indices.shape)} {indices.dtype}"
        )
    if indices.shape[1] < 1:
        raise ValueError("indices must have topk >= 1")
    if topk_length is not None and (topk_length.shape != (B,) or topk_length.dtype != torch.int32):
        raise ValueError(f"topk_length must be a [{B}] int32 tensor, got {list(topk_length.shape)} {topk_length.dtype}")
    devices = {t.device for t in (q, kv_cache, indices) + (() if topk_length is None else (topk_length,))}
    if len(devices) != 1:
        raise ValueError(f"all inputs must be on one device, got {sorted(map(str, devices))}")


def native_fp8(device: torch.device) -> bool:
    """Use the hardware e4m3 conversion (sm_89+); the bit-assembly decoding elsewhere and in the interpreter."""
    return device.type == "cuda" and not INTERPRET and torch.cuda.get_device_capability(device) >= (8, 9)


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
    out: torch.Tensor
    lse: torch.Tensor
    workspace: tuple[torch.Tensor, ...]
    launches: list[Launch]


def _plan(q, kv_cache, indices, topk_length, fmt, config: KernelConfig, sm_scale: float, *, native: bool) -> _Plan:
    """Allocate the outputs and workspace and describe every launch of one call (nothing runs here).

    The launcher runs exactly these launches, and :func:`compile_spec` compiles them from meta tensors,
    so the feasibility check cannot drift from what runs.
    """
    B, H, _ = q.shape
    topk = indices.shape[1]
    num_pages, page_size, _ = kv_cache.shape
    dev = q.device
    out = torch.empty(B, H, fmt.d_v, dtype=torch.bfloat16, device=dev)
    lse = torch.empty(B, H, dtype=torch.float32, device=dev)
    block_h = block_h_for(H)
    head_blocks = -(-H // block_h)
    num_splits, tiles_per_split = num_splits_for(config, B, H, topk)
    write_final = num_splits == 1
    if write_final:
        o_part, l_part = out, lse  # unused
    else:
        o_part = torch.empty(B, num_splits, H, fmt.d_v, dtype=torch.float32, device=dev)
        l_part = torch.empty(B, num_splits, H, dtype=torch.float32, device=dev)
    split = Launch(
        "split",
        _split_kernel,
        (B * head_blocks, num_splits),
        {
            "Out": out,
            "Lse": lse,
            "OPart": o_part,
            "LPart": l_part,
            "Q": q,
            "KV8": kv_cache,
            "KV16": kv_cache.view(torch.bfloat16),
            "KV32": kv_cache.view(torch.float32),
            "Idx": indices,
            "TopkLen": indices if topk_length is None else topk_length,
            "stride_qb": q.stride(0),
            "stride_qh": q.stride(1),
            "sm_scale": float(sm_scale),
            "topk": topk,
            "num_tokens": num_pages * page_size,
            "tiles_per_split": tiles_per_split,
            "num_splits": num_splits,
        },
        {
            "H": H,
            "FORMAT": FORMAT_IDS[fmt.name],
            "PAGE_SIZE": page_size,
            "BLOCK_H": block_h,
            **config.meta(),
            "HAS_TOPK_LEN": topk_length is not None,
            "WRITE_FINAL": write_final,
            "DOT_F32": INTERPRET,
            "NATIVE_FP8": native,
        },
        config.options(),
    )
    launches = [split]
    if not write_final:
        launches.append(
            Launch(
                "combine",
                _combine_kernel,
                (B * H,),
                {"Out": out, "Lse": lse, "OPart": o_part, "LPart": l_part, "num_splits": num_splits},
                {"H": H, "BLOCK_S": triton.next_power_of_2(num_splits)},
                {"num_warps": 4},
            )
        )
    workspace = () if write_final else (o_part, l_part)
    return _Plan(out, lse, workspace, launches)


def sparse_mla_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    *,
    kv_format: str,
    sm_scale: float | None = None,
    topk_length: torch.Tensor | None = None,
    config: KernelConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA decode attention, one query token per request, one latent KV head.

    Args:
        q: ``[B, H, D_qk]`` bf16, dims ordered nope then rope (D_qk = 512 for fp8_model1, 576 for fp8_v32).
        kv_cache: ``[num_pages, page_size, bytes_per_token]`` uint8, contiguous (see ``kernels.kv_format``).
        indices: ``[B, topk]`` int32 flat token positions ``page * page_size + offset``; negative values
            and values ``>= num_pages * page_size`` are masked and never read.
        kv_format: ``"fp8_model1"`` or ``"fp8_v32"``.
        sm_scale: softmax scale, default ``D_qk ** -0.5``.
        topk_length: optional ``[B]`` int32; only the first ``topk_length[b]`` indices of row b count.
        config: tunables; ``None`` looks the exported autotune table up (``kernels/configs``), else
            :data:`kernels.config.DEFAULT_CONFIG`.

    Returns:
        ``out [B, H, 512]`` bf16 and ``lse [B, H]`` fp32 (natural log). A row with no valid index gives
        ``out = 0`` and ``lse = +inf``.

    No host synchronisation and a workspace sized from shapes only, so the call is CUDA-graph capturable.
    """
    fmt = get_format(kv_format)
    _validate(q, kv_cache, indices, fmt, topk_length)
    if q.device.type != "cuda" and not INTERPRET:
        raise ValueError(
            "tensors on the CPU need Triton's interpreter: set TRITON_INTERPRET=1 before importing kernels"
        )
    B, H, _ = q.shape
    topk = indices.shape[1]
    if config is None:
        config = lookup_config(device_name(q.device), kv_format, H, topk, B) if B > 0 else DEFAULT_CONFIG
    if sm_scale is None:
        sm_scale = fmt.d_qk**-0.5
    if B == 0 or H == 0:
        return (
            torch.empty(B, H, fmt.d_v, dtype=torch.bfloat16, device=q.device),
            torch.empty(B, H, dtype=torch.float32, device=q.device),
        )
    plan = _plan(q, kv_cache, indices, topk_length, fmt, config, sm_scale, native=native_fp8(q.device))
    if POISON_OUTPUTS:
        for t in (plan.out, plan.lse, *plan.workspace):
            t.fill_(float("nan"))
    for launch in plan.launches:
        for listener in LAUNCH_LISTENERS:
            listener(launch.name, config, launch.grid)
        options = {} if INTERPRET else launch.options
        launch.kernel[launch.grid](**launch.args, **launch.constexprs, **options)
    return plan.out, plan.lse


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


def compile_spec(
    config: KernelConfig, workload: Workload, arch: int | str, batch: int | None = None, *, topk_length: bool = False
) -> list[CompileSpec]:
    """The kernels a call would compile for ``arch`` (e.g. ``120`` or ``"sm_120"``), without a GPU.

    With ``batch``, exactly the launches of a call at that batch size. Without, every variant a call
    with this config can launch for this workload: the one-split kernel that writes the output, and
    the split kernel that writes partials with the combine kernel at the largest split count.
    Runs the launcher's own planning on ``meta`` tensors, so it cannot differ from what runs.
    """
    if INTERPRET:
        raise RuntimeError("compile_spec needs a process started without TRITON_INTERPRET")
    cc = int(str(arch).removeprefix("sm_"))
    fmt = get_format(workload.kv_format)
    num_pages = -(-workload.context // workload.page_size)
    kv = torch.empty(num_pages, workload.page_size, fmt.bytes_per_token, dtype=torch.uint8, device="meta")
    cases = [(batch, config)] if batch else [(1, config.replace(TARGET_CTAS=1)), (1, config.replace(TARGET_CTAS=2**30))]
    specs: dict[tuple, CompileSpec] = {}
    for b, cfg in cases:
        q = torch.empty(b, workload.heads, fmt.d_qk, dtype=torch.bfloat16, device="meta")
        idx = torch.empty(b, workload.topk, dtype=torch.int32, device="meta")
        tl_ = torch.empty(b, dtype=torch.int32, device="meta") if topk_length else None
        for launch in _plan(q, kv, idx, tl_, fmt, cfg, fmt.d_qk**-0.5, native=cc >= 89).launches:
            sig, const, attrs = _specialize(launch)
            spec = CompileSpec(launch.name, launch.kernel, sig, const, attrs, dict(launch.options))
            specs.setdefault(spec.key(), spec)
    return list(specs.values())
