"""Pure-torch ground truth for sparse MLA decode (FlashMLA ``tests/ref.py::ref_sparse_attn_decode``).

Same signature as :func:`kernels.sparse_mla_decode`, fp32 math on the dequantized cache.
"""

from __future__ import annotations

import torch

from kernels.kv_format import KVFormat
from kernels.kv_format import get_format


def valid_mask(indices: torch.Tensor, num_tokens: int, topk_length: torch.Tensor | None) -> torch.Tensor:
    """``[B, topk]`` bool: index in ``[0, num_tokens)`` and position before ``topk_length[b]``."""
    valid = (indices >= 0) & (indices < num_tokens)
    if topk_length is not None:
        pos = torch.arange(indices.shape[1], device=indices.device)
        valid &= pos[None, :] < topk_length.to(indices.device).long()[:, None]
    return valid


def sparse_mla_decode_ref(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    *,
    kv_format: str,
    sm_scale: float | None = None,
    topk_length: torch.Tensor | None = None,
    config=None,  # accepted for signature parity; the reference has no tunables
) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [B, H, D_qk] bf16; kv_cache: [num_pages, page_size, bpt] uint8; indices: [B, topk] int32.

    Returns ``out [B, H, D_v]`` bf16 and ``lse [B, H]`` fp32 (natural log); rows with no valid
    index give ``out = 0`` and ``lse = +inf``.
    """
    fmt = get_format(kv_format)
    if sm_scale is None:
        sm_scale = fmt.d_qk**-0.5
    num_tokens = kv_cache.shape[0] * kv_cache.shape[1]
    valid = valid_mask(indices, num_tokens, topk_length)  # [B, K]
    gathered = gather_dequant(kv_cache, torch.where(valid, indices, 0).long(), fmt)  # [B, K, D_qk]
    scores = torch.einsum("bhd,bkd->bhk", q.float(), gathered) * sm_scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [B, H]
    empty = torch.isneginf(lse)
    p = torch.exp(scores - torch.where(empty, 0.0, lse)[..., None])
    out = torch.einsum("bhk,bkd->bhd", p, gathered[..., : fmt.d_v])
    out = out.masked_fill(empty[..., None], 0.0)
    lse = lse.masked_fill(empty, float("inf"))
    return out.to(torch.bfloat16), lse


def gather_dequant(kv_cache: torch.Tensor, idx: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """Dequantize only the cache rows at ``idx [B, K]`` (valid positions) -> ``[B, K, D_qk]`` float32."""
    num_pages, page_size, bpt = kv_cache.shape
    flat = kv_cache.view(-1)
    if fmt.name == "fp8_v32":
        rows = kv_cache.view(-1, bpt)[idx]  # [B, K, 656]
        scale = rows[..., fmt.d_nope : fmt.d_nope + 16].contiguous().view(torch.float32)  # [B, K, 4]
        rope_b = rows[..., fmt.d_nope + 16 :]
    else:
        base = (idx // page_size) * (page_size * bpt)
        off = idx % page_size
        o_data = (base + off * fmt.data_stride)[..., None]
        rows = flat[o_data + torch.arange(fmt.data_stride, device=idx.device)]  # [B, K, 576]
        o_scale = (base + page_size * fmt.data_stride + off * 8)[..., None]
        e8m0 = flat[o_scale + torch.arange(fmt.n_groups, device=idx.device)]  # [B, K, 7]
        scale = torch.exp2(e8m0.float() - 127)
        rope_b = rows[..., fmt.d_nope :]
    nope = rows[..., : fmt.d_nope].contiguous().view(torch.float8_e4m3fn).float()
    nope = (nope.unflatten(-1, (fmt.n_groups, fmt.group)) * scale[..., None]).flatten(-2)
    rope = rope_b.contiguous().view(torch.bfloat16).float()
    return torch.cat([nope, rope], dim=-1)


OUT_RTOL = 1e-2  # bf16 output: relative (Frobenius) error
LSE_ATOL = 1e-3  # fp32 lse: absolute error where finite


def compare(out, lse, ref_out, ref_lse) -> tuple[bool, float, float, str]:
    """The correctness gate: ``(ok, out_rel_err, lse_abs_err, reason)``.

    ``out``: relative error <= 1e-2 and no NaN; ``lse``: abs error <= 1e-3 where the reference is
    finite, ``+inf`` exactly where the reference is (rows with no valid token).
    """
    out, ref_out = out.float(), ref_out.float()
    if out.isnan().any() or lse.isnan().any():
        return False, float("nan"), float("nan"), "NaN in the output (an unwritten element?)"
    rel = ((out - ref_out).norm() / ref_out.norm().clamp_min(1e-30)).item()
    finite = torch.isfinite(ref_lse)
    lse_err = (lse[finite] - ref_lse[finite]).abs().max().item() if finite.any() else 0.0
    if not torch.equal(torch.isposinf(lse), ~finite):
        return False, rel, lse_err, "lse is +inf on other rows than the reference's empty rows"
    if rel > OUT_RTOL:
        return False, rel, lse_err, f"out relative error {rel:.3g} > {OUT_RTOL}"
    if lse_err > LSE_ATOL:
        return False, rel, lse_err, f"lse abs error {lse_err:.3g} > {LSE_ATOL}"
    return True, rel, lse_err, ""
