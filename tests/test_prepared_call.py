"""A prepared call (`prepare_decode`): checked and planned once, run many times, sharing one workspace.

The tuner's measurement captures one per request set; each must compute what `sparse_mla_decode` computes."""

import pytest
import torch

import sparse_mla_tuner.kernels.decode as decode
from sparse_mla_tuner.kernels import KernelConfig
from sparse_mla_tuner.kernels import Workload
from sparse_mla_tuner.kernels import make_batch
from sparse_mla_tuner.kernels.reference import compare
from sparse_mla_tuner.kernels.reference import sparse_mla_decode_ref

SPLITS = KernelConfig(BLOCK_T=16, num_warps=4, num_stages=2, TARGET_CTAS=64)
MAIN = Workload("fp8_model1", 16, 64, page_size=64, context=300)
EXTRA = Workload("fp8_model1", 16, 40, page_size=16, context=120)


def _sets(n):
    bt = make_batch(MAIN, 2 * n, device="cpu", seed=3, invalid_fraction=0.1, extra=EXTRA, with_sink=True)
    return [bt.rows(2 * i, 2 * i + 2) for i in range(n)]


def test_prepared_calls_share_one_workspace_and_match_the_reference(monkeypatch):
    monkeypatch.setattr(decode, "POISON_OUTPUTS", True)  # an element a run does not write fails the comparison
    parts = _sets(2)
    first = decode.prepare_decode(*parts[0].args(), **parts[0].kwargs(), config=SPLITS)
    second = decode.prepare_decode(*parts[1].args(), **parts[1].kwargs(), config=SPLITS, buffers=first)
    assert second.out.data_ptr() == first.out.data_ptr()
    assert [t.data_ptr() for t in second.plan.workspace] == [t.data_ptr() for t in first.plan.workspace]
    for call, part in ((first, parts[0]), (second, parts[1]), (first, parts[0])):  # runs repeat, in any order
        out, lse = call()
        ok, _, _, reason = compare(out, lse, *sparse_mla_decode_ref(*part.args(), **part.kwargs()))
        assert ok, reason


def test_buffers_of_another_shape_or_config_are_refused():
    parts = _sets(1)
    first = decode.prepare_decode(*parts[0].args(), **parts[0].kwargs(), config=SPLITS)
    other = KernelConfig(BLOCK_T=32, num_warps=4, num_stages=2, TARGET_CTAS=64)
    with pytest.raises(ValueError, match="same shapes and config"):
        decode.prepare_decode(*parts[0].args(), **parts[0].kwargs(), config=other, buffers=first)
    bigger = make_batch(MAIN, 3, device="cpu", seed=4, extra=EXTRA, with_sink=True)
    with pytest.raises(ValueError, match="same shapes and config"):
        decode.prepare_decode(*bigger.args(), **bigger.kwargs(), config=SPLITS, buffers=first)


def test_an_empty_call_prepares_without_a_plan():
    bt = make_batch(MAIN, 1, device="cpu", seed=5)
    q = bt.args()[0][:0]
    call = decode.prepare_decode(q, *bt.args()[1:2], bt.args()[2][:0], **bt.kwargs(), config=SPLITS)
    out, lse = call()
    assert call.plan is None and out.shape[0] == 0 and lse.shape[0] == 0
    assert torch.equal(torch.tensor(out.shape[1:]), torch.tensor([16, 512]))
