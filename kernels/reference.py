"""Pure-torch ground truth for sparse MLA decode (FlashMLA ``tests/ref.py::ref_sparse_attn_decode``).

Same signature as :func:`kernels.sparse_mla_decode`, fp32 math on the dequantized cache.
"""

from __future__ import annotations

import torch

from .kv_format import KVFormat
from .kv_format import decode_rows
from .kv_format import gather_rows
from .kv_format import get_format


def valid_mask(indices: torch.Tensor, num_tokens: int, topk_length: torch.Tensor | None) -> torch.Tensor:
    """``[B, ..., topk]`` bool: index in ``[0, num_tokens)`` and position before ``topk_length[b]``."""
    valid = (indices >= 0) & (indices < num_tokens)
    if topk_length is not None:
        pos = torch.arange(indices.shape[-1], device=indices.device)
        lengths = topk_length.to(indices.device).long().view(-1, *([1] * (indices.dim() - 1)))
        valid &= pos < lengths
    return valid


def sparse_mla_decode_ref(
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
    config=None,  # accepted for signature parity; the reference has no tunables
) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [B, H, D_qk] or [B, s_q, H, D_qk] bf16; kv_cache: [num_pages, page_size, bpt] uint8;
    indices: [B, topk] (or [B, s_q, topk]) int32; the extra cache likewise.

    The tokens selected in both caches form one softmax: ``lse = logsumexp`` over all valid scores,
    ``out = softmax @ V``, then ``out *= exp(lse) / (exp(lse) + exp(sink[h]))`` (lse unchanged).
    Returns ``out [B, H, D_v]`` bf16 and ``lse [B, H]`` fp32 for a 3-D q, ``out [B, s_q, H, D_v]`` and
    ``lse [B, H, s_q]`` for a 4-D q (natural log); rows with no valid index in either cache give
    ``out = 0`` and ``lse = +inf``, whatever the sink.
    """
    fmt = get_format(kv_format)
    if sm_scale is None:
        sm_scale = fmt.d_qk**-0.5
    squeeze = q.dim() == 3
    if squeeze:
        q, indices = q[:, None], indices[:, None]
        extra_indices = None if extra_indices is None else extra_indices[:, None]
    selections = [(kv_cache, indices, topk_length, fmt)]
    if extra_kv_cache is not None:
        efmt = get_format(extra_kv_format or kv_format)
        if efmt.d_qk != fmt.d_qk:
            raise ValueError(f"the extra cache's format {efmt.name} does not share D_qk with {fmt.name}")
        selections.append((extra_kv_cache, extra_indices, extra_topk_length, efmt))
    keys, valids = [], []
    for cache, idx, lengths, f in selections:
        valid = valid_mask(idx, cache.shape[0] * cache.shape[1], lengths)  # [B, S, K]
        keys.append(gather_dequant(cache, torch.where(valid, idx, 0).long(), f))  # [B, S, K, D_qk]
        valids.append(valid)
    gathered, valid = torch.cat(keys, dim=2), torch.cat(valids, dim=2)
    scores = torch.einsum("bshd,bskd->bshk", q.float(), gathered) * sm_scale
    scores = scores.masked_fill(~valid[:, :, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [B, S, H]
    empty = torch.isneginf(lse)
    p = torch.exp(scores - torch.where(empty, 0.0, lse)[..., None])
    out = torch.einsum("bshk,bskd->bshd", p, gathered[..., : fmt.d_v])
    if attn_sink is not None:
        out = out * torch.sigmoid(lse - attn_sink.float())[..., None]  # = exp(lse) / (exp(lse) + exp(sink))
    out = out.masked_fill(empty[..., None], 0.0)
    lse = lse.masked_fill(empty, float("inf")).transpose(1, 2).contiguous()  # [B, H, S]
    out = out.to(torch.bfloat16)
    if squeeze:
        return out[:, 0], lse[:, :, 0]
    return out, lse


def gather_dequant(kv_cache: torch.Tensor, idx: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """Dequantize only the cache rows at ``idx [..., K]`` (valid positions) -> ``[..., K, D_qk]`` float32."""
    if fmt.d_rope == 0:  # fp8_v32_nope, fp8_v41, fp4_v41: every dim quantized
        return decode_rows(*gather_rows(kv_cache, idx, fmt), fmt)
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
