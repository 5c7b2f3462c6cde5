"""GPU check of the SGLang plugin's DeepSeek-V3.2 / GLM-5 hook, without SGLang, at the 15 CUDA-graph capture sizes.

    python -m sparse_mla_tuner.kernels.sglang_check_v32 [--out check.json] [--heads 16] [--concurrency 1,2,...,96]

At each batch size C, :func:`kernels.sglang_plugin.sglang_v32_hook` is called with the keyword arguments SGLang's
DSA backend passes to ``flashinfer_sparse_mla_forward`` on sm_120 (``_forward_flashinfer_sparse_mla``): q
``[C, 16, 576]`` bf16 (V3.2 at TP8, GLM-5 at TP4), the 656-byte cache as SGLang's pool buffer ``[tokens, 1, 656]``
float8_e4m3fn with ``page_size`` 64, token indices ``[C, 2048]`` and ``seq_lens`` (SGLang's ``dsa_cache_seqlens``:
the context clamped to the top-k, 2048 here). The original function is a stub that fails: every call must be
served by the kernel.

Checked against the fp32 reference (``kernels.reference``, the project's gate tolerance on the output) and against
FlashMLA (``flash_mla``, legacy sm_90 path, ``kv_format="V32"``, heads padded to 64; as ``kernels.bench`` calls it):
relative error at most twice the gate's. Timed as ``kernels.bench_call`` times (cold L2: one pool of ``--pool``
requests; level C rotates over its ``pool // C`` disjoint request sets in one CUDA graph): the hook; the kernel call
the hook makes without it (``direct_us``, so ``hook_vs_direct`` is the wrapper's cost); and the layer-call
benchmark's call at the same level, ``kernels.flashmla_compat.flash_mla_with_kvcache`` on the same cache and sets
(``layer_call_us``; ``ratio`` = hook / layer call, the 5 % bar of the V4 hook). The first eager call warms the
shape up; the check counts Triton compilations after it (``late_compiles``, must be 0).
"""

from __future__ import annotations

import json
import sys

import torch

from . import flashmla_compat
from . import sglang_plugin
from .reference import OUT_RTOL
from .reference import sparse_mla_decode_ref
from .sglang_check import CAPTURE
from .sglang_check import _Compiles
from .sglang_check import _left
from .sglang_check import check_args
from .sglang_check import finish
from .sglang_check import first_call
from .sglang_check import flash_mla_module
from .sglang_check import median_us
from .sglang_check import rel_err
from .sglang_check import warm_up_s
from .workload import Workload
from .workload import make_batch

TOPK, FLASHMLA_HEADS, MIN_SETS, SCALE = 2048, 64, 4, 576**-0.5


def main(argv: list[str] | None = None) -> int:
    args, levels = check_args(argv, __doc__, "sglang_check_v32", CAPTURE, heads=True)
    if levels is None:
        return 2
    flash_mla = flash_mla_module()
    H = args.heads
    compiles = _Compiles()
    rows, warm_s = [], None
    n_pool = max(args.pool, MIN_SETS * max(levels))
    pool = make_batch(Workload("fp8_v32", H, TOPK, page_size=64, context=8192), n_pool, device="cuda", seed=7)
    k_flash = pool.kv_cache.unsqueeze(2).view(torch.float8_e4m3fn)  # FlashMLA's [pages, 64, 1, 656]
    for C in levels:
        n_sets = n_pool // C
        sets = [pool.rows(i * C, (i + 1) * C) for i in range(n_sets)]
        seq = torch.full((C,), TOPK, dtype=torch.int32, device="cuda")
        engine = [sglang_plugin.v32_engine_call(bt.q, pool.kv_cache, bt.indices, seq, sm_scale=SCALE) for bt in sets]
        ref_out, _ = sparse_mla_decode_ref(*sets[0].args(), **sets[0].kwargs(), sm_scale=SCALE)
        row = {"C": C, "sets": n_sets}
        if warm_s is None:
            warm_s = warm_up_s(sglang_plugin.sglang_v32_hook, _left, **engine[0])

        def step_hook(i, engine=engine):
            return sglang_plugin.sglang_v32_hook(_left, **engine[i])

        out = first_call(step_hook, compiles)
        row["hook_rel_err"] = round(rel_err(out, ref_out), 5)
        row["hook_ok"] = row["hook_rel_err"] <= OUT_RTOL
        if flash_mla is not None:
            q = sets[0].q
            qp = torch.cat([q, q.new_zeros(C, FLASHMLA_HEADS - H, q.shape[2])], 1).unsqueeze(1)
            fout, _ = flash_mla.flash_mla_with_kvcache(
                qp, k_flash, None, None, 512, flash_mla.get_mla_metadata()[0], softmax_scale=SCALE,
                is_fp8_kvcache=True, indices=sets[0].indices.unsqueeze(1), use_legacy=True, kv_format="V32",
            )  # fmt: skip
            row["vs_flashmla_rel_err"] = round(rel_err(out, fout[:, 0, :H]), 5)
            row["flashmla_ok"] = row["vs_flashmla_rel_err"] <= 2 * OUT_RTOL
        row["hook_us"] = median_us(step_hook, n_sets, args.samples, compiles)
        route = sglang_plugin._ROUTES.get(sglang_plugin._v32_signature(engine[0]))

        def step_direct(i, engine=engine, route=route):
            return sglang_plugin._v32_serve(route, engine[i])

        row["direct_us"] = median_us(step_direct, n_sets, args.samples)
        row["hook_vs_direct"] = round(row["hook_us"] / row["direct_us"], 4)
        meta = flashmla_compat.get_mla_metadata()[0]
        layer = [(bt.q.unsqueeze(1), bt.indices.unsqueeze(1)) for bt in sets]

        def step_layer(i, layer=layer, meta=meta, seq=seq):
            q, idx = layer[i]
            return flashmla_compat.flash_mla_with_kvcache(
                q, k_flash, None, None, 512, meta, softmax_scale=SCALE, is_fp8_kvcache=True, indices=idx,
                topk_length=seq,
            )  # fmt: skip

        row["layer_call_us"] = median_us(step_layer, n_sets, args.samples)
        row["ratio"] = round(row["hook_us"] / row["layer_call_us"], 4)
        rows.append(row)
        print(json.dumps(row), flush=True)
        del sets, engine, layer
        torch.cuda.empty_cache()
    return finish("sglang_check_v32", argv, args.out, rows, compiles, warm_s, flash_mla, {"heads": H, "pool": n_pool})


if __name__ == "__main__":
    sys.exit(main())
