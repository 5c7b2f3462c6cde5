"""The byte order of the new formats against code we did not write: SGLang 0.5.23's own writers, on the CPU.

- ``sglang/test/kernels/deepseek_v4/dsv41_kv_quant_reference.py``: SGLang's V4.1 fp8 (``V41``) and fp4
  (``V41_FP4``) page quantizers and dequantizers, with the page padding SGLang's pool uses;
- ``sglang/kernels/ops/quantization/dsa_quant_k_cache.py``: the Triton writer of the V3.2 / no-RoPE token rows
  (``quantize_k_cache_separate`` with no rope part: ``[512 e4m3 | 4 fp32]``, arbitrary ``amax / 448`` scales), run
  under Triton's interpreter.

SGLang runs in a child process with its side folder on ``PYTHONPATH`` (``.sglang-site``, as ``.ci/run`` installs
it; ``SGLANG_SITE`` names another), so that this process never imports it; without it these tests skip.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from sparse_mla_tuner.kernels import KernelConfig
from sparse_mla_tuner.kernels import sparse_mla_decode
from sparse_mla_tuner.kernels.kv_format import dequantize
from sparse_mla_tuner.kernels.kv_format import quantize
from sparse_mla_tuner.kernels.reference import compare
from sparse_mla_tuner.kernels.reference import sparse_mla_decode_ref

ROOT = Path(__file__).resolve().parent.parent
SITE = Path(os.environ.get("SGLANG_SITE", ROOT / ".sglang-site"))

pytestmark = pytest.mark.skipif(not (SITE / "sglang").is_dir(), reason=f"SGLang 0.5.23 is not installed in {SITE}")

CHILD = textwrap.dedent(
    """
    import sys
    import torch
    from sglang.kernels.ops.quantization.dsa_quant_k_cache import quantize_k_cache_separate
    from sglang.test.kernels.deepseek_v4 import dsv41_kv_quant_reference as ref

    g = torch.Generator().manual_seed(0)
    k = (torch.randn(3, 6, 512, generator=g) * torch.logspace(-1, 1, 18).reshape(3, 6, 1)).bfloat16().float()
    # no-RoPE rows: e4m3 values with a non-zero mantissa times a 4-bit scale, so the input is exact in bf16, each
    # group's amax is 448 x its scale (scale = amax / 448 exactly) and x / scale lands on its e4m3 value; no
    # value needs rounding past a power of two, which Triton's interpreter gets wrong (31.4 -> 16 for 32)
    grid = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
    grid = grid[(torch.arange(256) & 7 != 0) & grid.isfinite()]
    v = grid[torch.randint(0, grid.numel(), (18, 4, 128), generator=g)]
    v[:, :, 0] = 448.0 * torch.where(torch.rand(18, 4, generator=g) < 0.5, -1.0, 1.0)
    s = torch.randint(9, 16, (18, 4, 1), generator=g) / 8 * torch.exp2(-torch.randint(4, 12, (18, 4, 1), generator=g))
    nope_k = (v * s).reshape(18, 512)
    assert torch.equal(nope_k.bfloat16().float(), nope_k)
    nope, rope = quantize_k_cache_separate(nope_k.bfloat16(), None)
    torch.save(
        {
            "k": k,
            "v41": ref.quantize_k_cache_v41(k),
            "v41_back": ref.dequantize_k_cache_v41(ref.quantize_k_cache_v41(k), 6),
            "fp4": ref.quantize_k_cache_v41_fp4(k),
            "fp4_back": ref.dequantize_k_cache_v41_fp4(ref.quantize_k_cache_v41_fp4(k), 6),
            "nope_k": nope_k,
            "nope": nope,
            "rope": rope,
        },
        sys.argv[1],
    )
    """
)


@pytest.fixture(scope="module")
def sglang_caches(tmp_path_factory):
    out = tmp_path_factory.mktemp("sglang") / "caches.pt"
    env = {**os.environ, "PYTHONPATH": str(SITE), "TRITON_INTERPRET": "1"}
    subprocess.run([sys.executable, "-c", CHILD, str(out)], env=env, check=True, cwd=out.parent, timeout=600)
    return torch.load(out)


def _paged(pages: torch.Tensor, page_size: int, bpt: int) -> torch.Tensor:
    """SGLang's ``[num_pages, page_bytes]`` (padded) pages as our ``[num_pages, page_size, bpt]`` view, in place."""
    return pages.as_strided((pages.shape[0], page_size, bpt), (pages.stride(0), bpt, 1))


