"""GPU check of the vLLM plugin's V3.2/GLM-5 path, without vLLM: vLLM's call at the 15 CUDA-graph capture sizes.

    python -m sparse_mla_tuner.kernels.vllm_check [--out check.json] [--concurrency 1,2,4,8,16,24,...,96]

At each token count C, :func:`kernels.vllm_plugin.serve_v32` (what ``SparseMLASM120Impl._run_mqa_kernel`` calls) is
given the arguments vLLM's ``FLASHINFER_MLA_SPARSE_SM120`` passes: q ``[C, 16, 576]`` bf16 (DeepSeek-V3.2 at TP8), the
``fp8_ds_mla`` cache as ``[num_pages, 64, 656]`` uint8 rows, and ``[C, 2048]`` int32 global rows (-1: none), with
vLLM's softmax scale. Every call must be served (a call left to vLLM fails the check).

Checked against the fp32 reference (``kernels.reference.compare``, the project's gate) and against FlashMLA
(``flash_mla``, legacy sm_90 path, ``kv_format="V32"``, heads padded to 64, as ``kernels.bench`` calls it): relative
error at most twice the gate's. Timed as ``kernels.bench_call`` times (cold L2: one pool of ``--pool`` requests;
level C rotates over its ``pool // C`` disjoint request sets in one CUDA graph): the plugin's call (``hook_us``), the
kernel call it makes without the plugin (``direct_us``: same tensors, same config; ``hook_vs_direct`` is what the
plugin costs) and the benchmark's call of the kernel through ``kernels.flashmla_compat`` on the same sets
(``bench_us``; ``ratio`` is hook / bench). The first call warms the shape up; Triton compilations after it are
counted (``late_compiles``, which must be 0).
"""

from __future__ import annotations

import json
import sys

import torch

from . import flashmla_compat
from . import vllm_plugin
from .decode import sparse_mla_decode
from .reference import OUT_RTOL
from .reference import compare
from .reference import sparse_mla_decode_ref
from .sglang_check import _Compiles
from .sglang_check import check_args
from .sglang_check import finish
from .sglang_check import first_call
from .sglang_check import flash_mla_module
from .sglang_check import median_us
from .sglang_check import rel_err
from .sglang_check import warm_up_s
from .workload import Workload
from .workload import make_batch

HEADS, TOPK, FLASHMLA_HEADS, MIN_SETS = 16, 2048, 64, 4
SCALE = 576**-0.5
V32 = Workload("fp8_v32", HEADS, TOPK, page_size=64, context=8192)
CAPTURE = ",".join(map(str, vllm_plugin.CAPTURE_SIZES))


def _vllm_args(bt) -> tuple:
    """vLLM's ``_run_mqa_kernel`` arguments for the requests of ``bt``: 3-D q and ``[C, topk]`` rows."""
    q = bt.q.squeeze(1) if bt.q.dim() == 4 else bt.q
    idx = bt.indices.squeeze(1) if bt.indices.dim() == 3 else bt.indices
    return q, bt.kv_cache, idx


def main(argv: list[str] | None = None) -> int:
    args, levels = check_args(argv, __doc__, "vllm_check", CAPTURE)
    if levels is None:
        return 2
    flash_mla = flash_mla_module()
    compiles = _Compiles()
    rows, warm_s = [], None
    n_pool = max(args.pool, MIN_SETS * max(levels))
    pool = make_batch(V32, n_pool, device="cuda", seed=7, q_tokens=1)
    for C in levels:
        n_sets = n_pool // C
        sets = [pool.rows(i * C, (i + 1) * C) for i in range(n_sets)]
        calls = [_vllm_args(bt) for bt in sets]
        q0, kv, idx0 = calls[0]
        ref_out, ref_lse = sparse_mla_decode_ref(q0, kv, idx0, kv_format="fp8_v32", sm_scale=SCALE)
        row = {"C": C, "sets": n_sets}
        if warm_s is None:
            warm_s = warm_up_s(vllm_plugin.serve_v32, q0, kv, idx0, SCALE)

        def step_hook(i, calls=calls):
            out = vllm_plugin.serve_v32(*calls[i], SCALE)
            if out is None:
                raise RuntimeError("the plugin left a vLLM call to vLLM: the check expects every call served")
            return out

        out = first_call(step_hook, compiles)
        route = vllm_plugin._ROUTES.get(vllm_plugin._v32_signature(q0, kv, idx0))
        # vLLM takes the output only; the lse of the same kernel call (same config) completes the gate's check
        _, lse = sparse_mla_decode(q0, kv, idx0, kv_format="fp8_v32", sm_scale=SCALE, config=route.config(C))
        ok, rel, _, why = compare(out, lse, ref_out, ref_lse)
        row["hook_ok"], row["hook_rel_err"], row["config"] = ok, round(rel, 5), str(route.config(C))
        if flash_mla is not None:
            pad = torch.cat([q0, q0.new_zeros(C, FLASHMLA_HEADS - HEADS, q0.shape[2])], 1).unsqueeze(1)
            k8 = kv.unsqueeze(2).view(torch.float8_e4m3fn)
            fout, _ = flash_mla.flash_mla_with_kvcache(
                pad, k8, None, None, 512, flash_mla.get_mla_metadata()[0], softmax_scale=SCALE, is_fp8_kvcache=True,
                indices=idx0.unsqueeze(1), use_legacy=True, kv_format="V32",
            )  # fmt: skip
            rel_f = rel_err(out, fout[:, 0, :HEADS])
            row["vs_flashmla_rel_err"], row["flashmla_ok"] = round(rel_f, 5), rel_f <= 2 * OUT_RTOL
        row["hook_us"] = median_us(step_hook, n_sets, args.samples, compiles)

        def step_direct(i, calls=calls, route=route):
            return vllm_plugin._v32_launch(route, *calls[i], SCALE)

        row["direct_us"] = median_us(step_direct, n_sets, args.samples)
        row["hook_vs_direct"] = round(row["hook_us"] / row["direct_us"], 4)
        meta = flashmla_compat.get_mla_metadata()[0]

        def step_bench(i, calls=calls, meta=meta):
            q, k, idx = calls[i]
            return flashmla_compat.flash_mla_with_kvcache(
                q.unsqueeze(1), k.unsqueeze(2), None, None, 512, meta, softmax_scale=SCALE, is_fp8_kvcache=True,
                indices=idx.unsqueeze(1),
            )  # fmt: skip

        row["bench_us"] = median_us(step_bench, n_sets, args.samples)
        row["ratio"] = round(row["hook_us"] / row["bench_us"], 4)
        if not ok:
            row["why"] = why
        rows.append(row)
        print(json.dumps(row), flush=True)
        del sets, calls
        torch.cuda.empty_cache()
    return finish("vllm_check", argv, args.out, rows, compiles, warm_s, flash_mla, {"pool": n_pool})


if __name__ == "__main__":
    sys.exit(main())
