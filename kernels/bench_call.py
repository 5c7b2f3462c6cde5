"""GPU benchmark of the whole DeepSeek-V4-Flash decode attention call against FlashMLA's same call.

    python -m sparse_mla_tuner.kernels.bench_call [--concurrency 1,2,4,...,96] [--q-tokens 1]
                                  [--also single-table,T32-...]
                                 [--out FILE.json]

The call of one V4-Flash layer at TP4 (16 local heads): a sliding-window cache (topk 128 of a 128-token
window) and the compressed cache (topk 512 of 8192 tokens) in one softmax, with a learned per-head
attention sink (``--q-tokens 2``: two query tokens per request, as with multi-token prediction). Both caches
are ``fp8_model1`` (FlashMLA's "V4"), pages of 64 tokens. Ours runs through ``kernels.flashmla_compat`` with
16 heads and the exported table (``config=None``: the layer's table, keyed by the window's topk), one split
launch over both caches and one combine; FlashMLA (``flash_mla``, legacy sm_90 path) needs 64 or 128 heads,
so its q and sink are padded to 64 heads, as an engine at TP4 would have to.

Cold L2: one pool of ``--pool`` requests (at least 4 C) is built once; level C rotates over ``pool // C`` disjoint
request sets (different cache pages and indices), all captured in one CUDA graph, so consecutive calls miss
in L2. Times are µs per call, the median of ``--samples`` samples of many replays, ours and FlashMLA in the
same run on the same sets. Errors: each output against the fp32 reference, and ours against FlashMLA's.
``--also`` times other configs of our call on the same sets (``single-table``: the compressed cache's own
single-cache table, a candidate for the layer call's rows until the layer space is re-tuned; ``table-merge``: the
layer's table with ``MERGE=1``, the merge in the split launch).

The JSON (``--out``; default ``$OUT/bench_call_<device>.json`` when ``$OUT`` is set, else
``results/bench_call_<device>.json``, the committed file's name) holds the device, date, command and kernel hash,
then per level: ours, FlashMLA, their ratio (FlashMLA / ours: above 1 is ours faster) and the errors.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

from . import flashmla_compat
from . import timing
from .config import KernelConfig
from .config import kernel_source_hash
from .config import split_grid
from .decode import device_name
from .decode import sparse_mla_decode
from .reference import compare
from .reference import sparse_mla_decode_ref
from .table import device_slug
from .table import lookup_config
from .workload import Workload
from .workload import make_batch

HEADS, FLASHMLA_HEADS, MIN_SETS = 16, 64, 4
WINDOW = Workload("fp8_model1", HEADS, 128, page_size=64, context=128)
COMPRESSED = Workload("fp8_model1", HEADS, 512, page_size=64, context=8192)
LEVELS = "1,2,4,8,16,24,32,40,48,56,64,72,80,88,96"


def _args(bt, heads: int, k_cache=None) -> tuple[tuple, dict]:
    """FlashMLA-style arguments of one batch, q and sink padded to ``heads``; the window cache is the batch's own,
    or ``k_cache`` (``kernels.sglang_check``: the pool's window re-paged once into contiguous 64-token pages)."""
    q, sink = bt.q, bt.attn_sink
    if heads > q.shape[2]:
        pad = heads - q.shape[2]
        q = torch.cat([q, q.new_zeros(*q.shape[:2], pad, q.shape[3])], dim=2)
        sink = torch.cat([sink, sink.new_zeros(pad)])
    k = bt.kv_cache.unsqueeze(2).view(torch.float8_e4m3fn) if k_cache is None else k_cache
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


def default_out(device: str) -> Path:
    """``$OUT/bench_call_<device>.json`` when ``$OUT`` is set, else ``results/bench_call_<device>.json``."""
    name = f"bench_call_{device_slug(device).lower().removeprefix('nvidia_')}.json"
    return Path(os.environ["OUT"]) / name if os.environ.get("OUT") else Path("results") / name


def _levels(text: str) -> list[int]:
    try:
        levels = [int(c) for c in text.split(",")]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise SystemExit(f"--concurrency must be a comma list of positive integers, got {text!r}")
    return levels


ALSO_NAMES = ("single-table", "table-merge")


def _also_config(name: str, rows: int) -> KernelConfig:
    if name == "single-table":
        return lookup_config(torch.cuda.get_device_name(0), "fp8_model1", HEADS, COMPRESSED.topk, rows)
    if name == "table-merge":  # the layer's own table with the merge in the split launch
        return lookup_config(torch.cuda.get_device_name(0), "fp8_model1", HEADS, WINDOW.topk, rows).replace(MERGE=1)
    return KernelConfig.parse(name)


def _time(step, n_sets: int, samples: int) -> float:
    sample = timing.sampler(timing.capture(step, n_sets), n_sets, 5.0)
    return statistics.median(sample()[0] for _ in range(samples))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", default=LEVELS)
    ap.add_argument("--q-tokens", type=int, default=1, help="query tokens per request (2: multi-token prediction)")
    ap.add_argument("--pool", type=int, default=384, help="requests built once; level C rotates pool // C sets")
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument(
        "--also",
        default="",
        help="comma list of other configs to time on the same sets: config keys (T32-w4-s1-c512-p1), "
        "single-table (the single-cache table of the compressed cache, topk 512, at the same batch) or "
        "table-merge (the layer's table with MERGE=1)",
    )
    ap.add_argument("--no-flashmla", action="store_true", help="skip FlashMLA even when it imports")
    ap.add_argument("--out", default=None, help="the JSON file (default: see the module docstring)")
    args = ap.parse_args(argv)
    levels = _levels(args.concurrency)
    also = [a for a in args.also.split(",") if a]
    for name in also:
        if name not in ALSO_NAMES:
            try:
                KernelConfig.parse(name)
            except ValueError as e:
                raise SystemExit(f"--also: {e}") from None
    if args.q_tokens < 1 or args.pool < 1 or args.samples < 1:
        raise SystemExit("--q-tokens, --pool and --samples must be positive integers")
    if not torch.cuda.is_available():
        print("sparse_mla_tuner.kernels.bench_call needs a CUDA GPU", file=sys.stderr)
        return 2
    flash_mla = None
    if not args.no_flashmla:
        try:
            import flash_mla
        except ImportError:
            flash_mla = None
    dev = torch.cuda.get_device_name(0)
    out_path = Path(args.out) if args.out else default_out(dev)
    env = {
        "device": dev,
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "command": "python -m sparse_mla_tuner.kernels.bench_call " + shlex.join(timing.portable_argv(argv)),
        "kernel_hash": kernel_source_hash(),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "flash_mla": getattr(flash_mla, "__version__", "installed") if flash_mla is not None else None,
        "q_tokens": args.q_tokens,
        "pool": max(args.pool, MIN_SETS * max(levels)),
    }
    print(f"# {json.dumps(env)}", flush=True)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    n_pool = max(args.pool, MIN_SETS * max(levels))  # at least MIN_SETS disjoint sets at every level
    t0 = time.time()
    pool = make_batch(WINDOW, n_pool, device="cuda", seed=7, q_tokens=args.q_tokens, extra=COMPRESSED, with_sink=True)
    torch.cuda.synchronize()
    print(f"# pool of {n_pool} requests built in {time.time() - t0:.1f} s", flush=True)
    rows = []
    for C in levels:
        n_sets = n_pool // C
        sets = [pool.rows(i * C, (i + 1) * C) for i in range(n_sets)]
        ref_out, ref_lse = sparse_mla_decode_ref(*sets[0].args(), **sets[0].kwargs(), sm_scale=512**-0.5)
        cfg = lookup_config(device_name(pool.q.device), "fp8_model1", HEADS, WINDOW.topk, C * args.q_tokens)
        grid = split_grid(cfg, C * args.q_tokens, HEADS, WINDOW.topk, COMPRESSED.topk)
        row = {"C": C, "config": str(cfg), "splits": grid.slots, "sets": n_sets}
        meta = flashmla_compat.get_mla_metadata()[0]
        ours = [_args(bt, HEADS) for bt in sets]

        def step_ours(i, ours=ours, meta=meta):
            a, kw = ours[i]
            return flashmla_compat.flash_mla_with_kvcache(*a, meta, **kw)

        out, lse = step_ours(0)
        ok, rel, lse_err, _ = compare(out, lse, ref_out, ref_lse)
        row |= {"ours_us": _time(step_ours, n_sets, args.samples), "ours_ok": ok, "ours_rel_err": rel}
        row["ours_lse_err"] = lse_err
        if flash_mla is not None:
            theirs = [_args(bt, FLASHMLA_HEADS) for bt in sets]
            fmeta = flash_mla.get_mla_metadata()[0]

            def step_theirs(i, theirs=theirs, fmeta=fmeta):
                a, kw = theirs[i]
                return flash_mla.flash_mla_with_kvcache(*a, fmeta, **kw, use_legacy=True, kv_format="V4")

            t_out, t_lse = step_theirs(0)
            t_out, t_lse = t_out[:, :, :HEADS], t_lse[:, :HEADS]
            fok, frel, _, _ = compare(t_out, t_lse, ref_out, ref_lse)
            vok, vrel, vlse, _ = compare(out, lse, t_out, t_lse)
            row |= {"flashmla_us": _time(step_theirs, n_sets, args.samples), "flashmla_ok": fok}
            row |= {"flashmla_rel_err": frel, "ours_vs_flashmla_rel_err": vrel, "ours_vs_flashmla_lse_err": vlse}
            row |= {"ours_vs_flashmla_ok": vok, "ratio": row["flashmla_us"] / row["ours_us"]}
        for name in also:  # other configs of the same call, on the same sets
            acfg = _also_config(name, C * args.q_tokens)
            a_out, a_lse = sparse_mla_decode(*sets[0].args(), **sets[0].kwargs(), sm_scale=512**-0.5, config=acfg)
            a_ok = compare(a_out, a_lse, ref_out, ref_lse)[0]

            def step_also(i, sets=sets, acfg=acfg):
                return sparse_mla_decode(*sets[i].args(), **sets[i].kwargs(), sm_scale=512**-0.5, config=acfg)

            row.setdefault("also", {})[name] = {"config": str(acfg), "us": _time(step_also, n_sets, args.samples)}
            row["also"][name]["ok"] = a_ok
        rows.append(row)
        print(json.dumps(row), flush=True)
        out_path.write_text(json.dumps({"env": env, "rows": rows}, indent=1) + "\n")  # every level, as measured
        del sets, ours
        torch.cuda.empty_cache()
    from tabulate import tabulate

    cols = ["C", "config", "splits", "ours_us", "flashmla_us", "ratio", "ours_rel_err", "ours_vs_flashmla_rel_err"]
    print(tabulate([[r.get(c) for c in cols] for r in rows], headers=cols, floatfmt=".3g"))
    print(f"# written to {out_path}")
    for name in also:
        print(f"{name}: " + " ".join(f"C={r['C']} {r['also'][name]['us']:.1f}" for r in rows))
    good = all(r["ours_ok"] and r.get("flashmla_ok", True) and r.get("ours_vs_flashmla_ok", True) for r in rows)
    good &= all(a["ok"] for r in rows for a in r.get("also", {}).values())
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
