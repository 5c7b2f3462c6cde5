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


@pytest.mark.parametrize(
    "batch, config",
    [
        (1, "T16-w4-s1-c64-p2-m1"),  # 40 splits of one tile: 40 programs race for a row's last ticket
        (1, "T32-w4-s1-c16-p3-m1"),  # 10 splits of 2 tiles
        (8, "T64-w8-s1-c128-p3-m1"),  # 8 warps: 8 partials per iteration of the merge
        (40, "T32-w4-s1-c256-p3-b1-m1"),  # the balanced deal: programs of two rows
        (96, "T32-w4-s1-c512-p3-m1"),  # more programs than SMs: rows merged while others still run
    ],
)
def test_full_size_merged_layer_call_is_the_same_bits_on_every_replay(batch, config):
    """MERGE=1 where a row's programs really run at once: the layer call matches the reference, its counters are
    zero after a call, and replays of a CUDA graph of it (no memset in it: the counters reset themselves) give the
    first call's bits every time, whichever program of a row happened to finish last."""
    from sparse_mla_tuner.kernels import KernelConfig
    from sparse_mla_tuner.kernels import timing
    from sparse_mla_tuner.kernels.decode import prepare_decode

    window = Workload("fp8_model1", 16, 128, 64, 128)
    compressed = Workload("fp8_model1", 16, 512, 64, 8192)
    bt = make_batch(
        window, batch, device="cuda", seed=11, invalid_fraction=0.05, extra=compressed, with_sink=True
    )  # fmt: skip
    call = prepare_decode(*bt.args(), **bt.kwargs(), config=KernelConfig.parse(config))
    assert call.plan.counters is not None and [x.name for x in call.plan.launches] == ["split"]
    got, got_lse = call()
    torch.cuda.synchronize()
    assert not call.plan.counters.any()
    ok, rel, lse_err, reason = compare(got, got_lse, *sparse_mla_decode_ref(*bt.args(), **bt.kwargs()))
    assert ok, reason
    out, lse = call.plan.out.clone(), call.plan.lse.clone()
    graph = timing.capture(lambda i: call(), 4)
    for _ in range(20):
        call.plan.out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(call.plan.out, out) and torch.equal(call.plan.lse, lse)
        assert not call.plan.counters.any()


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
