"""GPU benchmark of the whole DeepSeek-V4-Flash decode attention call against FlashMLA's same call.

    python -m kernels.bench_call [--concurrency 1,2,4,8,16,32,48,64,80,96] [--out results.json]

The call of one V4-Flash layer at TP4 (16 local heads): a sliding-window cache (topk 128 of a 128-token
window) and the compressed cache (topk 512 of 8192 tokens) in one softmax, with a learned per-head
attention sink, one query token per request. Both caches are ``fp8_model1`` (FlashMLA's "V4"), pages of
64 tokens. Ours runs through ``kernels.flashmla_compat`` with 16 heads and the config exported for the
compressed cache (``config=None``); FlashMLA (``flash_mla``, legacy sm_90 path) needs 64 or 128 heads,
so its q and sink are padded to 64 heads, as an engine at TP4 would have to. Times are µs per call, from
CUDA-graph replays over 4 rotating input sets; both outputs are checked against the fp32 reference.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from kernels import flashmla_compat
from kernels import timing
from kernels.reference import compare
from kernels.reference import sparse_mla_decode_ref
from kernels.workload import Workload
from kernels.workload import make_batch

HEADS, FLASHMLA_HEADS, SETS = 16, 64, 4
WINDOW = Workload("fp8_model1", HEADS, 128, page_size=64, context=128)
COMPRESSED = Workload("fp8_model1", HEADS, 512, page_size=64, context=8192)


def _args(bt, heads: int) -> tuple[tuple, dict]:
    """FlashMLA-style arguments of one batch, q and sink padded to ``heads``."""
    q, sink = bt.q, bt.attn_sink
    if heads > q.shape[2]:
        pad = heads - q.shape[2]
        q = torch.cat([q, q.new_zeros(*q.shape[:2], pad, q.shape[3])], dim=2)
        sink = torch.cat([sink, sink.new_zeros(pad)])
    k = bt.kv_cache.unsqueeze(2).view(torch.float8_e4m3fn)
    ek = bt.extra_kv_cache.unsqueeze(2).view(torch.float8_e4m3fn)
    kw = {
        "softmax_scale": 512**-0.5,
        "is_fp8_kvcache": True,
        "indices": bt.indices,
        "attn_sink": sink,
        "extra_k_cache": ek,
        "extra_indices_in_kvcache": bt.extra_indices,
    }
    return (q, k, None, None, 512), kw


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", default="1,2,4,8,16,32,48,64,80,96")
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("kernels.bench_call needs a CUDA GPU", file=sys.stderr)
        return 2
    try:
        import flash_mla
    except ImportError:
        flash_mla = None
    rows = []
    for C in [int(c) for c in args.concurrency.split(",")]:
        sets = [
            make_batch(WINDOW, C, device="cuda", seed=s, q_tokens=1, extra=COMPRESSED, with_sink=True)
            for s in range(SETS)
        ]
        ref_out, ref_lse = sparse_mla_decode_ref(*sets[0].args(), **sets[0].kwargs(), sm_scale=512**-0.5)
        row = {"C": C}
        meta = flashmla_compat.get_mla_metadata()[0]
        ours = [_args(bt, HEADS) for bt in sets]

        def step_ours(i, ours=ours, meta=meta):
            a, kw = ours[i]
            return flashmla_compat.flash_mla_with_kvcache(*a, meta, **kw)

        out, lse = step_ours(0)
        row["ours_ok"] = compare(out, lse, ref_out, ref_lse)[0]
        sample = timing.sampler(timing.capture(step_ours, SETS), SETS, 5.0)
        row["ours_us"] = statistics.median(sample()[0] for _ in range(args.samples))
        if flash_mla is not None:
            theirs = [_args(bt, FLASHMLA_HEADS) for bt in sets]
            fmeta = flash_mla.get_mla_metadata()[0]

            def step_theirs(i, theirs=theirs, fmeta=fmeta):
                a, kw = theirs[i]
                return flash_mla.flash_mla_with_kvcache(*a, fmeta, **kw, use_legacy=True, kv_format="V4")

            out, lse = step_theirs(0)
            row["flashmla_ok"] = compare(out[:, :, :HEADS], lse[:, :HEADS], ref_out, ref_lse)[0]
            sample = timing.sampler(timing.capture(step_theirs, SETS), SETS, 5.0)
            row["flashmla_us"] = statistics.median(sample()[0] for _ in range(args.samples))
            row["speedup"] = row["flashmla_us"] / row["ours_us"]
        rows.append(row)
        print(json.dumps(row), flush=True)
        del sets, ours
        torch.cuda.empty_cache()
    env = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "flash_mla": flash_mla is not None,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"env": env, "rows": rows}, f, indent=1)
    from tabulate import tabulate

    print(tabulate(rows, headers="keys", floatfmt=".2f"))
    return 0 if all(r["ours_ok"] and r.get("flashmla_ok", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