@pytest.mark.parametrize("kv_format, key, bpt", [("fp8_v41", "v41", 528), ("fp4_v41", "fp4", 288)])
def test_v41_pages_are_byte_identical_to_sglang_s(sglang_caches, kv_format, key, bpt):
    k, theirs = sglang_caches["k"], sglang_caches[key]
    # page_size 6: SGLang pads a page to whole 512 (fp8) or 256 (fp4) bytes: 3168 -> 3584, 1728 -> 1792
    assert theirs.shape == (3, {"v41": 3584, "fp4": 1792}[key])
    ours = quantize(k.reshape(18, 512), kv_format, page_size=6)
    assert torch.equal(ours.reshape(3, -1), theirs[:, : 6 * bpt])
    back = dequantize(_paged(theirs, 6, bpt), kv_format)  # our reader on their padded pages
    assert torch.equal(back.reshape(3, 6, 512).bfloat16(), sglang_caches[f"{key}_back"])


def test_the_kernel_reads_sglang_s_v41_layer(sglang_caches, device):
    """One V4.1 layer call on SGLang's own padded pages: the fp8 window and the fp4 compressed cache."""
    g = torch.Generator().manual_seed(1)
    window = _paged(sglang_caches["v41"].to(device), 6, 528)
    compressed = _paged(sglang_caches["fp4"].to(device), 6, 288)
    q = torch.randn(2, 16, 512, generator=g).bfloat16().to(device)
    idx = torch.randint(-1, 18, (2, 20), generator=g, dtype=torch.int32).to(device)
    x_idx = torch.randint(-1, 18, (2, 40), generator=g, dtype=torch.int32).to(device)
    sink = torch.randn(16, generator=g).to(device)
    kw = dict(kv_format="fp8_v41", attn_sink=sink, extra_kv_cache=compressed, extra_indices=x_idx)
    kw["extra_kv_format"] = "fp4_v41"
    cfg = KernelConfig(BLOCK_T=16, num_warps=4, num_stages=1, TARGET_CTAS=8, PREFETCH=1)
    ok, _, _, reason = compare(
        *sparse_mla_decode(q, window, idx, **kw, config=cfg), *sparse_mla_decode_ref(q, window, idx, **kw)
    )
    assert ok, reason


def test_sglang_s_no_rope_rows_decode_to_their_input(sglang_caches, device):
    """SGLang's writer stores arbitrary fp32 scales (amax / 448): on inputs its e4m3 rounding leaves exact, our
    reader gives the input back bit for bit, and the kernel reads the rows where they are."""
    k, rows = sglang_caches["nope_k"], sglang_caches["nope"]
    assert rows.shape == (18, 1, 528) and sglang_caches["rope"].numel() == 0
    cache = rows.reshape(3, 6, 528)
    scales = cache[..., 512:].contiguous().view(torch.float32)
    assert (torch.log2(scales) != torch.log2(scales).round()).any()  # not only powers of two
    assert torch.equal(dequantize(cache, "fp8_v32_nope"), k)
    g = torch.Generator().manual_seed(2)
    cache = cache.to(device)
    q = torch.randn(3, 2, 16, 512, generator=g).bfloat16().to(device)
    idx = torch.randint(-1, 18, (3, 2, 30), generator=g, dtype=torch.int32).to(device)
    cfg = KernelConfig(BLOCK_T=16, num_warps=4, num_stages=2, TARGET_CTAS=4)
    out, lse = sparse_mla_decode(q, cache, idx, kv_format="fp8_v32_nope", config=cfg)
    ok, _, _, reason = compare(out, lse, *sparse_mla_decode_ref(q, cache, idx, kv_format="fp8_v32_nope"))
    assert ok, reason
