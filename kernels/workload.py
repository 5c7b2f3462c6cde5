"""Realistic random decode batches: every request owns ``context`` tokens on pages of its own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: torch is imported where a tensor is made or read
    import torch

from .kv_format import check_pair
from .kv_format import get_format
from .kv_format import quantize


@dataclass(frozen=True)
class Workload:
    """Shape of one decode attention call on one GPU (``heads`` = local heads, after TP).

    The whole call of a DeepSeek-V4 layer: ``extra`` is a second cache attended in the same softmax
    (its own format, topk, page size and context; its heads are this workload's), ``attn_sink`` a
    learned per-head sink, ``q_tokens`` the query tokens per request (s_q, with multi-token prediction).
    """

    kv_format: str
    heads: int
    topk: int
    page_size: int = 64
    context: int = 8192
    extra: Workload | None = None
    attn_sink: bool = False
    q_tokens: int = 1

    def __post_init__(self) -> None:
        get_format(self.kv_format)
        for field in ("heads", "topk", "page_size", "context", "q_tokens"):
            v = getattr(self, field)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{field} must be a positive integer, got {v!r}")
        if not isinstance(self.attn_sink, bool):
            raise ValueError(f"attn_sink must be true or false, got {self.attn_sink!r}")
        if isinstance(self.extra, dict):  # from JSON: the extra cache shares this workload's heads
            object.__setattr__(self, "extra", Workload(**{**self.extra, "heads": self.heads}))
        if self.extra is not None:
            if self.extra.extra is not None or self.extra.heads != self.heads:
                raise ValueError("the extra cache is one plain cache with the workload's heads")
            if get_format(self.extra.kv_format).d_qk != get_format(self.kv_format).d_qk:
                raise ValueError("the extra cache must have the main cache's head dim (one q serves both)")
            # (an extra-only format is a valid Workload: the extra cache is one; the call refuses it as a main)
            check_pair(self.kv_format, self.extra.kv_format)

    def caches(self) -> list[Workload]:
        """The caches the call attends: this one, then the extra one."""
        return [self] + ([self.extra] if self.extra is not None else [])

    def call(self) -> dict | None:
        """What the call adds to a plain one-cache, one-token call (None for a plain call)."""
        if self.extra is None and not self.attn_sink and self.q_tokens == 1:
            return None
        extra = self.extra
        return {
            "extra": None
            if extra is None
            else {k: getattr(extra, k) for k in ("kv_format", "topk", "page_size", "context")},
            "attn_sink": self.attn_sink,
            "q_tokens": self.q_tokens,
        }

    def kv_bytes_per_request(self) -> int:
        """Bytes the kernel must gather per request: every token's topk rows of each cache (min with context)."""
        return self.q_tokens * sum(
            min(c.topk, c.context) * get_format(c.kv_format).bytes_per_token for c in self.caches()
        )

    def min_bytes(self, batch: int) -> int:
        """Fewest bytes one call moves: gathered KV rows + q + out (bf16) + lse + indices."""
        fmt = get_format(self.kv_format)
        per_token = 2 * self.heads * (fmt.d_qk + fmt.d_v) + 4 * self.heads + 4 * sum(c.topk for c in self.caches())
        return batch * (self.kv_bytes_per_request() + self.q_tokens * per_token)


@dataclass
class DecodeBatch:
    q: torch.Tensor  # [B, H, D_qk] bf16, or [B, s_q, H, D_qk]
    kv_cache: torch.Tensor  # [num_pages, page_size, bpt] uint8
    indices: torch.Tensor  # [B, topk] int32, or [B, s_q, topk]
    topk_length: torch.Tensor | None  # [B] int32
    kv_format: str
    attn_sink: torch.Tensor | None = None  # [H] fp32
    extra_kv_cache: torch.Tensor | None = None
    extra_indices: torch.Tensor | None = None  # shaped like indices
    extra_topk_length: torch.Tensor | None = None  # [B] int32
    extra_kv_format: str | None = None

    def args(self) -> tuple:
        return (self.q, self.kv_cache, self.indices)

    def rows(self, lo: int, hi: int) -> DecodeBatch:
        """Requests ``lo:hi`` of this batch (views; the caches and the sink are shared)."""

        def cut(t):
            return None if t is None else t[lo:hi]

        return DecodeBatch(
            cut(self.q),
            self.kv_cache,
            cut(self.indices),
            cut(self.topk_length),
            self.kv_format,
            self.attn_sink,
            self.extra_kv_cache,
            cut(self.extra_indices),
            cut(self.extra_topk_length),
            self.extra_kv_format,
        )

    def kwargs(self) -> dict:
        """Keyword arguments of the call; the sink and the extra cache only when the batch has them."""
        kw = {"kv_format": self.kv_format, "topk_length": self.topk_length}
        if self.attn_sink is not None:
            kw["attn_sink"] = self.attn_sink
        if self.extra_kv_cache is not None:
            kw.update(
                extra_kv_cache=self.extra_kv_cache,
                extra_indices=self.extra_indices,
                extra_topk_length=self.extra_topk_length,
                extra_kv_format=self.extra_kv_format,
            )
        return kw


def _select(workload, batch, tokens, g, dev, invalid_fraction):
    """A cache holding ``batch`` requests' pages and ``[batch, tokens, topk]`` distinct indices per token."""
    import torch

    fmt = get_format(workload.kv_format)
    ps, ctx, topk = workload.page_size, workload.context, workload.topk
    pages_per_req = -(-ctx // ps)
    num_pages = batch * pages_per_req
    page_of = torch.randperm(num_pages, generator=g, device=dev).reshape(batch, pages_per_req)
    kv = torch.randn(num_pages * ps, fmt.d_qk, generator=g, device=dev)
    kv[:, fmt.d_nope :] *= 0.5  # rope part is not quantized; keep it in a similar range
    kv_cache = quantize(kv, workload.kv_format, ps)
    del kv
    n = min(topk, ctx)
    pos = torch.rand(batch * tokens, ctx, generator=g, device=dev).argsort(dim=1)[:, :n]  # distinct, per token
    pos = pos.reshape(batch, tokens, n)
    flat = torch.gather(page_of[:, None, :].expand(batch, tokens, pages_per_req), 2, pos // ps) * ps + pos % ps
    indices = torch.full((batch, tokens, topk), -1, dtype=torch.int32, device=dev)
    indices[..., :n] = flat.to(torch.int32)
    if invalid_fraction > 0:
        drop = torch.rand(batch, tokens, topk, generator=g, device=dev) < invalid_fraction
        indices[drop] = -1
    return kv_cache, indices


def make_batch(
    workload: Workload,
    batch: int,
    *,
    device: str | torch.device = "cpu",
    seed: int = 0,
    with_topk_length: bool = False,
    invalid_fraction: float = 0.0,
    q_tokens: int | None = None,
    extra: Workload | None = None,
    with_sink: bool | None = None,
) -> DecodeBatch:
    """B requests, each on ``ceil(context / page_size)`` randomly placed pages of one shared cache.

    ``indices[b]`` holds ``topk`` distinct positions inside request b's own tokens (``-1`` past its
    context); ``invalid_fraction`` of them are replaced by ``-1``; ``topk_length`` (if asked) is
    uniform in ``[1, topk]``. ``q_tokens`` gives the 4-D form (``q [B, s_q, H, D_qk]``, indices
    ``[B, s_q, topk]``, each token with its own selection); ``extra`` adds a second cache of that
    workload's format, topk, page size and context (heads are ``workload``'s), selected the same way;
    ``with_sink`` adds a random finite ``attn_sink [H]``. Unset, the three follow the workload's own
    call (``q_tokens`` > 1 gives the 4-D form).
    """
    import torch

    if extra is None:
        extra = workload.extra
    if with_sink is None:
        with_sink = workload.attn_sink
    if q_tokens is None and workload.q_tokens > 1:
        q_tokens = workload.q_tokens
    fmt = get_format(workload.kv_format)
    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(seed)
    tokens = q_tokens or 1
    kv_cache, indices = _select(workload, batch, tokens, g, dev, invalid_fraction)
    q = torch.randn(batch, tokens, workload.heads, fmt.d_qk, generator=g, device=dev).to(torch.bfloat16)
    topk_length = None
    if with_topk_length:
        topk_length = torch.randint(1, workload.topk + 1, (batch,), generator=g, device=dev, dtype=torch.int32)
    bt = DecodeBatch(q=q, kv_cache=kv_cache, indices=indices, topk_length=topk_length, kv_format=workload.kv_format)
    if extra is not None:
        bt.extra_kv_cache, bt.extra_indices = _select(extra, batch, tokens, g, dev, invalid_fraction)
        bt.extra_kv_format = extra.kv_format
        if with_topk_length:
            bt.extra_topk_length = torch.randint(
                1, extra.topk + 1, (batch,), generator=g, device=dev, dtype=torch.int32
            )
    if with_sink:
        bt.attn_sink = torch.randn(workload.heads, generator=g, device=dev)
    if q_tokens is None:  # the 3-D form
        bt.q, bt.indices = bt.q[:, 0], bt.indices[:, 0]
        bt.extra_indices = None if bt.extra_indices is None else bt.extra_indices[:, 0]
    return bt
