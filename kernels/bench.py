"""GPU benchmark of the sparse MLA decode kernel: check at full size, then time as production runs it.

    python -m sparse_mla_tuner.kernels.bench [--formats fp8_model1,fp8_v32] [--concurrency 1,8,48,64,80,96]
                            [--configs table,T16-w4-s2-c256,...] [--out results.json]

Per format: H = 16 local heads, page_size 64, 8192 tokens of context per request, topk 512
(fp8_model1) or 2048 (fp8_v32). One pool of ``--pool`` requests is built per format; concurrency C
uses ``pool // C`` disjoint request sets (>= 4), so consecutive calls touch different cache rows
and different indices (cold L2). Each config: correctness against the reference at full size, then
the whole call (split + combine) over all sets captured in one CUDA graph, ``--samples`` samples of
many replays, median. Bytes = gathered KV rows + q + out + lse + indices. The copy bandwidth is
measured in the same run (device-to-device copy of 1 GiB, bytes read + written).

``table`` in ``--configs`` is the call as engines make it, ``config=None`` (the exported table).
When the ``flash_mla`` package (the ``sgl-flash-mla`` wheel) imports, FlashMLA's sparse FP8 decode
(its sm_90 path) is timed on the same inputs and checked against the same reference, with q padded
to 64 heads (it accepts only 64 or 128); its column is ``flashmla_us``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time

import torch

from . import timing
from .config import KernelConfig
from .config import kernel_source_hash
from .config import split_grid
from .decode import sparse_mla_decode
from .reference import compare
from .reference import sparse_mla_decode_ref
from .workload import Workload
from .workload import make_batch

TOPK = {"fp8_model1": 512, "fp8_v32": 2048}
FLASHMLA_HEADS = 64
HAND_PICKED = (
    "table,T16-w4-s2-c256,T16-w4-s2-c512,T16-w4-s2-c132,T32-w4-s2-c256,T16-w8-s2-c256,T16-w4-s3-c256,T32-w4-s2-c512"
)


def parse_config(text: str) -> KernelConfig | None:
    """``T16-w4-s2-c256`` -> KernelConfig(16, 4, 2, 256) (the form ``str(KernelConfig)`` prints);
    ``table`` -> None (the exported table decides, as in production)."""
    if text == "table":
        return None
    try:
        return KernelConfig.parse(text)
    except ValueError as e:
        raise SystemExit(f"bad config: {e}") from None


def time_graph(step, n_sets: int, samples: int, target_ms: float = 5.0) -> list[float]:
    """µs per call: ``step(i)`` for i in range(n_sets) captured in one CUDA graph, replayed many times."""
    sample = timing.sampler(timing.capture(step, n_sets), n_sets, target_ms)
    return [sample()[0] for _ in range(samples)]


def copy_bandwidth(samples: int) -> dict[str, float]:
    """GB/s of 1 GiB device-to-device copies in a graph (bytes read + written): ``copy_`` of the bytes
    (cudaMemcpy path) and an elementwise fp32 kernel (``torch.add(x, 1)``); the larger is the roofline."""
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    f_src, f_dst = src.view(torch.float32), dst.view(torch.float32)
    res = {}
    for name, fn in (("memcpy", lambda i: dst.copy_(src)), ("add_fp32", lambda i: torch.add(f_src, 1.0, out=f_dst))):
        us = statistics.median(time_graph(fn, 1, samples, target_ms=20.0))
        res[name] = 2 * n / (us * 1e-6) / 1e9
    return res


def _calls(fn, qs, kv_cache, idx, kw):
    """step(i): one call on request set i."""
    return lambda i: fn(qs[i], kv_cache, idx[i], **kw)


def import_flash_mla():
    """FlashMLA's Python package when it imports and has its sm_90 (legacy) path, else None."""
    try:
        import flash_mla
    except ImportError:
        return None
    return flash_mla if getattr(flash_mla, "has_legacy", lambda: False)() else None


