"""GPU check and benchmark of the cache formats of issue 57, each against its peer, at the 15 CUDA-graph levels.

    python benchmarks/bench_formats.py [--concurrency 1,2,4,...,96] [--samples 5] [--pool 256] [--out FILE.json]

Three calls, 16 local heads, 8192 tokens of context per request, pages of 64 tokens:

- ``nope``: GLM-5.3's cache, ``fp8_v32_nope`` (528 B/token), topk 2048, against FlashMLA's legacy sm_90 kernel with
  ``kv_format="V32_NO_ROPE"`` on the same request sets (q padded to 64 heads, as FlashMLA needs), when ``flash_mla``
  (the ``sgl-flash-mla`` wheel) imports;
- ``v41``: DeepSeek-V4.1's fp8 cache alone, ``fp8_v41`` (528 B/token), topk 512, against our own V4 path on the same
  shape, ``fp8_model1`` (584 B/token) with its shipped table (no peer runs V4.1 on sm_90: FlashMLA's V4.1 kernel is
  SM100-only, its legacy one has no V4.1);
- ``v41_layer``: a V4.1 layer call, the ``fp8_v41`` window (topk 128 of 128 tokens) and the ``fp4_v41`` compressed
  cache (288 B/token, topk 512) with the attention sink in one split launch, against the V4 layer call of the same
  shape in ``fp8_model1`` (its shipped layer table).

Ours runs twice: ``table`` (``config=None``: the format's exported table, or the default config where none is
shipped yet) and ``sibling`` (the config the sibling format's shipped table picks at that level: ``fp8_v32``'s for
the no-RoPE cache, ``fp8_model1``'s for V4.1). Every output is checked against the fp32 reference
(``kernels.reference``) at every level before it is timed, the peer's too; a wrong row makes the exit status 1.
Bytes per call are :meth:`Workload.min_bytes` (every gathered row, q, out, lse, indices), so GB/s and the % of the
copy bandwidth (measured in the same run) say how close a call is to the memory floor. Cold L2: level C rotates over
``pool // C`` disjoint request sets captured in one CUDA graph (``kernels.bench``'s method).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time

import torch

from sparse_mla_tuner.kernels.bench import copy_bandwidth
from sparse_mla_tuner.kernels.bench import flashmla_row
from sparse_mla_tuner.kernels.bench import import_flash_mla
from sparse_mla_tuner.kernels.bench import time_graph
from sparse_mla_tuner.kernels.config import kernel_source_hash
from sparse_mla_tuner.kernels.decode import device_name
from sparse_mla_tuner.kernels.decode import sparse_mla_decode
from sparse_mla_tuner.kernels.reference import compare
from sparse_mla_tuner.kernels.reference import sparse_mla_decode_ref
from sparse_mla_tuner.kernels.table import lookup_config
from sparse_mla_tuner.kernels.workload import Workload
from sparse_mla_tuner.kernels.workload import make_batch

LEVELS = "1,2,4,8,16,24,32,40,48,56,64,72,80,88,96"
H = 16


def _call(fmt: str, topk: int, extra: tuple[str, int] | None = None, ctx: int = 8192) -> Workload:
    x = None if extra is None else Workload(extra[0], H, extra[1], 64, 8192)
    return Workload(fmt, H, topk, 64, ctx, extra=x, attn_sink=extra is not None)


# name -> (the new format's call, its baseline call of the same shape, the sibling format whose table lends a config)
CALLS = {
    "nope": (_call("fp8_v32_nope", 2048), None, ("fp8_v32", 2048)),
    "v41": (_call("fp8_v41", 512), _call("fp8_model1", 512), ("fp8_model1", 512)),
    "v41_layer": (
        _call("fp8_v41", 128, ("fp4_v41", 512), ctx=128),
        _call("fp8_model1", 128, ("fp8_model1", 512), ctx=128),
        ("fp8_model1", 128),
    ),
}


def _sets(bt, C: int, n_sets: int) -> list:
    return [bt.rows(i * C, (i + 1) * C) for i in range(n_sets)]


def measure(sets, cfg, samples: int) -> tuple[dict, tuple]:
    """Ours on every set: the gate on set 0 against the fp32 reference, then µs per call (median of samples)."""
    b0 = sets[0]
    ref = sparse_mla_decode_ref(*b0.args(), **b0.kwargs())
    out, lse = sparse_mla_decode(*b0.args(), **b0.kwargs(), config=cfg)
    ok, rel, lse_err, reason = compare(out.clone(), lse.clone(), *ref)

    def step(i):
        return sparse_mla_decode(*sets[i].args(), **sets[i].kwargs(), config=cfg)

    us = time_graph(step, len(sets), samples)
    return {"us": statistics.median(us), "correct": ok, "rel_err": rel, "lse_err": lse_err, "reason": reason}, ref


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", default=",".join(CALLS), help=f"some of {','.join(CALLS)}")
    ap.add_argument("--concurrency", default=LEVELS)
    ap.add_argument("--pool", type=int, default=256, help="requests built once per call; level C rotates pool // C")
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--no-flashmla", action="store_true", help="skip FlashMLA even when it imports")
    ap.add_argument("--out", default=None, help="write every number as JSON here")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/bench_formats.py needs a CUDA GPU", file=sys.stderr)
        return 2
    unknown = sorted(set(args.calls.split(",")) - set(CALLS))
    if unknown:
        print(f"--calls: unknown {unknown}; allowed: {sorted(CALLS)}", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    env = {
        "device": props.name,
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "kernel_hash": kernel_source_hash(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "command": shlex.join(["python", "benchmarks/bench_formats.py", *(argv if argv is not None else sys.argv[1:])]),
        "copy_GBps": copy_bandwidth(args.samples),
    }
    bw = max(env["copy_GBps"].values())
    print(f"# {env}", flush=True)
    flash_mla = None if args.no_flashmla else import_flash_mla()
    dev = device_name(torch.device("cuda"))
    rows: list[dict] = []
    for name in args.calls.split(","):
        new, base, (sib_fmt, sib_topk) = CALLS[name]
        pools = {"new": make_batch(new, args.pool, device="cuda", seed=1)}
        if base is not None:
            pools["base"] = make_batch(base, args.pool, device="cuda", seed=1)
        for C in [int(c) for c in args.concurrency.split(",")]:
            n_sets = max(1, args.pool // C)
            row = {"call": name, "format": new.kv_format, "C": C, "sets": n_sets, "bytes": new.min_bytes(C)}
            sets = _sets(pools["new"], C, n_sets)
            sibling = lookup_config(dev, sib_fmt, H, sib_topk, C)
            for label, cfg in (("table", None), ("sibling", sibling)):
                res, ref = measure(sets, cfg, args.samples)
                row[label] = {**res, "config": "table" if cfg is None else str(cfg)}
            best = min((row["table"], row["sibling"]), key=lambda r: r["us"] if r["correct"] else float("inf"))
            row["us"] = best["us"]
            row["GBps"] = row["bytes"] / (best["us"] * 1e-6) / 1e9
            row["pct_copy"] = 100 * row["GBps"] / bw
            row["correct"] = row["table"]["correct"] and row["sibling"]["correct"]
            if base is not None:  # our V4 path on the same shape, its shipped table
                res, _ = measure(_sets(pools["base"], C, n_sets), None, args.samples)
                row["baseline"] = {**res, "format": base.kv_format, "bytes": base.min_bytes(C)}
                row["baseline"]["pct_copy"] = 100 * base.min_bytes(C) / (res["us"] * 1e-6) / 1e9 / bw
                row["vs_baseline"] = res["us"] / row["us"]  # above 1: the new format's call is faster
                row["correct"] &= res["correct"]
            elif flash_mla is not None:  # FlashMLA's own no-RoPE kernel on the same sets
                b = pools["new"]
                qs = [b.q[i * C : (i + 1) * C] for i in range(n_sets)]
                idx = [b.indices[i * C : (i + 1) * C] for i in range(n_sets)]
                peer = flashmla_row(flash_mla, new.kv_format, qs, b.kv_cache, idx, ref, args.samples)
                row["flashmla"] = peer
                row["vs_flashmla"] = peer["flashmla_us"] / row["us"]  # above 1: ours is faster
                row["correct"] &= peer["flashmla_correct"]
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.out:  # every row as measured: a run cut short keeps what it measured
                with open(args.out, "w") as f:
                    json.dump({"env": env, "rows": rows}, f, indent=1)
        pools = None
        torch.cuda.empty_cache()
    for name in args.calls.split(","):
        rs = [r for r in rows if r["call"] == name]
        print(f"{name:<10} C     " + " ".join(f"{r['C']:>6}" for r in rs))
        print("  ours us        " + " ".join(f"{r['us']:6.1f}" for r in rs))
        print("  % copy         " + " ".join(f"{r['pct_copy']:6.1f}" for r in rs))
        if rs and "vs_flashmla" in rs[0]:
            print("  FlashMLA us    " + " ".join(f"{r['flashmla']['flashmla_us']:6.1f}" for r in rs))
            print("  FlashMLA/ours  " + " ".join(f"{r['vs_flashmla']:6.2f}" for r in rs))
        if rs and "vs_baseline" in rs[0]:
            print("  V4 path us     " + " ".join(f"{r['baseline']['us']:6.1f}" for r in rs))
            print("  V4/V4.1        " + " ".join(f"{r['vs_baseline']:6.2f}" for r in rs))
        print("  correct        " + " ".join(f"{'ok' if r['correct'] else 'FAIL':>6}" for r in rs))
    return 0 if all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
