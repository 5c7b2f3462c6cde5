"""GPU-only checks (skipped without CUDA): full-size correctness and the exported autotune table."""

import pytest
import torch

from sparse_mla_tuner.kernels import Workload
from sparse_mla_tuner.kernels import make_batch
from sparse_mla_tuner.kernels import sparse_mla_decode
from sparse_mla_tuner.kernels.config import DEFAULT_CONFIG
from sparse_mla_tuner.kernels.decode import device_name
from sparse_mla_tuner.kernels.reference import compare
from sparse_mla_tuner.kernels.reference import sparse_mla_decode_ref
from sparse_mla_tuner.kernels.table import lookup_config

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("fmt, topk", [("fp8_model1", 512), ("fp8_v32", 2048)])
@pytest.mark.parametrize("batch", [1, 96])
def test_full_size_matches_reference(fmt, topk, batch):
    bt = make_batch(Workload(fmt, 16, topk, 64, 8192), batch, device="cuda", seed=7, invalid_fraction=0.05)
    out, lse = sparse_mla_decode(*bt.args(), kv_format=fmt)
    ok, rel, lse_err, reason = compare(out, lse, *sparse_mla_decode_ref(*bt.args(), kv_format=fmt))
    assert ok, reason


@pytest.mark.parametrize("batch, q_tokens", [(1, 1), (24, 2), (96, 1)])
def test_full_size_layer_call_matches_reference(batch, q_tokens):
    """The V4 layer call (window + compressed cache + sink, one split launch) with the exported table, at full size;
    FlashMLA's output is compared in tests/test_flashmla_gpu.py where it imports."""
    window = Workload("fp8_model1", 16, 128, 64, 128)
    compressed = Workload("fp8_model1", 16, 512, 64, 8192)
    bt = make_batch(
        window, batch, device="cuda", seed=5, invalid_fraction=0.05, q_tokens=q_tokens, extra=compressed,
        with_sink=True, with_topk_length=True,
    )  # fmt: skip
    out, lse = sparse_mla_decode(*bt.args(), **bt.kwargs())
    ok, rel, lse_err, reason = compare(out, lse, *sparse_mla_decode_ref(*bt.args(), **bt.kwargs()))
    assert ok, reason


def test_config_none_uses_the_exported_table_on_this_gpu(monkeypatch):
    monkeypatch.delenv("SPARSE_MLA_CONFIG_DIR", raising=False)  # the package's own tables
    name = device_name(torch.device("cuda"))
    cfg = lookup_config(name, "fp8_model1", 16, 512, 96)
    if name != "NVIDIA H200":
        pytest.skip(f"no exported table for {name}")
    assert cfg != DEFAULT_CONFIG


@pytest.mark.parametrize(
    "rule",
    [{}, {"COMBINE_TILE_MAX_ROWS": 0, "COMBINE_UNROLL_MAX_ROWS": 0}, {"COMBINE_TILE_MIN_SPLITS": 2}],
    ids=["default", "one-split-per-iteration", "tile-from-2-splits"],
)
@pytest.mark.parametrize("config", ["T64-w8-s1-c256-p1", "T32-w4-s1-c256-p3"])  # 32 and 64 splits of V3.2
@pytest.mark.parametrize("fmt, topk", [("fp8_model1", 512), ("fp8_v32", 2048)])
@pytest.mark.parametrize("batch", [1, 4])
def test_every_combine_shape_matches_reference_at_full_size(fmt, topk, batch, config, rule, monkeypatch):
    from sparse_mla_tuner.kernels import decode
    from sparse_mla_tuner.kernels.config import KernelConfig

    monkeypatch.setattr(decode, "POISON_OUTPUTS", True)
    for name, value in rule.items():
        monkeypatch.setattr(decode, name, value)
    bt = make_batch(Workload(fmt, 16, topk, 64, 8192), batch, device="cuda", seed=3, invalid_fraction=0.05)
    out, lse = sparse_mla_decode(*bt.args(), kv_format=fmt, config=KernelConfig.parse(config))
    ok, rel, lse_err, reason = compare(out, lse, *sparse_mla_decode_ref(*bt.args(), kv_format=fmt))
    assert ok, reason


@pytest.mark.parametrize("sms", [0, 1 << 30], ids=["late-trigger", "early-trigger"])
@pytest.mark.parametrize("fmt, topk", [("fp8_model1", 512), ("fp8_v32", 2048)])
@pytest.mark.parametrize("batch", [1, 48])
def test_both_triggers_of_the_split_kernel_match_reference(fmt, topk, batch, sms, monkeypatch):
    """The combine launched early (waiting on the split's stores) or only as the split ends: same results."""
    from sparse_mla_tuner.kernels import decode

    monkeypatch.setattr(decode, "POISON_OUTPUTS", True)
    monkeypatch.setattr(decode, "sm_count", lambda device: sms)
    bt = make_batch(Workload(fmt, 16, topk, 64, 8192), batch, device="cuda", seed=5, invalid_fraction=0.05)
    out, lse = sparse_mla_decode(*bt.args(), kv_format=fmt)
    ok, rel, lse_err, reason = compare(out, lse, *sparse_mla_decode_ref(*bt.args(), kv_format=fmt))
    assert ok, reason
