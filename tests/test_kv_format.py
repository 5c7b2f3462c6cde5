import pytest
import torch

from sparse_mla_tuner.kernels.kv_format import FORMATS
from sparse_mla_tuner.kernels.kv_format import dequantize
from sparse_mla_tuner.kernels.kv_format import get_format
from sparse_mla_tuner.kernels.kv_format import quantize


@pytest.mark.parametrize("kv_format", sorted(name for name, fmt in FORMATS.items() if fmt.element == "e4m3"))
def test_round_trip_within_e4m3_precision(kv_format):  # fp4_v41's: tests/test_formats.py
    fmt = get_format(kv_format)
    g = torch.Generator().manual_seed(0)
    kv = torch.randn(130, fmt.d_qk, generator=g) * torch.logspace(-3, 2, 130)[:, None]
    cache = quantize(kv, kv_format, page_size=64)
    assert cache.shape == (3, 64, fmt.bytes_per_token) and cache.dtype == torch.uint8
    back = dequantize(cache, kv_format)[:130]
    nope, nope_back = kv[:, : fmt.d_nope], back[:, : fmt.d_nope]
    # e4m3 keeps 3 mantissa bits: relative error <= 2^-4, plus half a subnormal step (2^-10 * scale)
    scale = nope.abs().reshape(130, fmt.n_groups, fmt.group).amax(-1, keepdim=True) / 448
    step = (2.0 ** torch.ceil(torch.log2(scale.clamp_min(1e-4))) * 2.0**-10).expand(-1, -1, fmt.group).reshape(130, -1)
    assert ((nope_back - nope).abs() <= nope.abs() * 2.0**-4 + step).all()
    rope_err = (back[:, fmt.d_nope :] - kv[:, fmt.d_nope :]).abs()
    assert (rope_err <= kv[:, fmt.d_nope :].abs() * 2.0**-8).all()  # bf16


def test_model1_token_bytes_at_documented_offsets():
    page_size = 4
    kv = torch.zeros(8, 512)
    t = 6  # page 1, offset 2
    kv[t, 0] = 1.0  # nope group 0: amax 1 -> scale 2^ceil(log2(1/448)) = 2^-8
    kv[t, 64] = 448.0  # nope group 1: scale 1
    kv[t, 448] = 3.0  # first rope value (bf16)
    cache = quantize(kv, "fp8_model1", page_size).view(-1)
    page = 1 * page_size * 584
    data = page + 2 * 576
    assert cache[data].item() == torch.tensor(256.0).to(torch.float8_e4m3fn).view(torch.uint8).item()
    assert cache[data + 64].item() == torch.tensor(448.0).to(torch.float8_e4m3fn).view(torch.uint8).item()
    rope = cache[data + 448 : data + 450].view(torch.bfloat16)
    assert rope.item() == 3.0
    scale_row = page + page_size * 576 + 2 * 8
    assert cache[scale_row].item() == 127 - 8  # ue8m0 of 2^-8
    assert cache[scale_row + 1].item() == 127
    assert cache[scale_row + 7].item() == 0  # pad byte


def test_v32_token_bytes_at_documented_offsets():
    kv = torch.zeros(4, 576)
    kv[3, 130] = -448.0  # group 1, scale 1
    kv[3, 512] = -2.5  # rope
    cache = quantize(kv, "fp8_v32", page_size=2).view(-1)
    tok = 3 * 656
    assert cache[tok + 130].item() == torch.tensor(-448.0).to(torch.float8_e4m3fn).view(torch.uint8).item()
    scales = cache[tok + 512 : tok + 528].view(torch.float32)
    assert scales[1].item() == 1.0
    assert cache[tok + 528 : tok + 530].view(torch.bfloat16).item() == -2.5


def test_unknown_format_names_the_allowed_ones():
    with pytest.raises(ValueError, match="fp8_model1.*fp8_v32"):
        get_format("fp8_v4")