def flashmla_row(flash_mla, fmt, qs, kv_cache, idx, ref, samples) -> dict:
    """FlashMLA on the same request sets: q padded to 64 heads, the output's first H heads compared."""
    from .flashmla_compat import FLASHMLA_NAMES

    H = qs[0].shape[1]
    pad = [torch.cat([q, q.new_zeros(q.shape[0], FLASHMLA_HEADS - H, q.shape[2])], 1).unsqueeze(1) for q in qs]
    k = kv_cache.unsqueeze(2).view(torch.float8_e4m3fn)
    meta = flash_mla.get_mla_metadata()[0]
    scale = qs[0].shape[-1] ** -0.5  # the reference's default, 1/sqrt(D_qk): 512 for V4, 576 for V3.2
    kw = {"softmax_scale": scale, "is_fp8_kvcache": True, "use_legacy": True, "kv_format": FLASHMLA_NAMES[fmt]}

    def step(i):
        return flash_mla.flash_mla_with_kvcache(pad[i], k, None, None, 512, meta, indices=idx[i].unsqueeze(1), **kw)

    out, lse = step(0)
    ok, rel, _, _ = compare(out[:, 0, :H], lse[:, :H, 0], *ref)
    us = time_graph(step, len(qs), samples)
    return {"flashmla_us": statistics.median(us), "flashmla_correct": ok, "flashmla_rel_err": rel}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--formats", default="fp8_model1,fp8_v32")
    ap.add_argument("--concurrency", default="1,8,48,64,80,96")
    ap.add_argument("--configs", default=HAND_PICKED)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--pool", type=int, default=384, help="requests per format; C uses pool // C sets")
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--no-ref", action="store_true", help="skip timing torch.compile of the reference")
    ap.add_argument("--no-flashmla", action="store_true", help="skip timing FlashMLA even when it imports")
    ap.add_argument("--maxnreg", default="0", help="comma list of register caps to try with every config (0 = none)")
    ap.add_argument(
        "--table-check",
        action="store_true",
        help="time config=None (the exported table) against the same config passed explicitly",
    )
    ap.add_argument("--out", default=None, help="write every number as JSON here")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("sparse_mla_tuner.kernels.bench needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.table_check:
        return table_check(args)
    configs = [parse_config(c) for c in args.configs.split(",")]
    concurrency = [int(c) for c in args.concurrency.split(",")]
    props = torch.cuda.get_device_properties(0)
    env = {
        "device": props.name,
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "kernel_hash": kernel_source_hash(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    env["copy_GBps"] = copy_bandwidth(args.samples)
    bw = max(env["copy_GBps"].values())
    print(f"# {env}", flush=True)
    rows = []
    ref_fn = torch.compile(sparse_mla_decode_ref, dynamic=True)
    flash_mla = None if args.no_flashmla else import_flash_mla()
    print(f"# FlashMLA: {'timed as a peer' if flash_mla else 'not importable, its column is empty'}", flush=True)
    for fmt in args.formats.split(","):
        wl = Workload(fmt, args.heads, TOPK[fmt], 64, 8192)
        t0 = time.time()
        pool = make_batch(wl, args.pool, device="cuda", seed=1)
        torch.cuda.synchronize()
        print(f"# {fmt}: pool of {args.pool} requests built in {time.time() - t0:.1f}s", flush=True)
        for C in concurrency:
            n_sets = max(1, args.pool // C)
            qs = [pool.q[i * C : (i + 1) * C] for i in range(n_sets)]
            idx = [pool.indices[i * C : (i + 1) * C] for i in range(n_sets)]
            kw = {"kv_format": fmt}
            ref_out, ref_lse = sparse_mla_decode_ref(qs[0], pool.kv_cache, idx[0], **kw)
            ref_us = float("nan")
            if not args.no_ref:
                try:
                    ref_us = statistics.median(
                        time_graph(_calls(ref_fn, qs, pool.kv_cache, idx, kw), min(n_sets, 8), 3)
                    )
                except Exception as e:  # a failed compile of the baseline must not hide the kernel's numbers
                    print(f"# compiled reference failed at C={C}: {type(e).__name__}: {e}", flush=True)
            nbytes = wl.min_bytes(C)
            peer = {"flashmla_us": float("nan")}
            if flash_mla is not None:
                peer = flashmla_row(flash_mla, fmt, qs, pool.kv_cache, idx, (ref_out, ref_lse), args.samples)
                print(f"# FlashMLA {fmt} C={C}: {json.dumps(peer)}", flush=True)
            for base, cap in itertools.product(configs, [int(x) for x in args.maxnreg.split(",")]):
                cfg = base.replace(maxnreg=cap) if (cap and base is not None) else base
                name = "table" if cfg is None else str(cfg)
                out = torch.full_like(ref_out, float("nan"))
                lse = torch.full_like(ref_lse, float("nan"))
                o, ls = sparse_mla_decode(qs[0], pool.kv_cache, idx[0], config=cfg, **kw)
                out.copy_(o)
                lse.copy_(ls)
                ok, rel, lse_err, _ = compare(out, lse, ref_out, ref_lse)
                step = _calls(sparse_mla_decode, qs, pool.kv_cache, idx, {**kw, "config": cfg})
                us = time_graph(step, n_sets, args.samples)
                med = statistics.median(us)
                gbps = nbytes / (med * 1e-6) / 1e9
                row = {
                    "format": fmt,
                    "C": C,
                    "config": name,
                    "splits": None if cfg is None else split_grid(cfg, C, args.heads, wl.topk).slots,
                    "us": med,
                    "us_min": min(us),
                    "us_max": max(us),
                    "GBps": gbps,
                    "pct_copy": 100 * gbps / bw,
                    "ref_us": ref_us,
                    "speedup": ref_us / med,
                    **peer,
                    "vs_flashmla": peer["flashmla_us"] / med,
                    "rel_err": rel,
                    "lse_err": lse_err,
                    "correct": ok,
                    "sets": n_sets,
                    "bytes": nbytes,
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
                if args.out:  # every row as measured: a run cut short keeps what it measured
                    with open(args.out, "w") as f:
                        json.dump({"env": env, "rows": rows}, f, indent=1)
        pool = None
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"env": env, "rows": rows}, f, indent=1)
    from tabulate import tabulate

    cols = [
        "format",
        "C",
        "config",
        "splits",
        "us",
        "GBps",
        "pct_copy",
        "speedup",
        "flashmla_us",
        "vs_flashmla",
        "correct",
    ]
    print(tabulate([[r[c] for c in cols] for r in rows], headers=cols, floatfmt=".1f"))
    best = {}
    for r in rows:
        key = (r["format"], r["C"])
        if r["correct"] and (key not in best or r["us"] < best[key]["us"]):
            best[key] = r
    print("best per (format, C):")
    print(
        tabulate(
            [
                [k[0], k[1], v["config"], v["us"], v["pct_copy"], v["speedup"], v["flashmla_us"], v["vs_flashmla"]]
                for k, v in best.items()
            ],
            headers=["format", "C", "config", "us", "% copy", "x ref", "FlashMLA us", "x FlashMLA"],
            floatfmt=".1f",
        )
    )
    return 0 if all(r["correct"] and r.get("flashmla_correct", True) for r in rows) else 1


def table_check(args) -> int:
    """config=None must pick the exported config and run as fast as passing it explicitly."""
    from tabulate import tabulate

    from .config import DEFAULT_CONFIG
    from .decode import device_name
    from .table import lookup_config

    rows, ok = [], True
    for fmt in args.formats.split(","):
        wl = Workload(fmt, args.heads, TOPK[fmt], 64, 8192)
        pool = make_batch(wl, args.pool, device="cuda", seed=3)
        for C in [int(c) for c in args.concurrency.split(",")]:
            n_sets = max(1, args.pool // C)
            qs = [pool.q[i * C : (i + 1) * C] for i in range(n_sets)]
            idx = [pool.indices[i * C : (i + 1) * C] for i in range(n_sets)]
            cfg = lookup_config(device_name(pool.q.device), fmt, args.heads, wl.topk, C)
            t_none = statistics.median(
                time_graph(_calls(sparse_mla_decode, qs, pool.kv_cache, idx, {"kv_format": fmt}), n_sets, args.samples)
            )
            t_expl = statistics.median(
                time_graph(
                    _calls(sparse_mla_decode, qs, pool.kv_cache, idx, {"kv_format": fmt, "config": cfg}),
                    n_sets,
                    args.samples,
                )
            )
            from_table = cfg != DEFAULT_CONFIG
            ok &= from_table and abs(t_none / t_expl - 1) < 0.03
            rows.append([fmt, C, str(cfg), from_table, f"{t_none:.2f}", f"{t_expl:.2f}", f"{t_none / t_expl:.3f}"])
        pool = None
        torch.cuda.empty_cache()
    print(
        tabulate(rows, headers=["format", "C", "table config", "from table", "config=None us", "explicit us", "ratio"])
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
