"""Realistic random decode batches: every request owns ``context`` tokens on pages of its own."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.kv_format import get_format
from kernels.kv_format import quantize


@dataclass(frozen=True)
class Workload:
    """Shape of one decode attention call on one GPU (``heads`` = local heads, after TP)."""

    kv_format: str
    heads: int
    topk: int
    page_size: int = 64
    context: int = 8192

    def __post_init__(self) -> None:
        get_format(self.kv_format)
        for field in ("heads", "topk", "page_size", "context"):
            v = getattr(self, field)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{field} must be a positive integer, got {v!r}")

    def kv_bytes_per_request(self) -> int:
        """Bytes the kernel must gather per request: topk cache rows (min with context)."""
        return min(self.topk, self.context) * get_format(self.kv_format).bytes_per_token

    def min_bytes(self, batch: int) -> int:
        """Fewest bytes one call moves: gathered KV rows + q + out (bf16) + lse + indices."""
        fmt = get_format(self.kv_format)
        per_req = self.kv_bytes_per_request() + 2 * self.heads * (fmt.d_qk + fmt.d_v) + 4 * self.heads + 4 * self.topk
        return batch * per_req


@dataclass
class DecodeBatch:
    q: torch.Tensor  # [B, H, D_qk] bf16
    kv_cache: torch.Tensor  # [num_pages, page_size, bpt] uint8
    indices: torch.Tensor  # [B, topk] int32
    topk_length: torch.Tensor | None  # [B] int32
    kv_format: str

    def args(self) -> tuple:
        return (self.q, self.kv_cache, self.indices)

    def kwargs(self) -> dict:
        return {"kv_format": self.kv_format, "topk_length": self.topk_length}


def make_batch(
    workload: Workload,
    batch: int,
    *,
    device: str | torch.device = "cpu",
    seed: int = 0,
    with_topk_length: bool = False,
    invalid_fraction: float = 0.0,
) -> DecodeBatch:
    """B requests, each on ``ceil(context / page_size)`` randomly placed pages of one shared cache.

    ``indices[b]`` holds ``topk`` distinct positions inside request b's own tokens (``-1`` past its
    context); ``invalid_fraction`` of them are replaced by ``-1``; ``topk_length`` (if asked) is
    uniform in ``[1, topk]``.
    """
    fmt = get_format(workload.kv_format)
    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(seed)
    ps, ctx, topk = workload.page_size, workload.context, workload.topk
    pages_per_req = -(-ctx // ps)
    num_pages = batch * pages_per_req
    page_of = torch.randperm(num_pages, generator=g, device=dev).reshape(batch, pages_per_req)
    kv = torch.randn(num_pages * ps, fmt.d_qk, generator=g, device=dev)
    kv[:, fmt.d_nope :] *= 0.5  # rope part is not quantized; keep it in a similar range
    kv_cache = quantize(kv, workload.kv_format, ps)
    del kv
    n = min(topk, ctx)
    pos = torch.rand(batch, ctx, generator=g, device=dev).argsort(dim=1)[:, :n]  # distinct, per request
    flat = torch.gather(page_of, 1, pos // ps) * ps + pos % ps
    indices = torch.full((batch, topk), -1, dtype=torch.int32, device=dev)
    indices[:, :n] = flat.to(torch.int32)
    if invalid_fraction > 0:
        drop = torch.rand(batch, topk, generator=g, device=dev) < invalid_fraction
        indices[drop] = -1
    q = torch.randn(batch, workload.heads, fmt.d_qk, generator=g, device=dev).to(torch.bfloat16)
    topk_length = None
    if with_topk_length:
        topk_length = torch.randint(1, topk + 1, (batch,), generator=g, device=dev, dtype=torch.int32)
    return DecodeBatch(q=q, kv_cache=kv_cache, indices=indices, topk_length=topk_length, kv_format=workload.kv_format)
