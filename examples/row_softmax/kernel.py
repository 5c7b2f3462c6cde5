"""A row softmax in Triton: the kernel, its launcher and its pure-torch reference.

One program per row walks the row in blocks of ``BLOCK_N`` columns twice: an online max and sum first,
then the normalized output. ``BLOCK_N`` wider than the row is clamped to the row's next power of two, so
configs that differ only above it launch the same binary.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _row_softmax_kernel(x_ptr, y_ptr, n_cols, stride, BLOCK_N: tl.constexpr):
    i_row = tl.program_id(0).to(tl.int64)
    p_x = x_ptr + i_row * stride
    p_y = y_ptr + i_row * stride
    b_max = tl.full([BLOCK_N], float("-inf"), tl.float32)  # [BLOCK_N]
    b_sum = tl.zeros([BLOCK_N], tl.float32)  # [BLOCK_N]
    for start in range(0, n_cols, BLOCK_N):
        o_col = start + tl.arange(0, BLOCK_N)
        m_col = o_col < n_cols
        b_x = tl.load(p_x + o_col, mask=m_col, other=float("-inf")).to(tl.float32)
        b_new = tl.maximum(b_max, b_x)
        # a lane that has seen only masked columns keeps max -inf and sum 0 (exp(-inf - 0) = 0, no inf - inf)
        b_ref = tl.where(b_new == float("-inf"), 0.0, b_new)
        b_sum = b_sum * tl.exp(b_max - b_ref) + tl.exp(b_x - b_ref)
        b_max = b_new
    row_max = tl.max(b_max, axis=0)
    row_sum = tl.sum(b_sum * tl.exp(b_max - row_max), axis=0)
    for start in range(0, n_cols, BLOCK_N):
        o_col = start + tl.arange(0, BLOCK_N)
        m_col = o_col < n_cols
        b_x = tl.load(p_x + o_col, mask=m_col, other=float("-inf")).to(tl.float32)
        b_y = tl.exp(b_x - row_max) / row_sum
        tl.store(p_y + o_col, b_y.to(y_ptr.dtype.element_ty), mask=m_col)


def block_for(block_n: int, n_cols: int) -> int:
    """The block a launch uses: ``BLOCK_N``, at most the row's next power of two (at least 16)."""
    return min(block_n, max(16, triton.next_power_of_2(n_cols)))


def row_softmax(x: torch.Tensor, block_n: int = 256, num_warps: int = 4) -> torch.Tensor:
    """``softmax(x, dim=-1)`` of ``x: [rows, cols]`` (fp16 or fp32, rows contiguous); the output has x's dtype."""
    assert x.dim() == 2 and x.stride(1) == 1, "x must be [rows, cols] with contiguous rows"
    y = torch.empty_like(x)
    rows, cols = x.shape
    _row_softmax_kernel[(rows,)](x, y, cols, x.stride(0), BLOCK_N=block_for(block_n, cols), num_warps=num_warps)
    return y


def row_softmax_ref(x: torch.Tensor) -> torch.Tensor:
    """The ground truth: torch's softmax in fp32, cast back to x's dtype."""
    return torch.softmax(x.float(), dim=-1).to(x.dtype)
