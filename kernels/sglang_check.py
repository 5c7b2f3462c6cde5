"""GPU check of the SGLang plugin's hook, without SGLang: the engine's call at its 15 CUDA-graph capture sizes.

    python -m sparse_mla_tuner.kernels.sglang_check [--out check.json] [--concurrency 1,2,4,8,16,24,...,96]

At each batch size C, :func:`kernels.sglang_plugin.sglang_hook` is called with the keyword arguments SGLang's
DeepSeek-V4 backend passes on sm_120: q ``[C, 1, 16, 512]`` bf16 (TP4), the window cache (top-k 128 of a
128-token window) as a float8_e4m3fn view ``[pages, 256, 1, 584]`` of 256-token pages padded to 149 760 bytes, the
compressed cache (top-k 512 of 8192 tokens) as ``[pages, 64, 1, 584]`` of pages padded to 37 440 bytes, ragged
lengths left out (as SGLang passes them: ``topk_length`` None), and the per-head sink. The original function is a
stub that fails: every call must be served by the kernel.

Checked against the fp32 reference (the project's gate, ``kernels.reference.compare``) and against FlashMLA
(``flash_mla``, legacy sm_90 path, heads padded to 64, on the same tokens re-paged into contiguous 64-token pages, as
``kernels.bench_call`` calls it): relative error at most twice the gate's, as both are held to it. Timed as
``kernels.bench_call`` times (cold L2: one pool of ``--pool`` requests, at least 4 C, built once; level C rotates
over its ``pool // C`` disjoint request sets in one CUDA graph): the hook, and the layer-call benchmark's own call
(``kernels.flashmla_compat`` on the contiguous caches) on the same sets, in the same process; ``ratio`` is
hook / layer call. ``direct_us`` is the kernel call the hook makes (same engine tensors, same config) without the
hook, so ``hook_vs_direct`` is what the wrapper costs; ``ratio`` also carries the engine's layout (256-token window
pages, padded) against the benchmark's contiguous 64-token pages. The first eager call warms the shape up (every
config the table can pick); the check also counts the Triton compilations that happen after it
(``late_compiles``, which must be 0).

``--also T32-w4-s1-c128-p3,...`` times each named config's kernel call (no hook) on the same request sets in four
layouts: the engine's (``engine_us``: padded 256-token window pages, padded 64-token compressed pages), the same
pages unpadded (``pages256_us``), both caches on 256-token pages (``both256_us``: one page layout) and the
benchmark's (``bench_us``: both caches on contiguous 64-token pages), so that what a layout costs can be told from
what a config costs (``also`` in each row).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time

import torch

from . import flashmla_compat
from . import sglang_plugin
from . import timing
from .config import KernelConfig
from .decode import sparse_mla_decode
from .reference import OUT_RTOL
from .reference import compare
from .reference import sparse_mla_decode_ref
from .workload import Workload
from .workload import make_batch

HEADS, FLASHMLA_HEADS, MIN_SETS = 16, 64, 4
WINDOW = Workload("fp8_model1", HEADS, 128, page_size=256, context=128)
COMPRESSED = Workload("fp8_model1", HEADS, 512, page_size=64, context=8192)
CAPTURE = ",".join(map(str, sglang_plugin.CAPTURE_SIZES))


def repage(pages: torch.Tensor, page_size: int = 64) -> torch.Tensor:
    """A contiguous fp8_model1 cache of large pages as pages of ``page_size`` tokens (same token indices)."""
    n, big, bpt = pages.shape
    k = big // page_size
    flat = pages.reshape(n, big * bpt)
    data = flat[:, : big * 576].reshape(n, k, page_size * 576)
    scales = flat[:, big * 576 :].reshape(n, k, page_size * 8)
    return torch.cat([data, scales], dim=2).reshape(n * k, page_size, bpt).contiguous()


def regroup(pages: torch.Tensor, factor: int = 4) -> torch.Tensor:
    """A contiguous fp8_model1 cache of small pages as pages ``factor`` times larger (same token indices: each
    ``factor`` consecutive pages become one; the inverse of :func:`repage`)."""
    n, small, bpt = pages.shape
    n -= n % factor
    grouped = pages[:n].reshape(n // factor, factor, small * bpt)
    data = grouped[:, :, : small * 576].reshape(n // factor, factor * small * 576)
    scales = grouped[:, :, small * 576 :].reshape(n // factor, factor * small * 8)
    return torch.cat([data, scales], dim=1).reshape(n // factor, factor * small, bpt).contiguous()


def _engine_kwargs(bt, k_cache, extra_k_cache) -> dict:
    """SGLang's keyword arguments for the requests of ``bt`` on the engine-layout caches of its pool."""
    return {
        "q": bt.q,
        "k_cache": k_cache,
        "head_dim_v": 512,
        "softmax_scale": 512**-0.5,
        "indices": bt.indices,
        "topk_length": None,
        "attn_sink": bt.attn_sink,
        "extra_k_cache": extra_k_cache,
        "extra_indices_in_kvcache": bt.extra_indices,
        "extra_topk_length": None,
    }


def _flashmla_args(bt, heads: int, k_cache) -> tuple[tuple, dict]:
    """``kernels.bench_call``'s FlashMLA-style arguments: contiguous 64-token pages (``k_cache``, the pool's
    window re-paged once), q and sink padded."""
    from .bench_call import _args

    return _args(bt, heads, k_cache)


def _left(**kwargs):
    raise RuntimeError("the hook left an engine call to the original: the check expects every call served")


class _Compiles:
    """Counts Triton compilations (``triton.knobs.compilation.listener``) while armed."""

    def __init__(self):
        self.count, self.armed, self.supported = 0, False, False
        try:
            import triton.knobs as knobs

            self._prev = knobs.compilation.listener
            knobs.compilation.listener = self._on
            self.supported = True
        except (ImportError, AttributeError):
            pass

    def _on(self, **kw):
        if self._prev is not None:
            self._prev(**kw)
        if self.armed:
            self.count += 1


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative error (Frobenius norm) of ``out`` against ``ref``, both taken in fp32."""
    return ((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def check_args(argv, doc: str, module: str, capture: str, *, heads: bool = False, also: bool = False):
    """A GPU check's command line (with ``--heads`` and ``--also`` where it has them) and its ``--concurrency``
    levels: ``(args, levels)``, levels None (the reason printed) without a CUDA GPU or for a bad list."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--concurrency", default=capture)
    if heads:
        ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--pool", type=int, default=384, help="requests built once; level C rotates pool // C sets")
    if also:
        ap.add_argument("--also", default="", help="comma list of config keys to time in three layouts (see above)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    return args, levels_of(args, module)


def levels_of(args, module: str) -> list[int] | None:
    """The ``--concurrency`` levels of a GPU check; None (the reason printed) without a CUDA GPU or for a bad list."""
    if not torch.cuda.is_available():
        print(f"sparse_mla_tuner.kernels.{module} needs a CUDA GPU", file=sys.stderr)
        return None
    try:
        levels = [int(c) for c in args.concurrency.split(",")]
        if not levels or min(levels) < 1:
            raise ValueError
    except ValueError:
        print(f"--concurrency must be positive integers separated by commas, got {args.concurrency!r}", file=sys.stderr)
        return None
    return levels


def flash_mla_module():
    """FlashMLA's ``flash_mla`` module, or None where it is not installed."""
    try:
        import flash_mla
    except ImportError:
        return None
    return flash_mla


def warm_up_s(fn, *args, **kwargs) -> float:
    """Seconds the first eager ``fn(*args, **kwargs)`` takes (the shape's warm-up), synchronized."""
    t0 = time.perf_counter()
    fn(*args, **kwargs)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def first_call(step, compiles: _Compiles):
    """``step(0)`` run eagerly, its Triton compilations counted."""
    compiles.armed = True
    out = step(0)
    torch.cuda.synchronize()
    compiles.armed = False
    return out


def median_us(step, n_sets: int, samples: int, compiles: _Compiles | None = None) -> float:
    """The median of ``samples`` timings (µs per call) of ``step`` over ``n_sets`` sets in one CUDA graph, as
    ``kernels.bench_call`` times; with ``compiles``, the compilations while capturing are counted."""
    if compiles is not None:
        compiles.armed = True
    sample = timing.sampler(timing.capture(step, n_sets), n_sets, 5.0)
    if compiles is not None:
        compiles.armed = False
    return statistics.median(sample()[0] for _ in range(samples))


def finish(module, argv, out_path, rows, compiles, warm_s, flash_mla, fields, table=None, after=()) -> int:
    """Writes and prints a GPU check's summary (``fields`` after the command) and its table; 0 when every row
    passed and nothing compiled late, else 1."""
    summary = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": f"python -m sparse_mla_tuner.kernels.{module} " + shlex.join(timing.portable_argv(argv)),
        **fields,
        "flash_mla": flash_mla is not None,
        "warm_up_s": round(warm_s or 0.0, 2),
        "late_compiles": compiles.count if compiles.supported else None,
        "ratio_median": round(statistics.median(r["ratio"] for r in rows), 4),
        "ratio_max": max(r["ratio"] for r in rows),
        "hook_vs_direct_median": round(statistics.median(r["hook_vs_direct"] for r in rows), 4),
        "hook_vs_direct_max": max(r["hook_vs_direct"] for r in rows),
    }
    if out_path:
        with open(out_path, "w") as f:
            json.dump({"env": summary, "rows": rows}, f, indent=1)
    from tabulate import tabulate

    print(tabulate(rows if table is None else table, headers="keys", floatfmt=".3f"))
    for line in after:
        print(line)
    print(json.dumps(summary))
    good = all(r["hook_ok"] and r.get("flashmla_ok", True) for r in rows) and not compiles.count
    return 0 if good else 1


def main(argv: list[str] | None = None) -> int:
    args, levels = check_args(argv, __doc__, "sglang_check", CAPTURE, also=True)
    if levels is None:
        return 2
    try:
        also = [KernelConfig.parse(k.strip()) for k in args.also.split(",") if k.strip()]
    except ValueError as e:
        print(f"--also: {e}", file=sys.stderr)
        return 2
    flash_mla = flash_mla_module()
    compiles = _Compiles()
    rows = []
    warm_s = None
    n_pool = max(args.pool, MIN_SETS * max(levels))  # at least MIN_SETS disjoint sets at every level
    pool = make_batch(WINDOW, n_pool, device="cuda", seed=7, q_tokens=1, extra=COMPRESSED, with_sink=True)
    k_engine, x_engine = sglang_plugin.engine_cache(pool.kv_cache), sglang_plugin.engine_cache(pool.extra_kv_cache)
    k_64 = repage(pool.kv_cache).unsqueeze(2).view(torch.float8_e4m3fn)
    for C in levels:
        n_sets = n_pool // C
        sets = [pool.rows(i * C, (i + 1) * C) for i in range(n_sets)]
        ref_out, ref_lse = sparse_mla_decode_ref(*sets[0].args(), **sets[0].kwargs(), sm_scale=512**-0.5)
        engine = [_engine_kwargs(bt, k_engine, x_engine) for bt in sets]
        row = {"C": C, "sets": n_sets}
        if warm_s is None:  # the first call of the shape warms it up: every config its table can pick
            warm_s = warm_up_s(sglang_plugin.sglang_hook, _left, **engine[0])

        def step_hook(i, engine=engine):
            return sglang_plugin.sglang_hook(_left, **engine[i])

        out, lse = first_call(step_hook, compiles)
        ok, rel, _, why = compare(out, lse, ref_out, ref_lse)
        row["hook_ok"], row["hook_rel_err"] = ok, round(rel, 5)
        if flash_mla is not None:
            a, kw = _flashmla_args(sets[0], FLASHMLA_HEADS, k_64)
            fout, _ = flash_mla.flash_mla_with_kvcache(
                *a, flash_mla.get_mla_metadata()[0], **kw, use_legacy=True, kv_format="V4"
            )
            rel_f = rel_err(out, fout[:, :, :HEADS])
            row["vs_flashmla_rel_err"] = round(rel_f, 5)
            row["flashmla_ok"] = rel_f <= 2 * OUT_RTOL  # each within OUT_RTOL of the fp32 reference
        row["hook_us"] = median_us(step_hook, n_sets, args.samples, compiles)
        route = sglang_plugin._ROUTES.get(sglang_plugin._signature(engine[0]))

        def step_direct(i, engine=engine, route=route):  # the kernel call the hook makes, without the hook
            return sglang_plugin._serve(route, engine[i])

        row["direct_us"] = median_us(step_direct, n_sets, args.samples)
        row["hook_vs_direct"] = round(row["hook_us"] / row["direct_us"], 4)
        layer = [_flashmla_args(bt, HEADS, k_64) for bt in sets]
        meta = flashmla_compat.get_mla_metadata()[0]

        def step_layer(i, layer=layer, meta=meta):
            a, kw = layer[i]
            return flashmla_compat.flash_mla_with_kvcache(*a, meta, **kw)

        row["layer_call_us"] = median_us(step_layer, n_sets, args.samples)
        row["ratio"] = round(row["hook_us"] / row["layer_call_us"], 4)
        k_plain = pool.kv_cache  # the window's 256-token pages, unpadded
        k_bench = k_64.view(torch.uint8).squeeze(2)
        x_256 = regroup(pool.extra_kv_cache) if also else None
        for cfg in also:
            layouts = {
                "engine_us": (sglang_plugin._pages(k_engine), sglang_plugin._pages(x_engine)),
                "pages256_us": (k_plain, pool.extra_kv_cache),
                "both256_us": (k_plain, x_256),
                "bench_us": (k_bench, pool.extra_kv_cache),
            }
            got = {}
            for name, (k, x) in layouts.items():

                def step_also(i, k=k, x=x, cfg=cfg, sets=sets):
                    bt = sets[i]
                    return sparse_mla_decode(
                        bt.q,
                        k,
                        bt.indices,
                        kv_format="fp8_model1",
                        sm_scale=512**-0.5,
                        attn_sink=bt.attn_sink,
                        extra_kv_cache=x,
                        extra_indices=bt.extra_indices,
                        extra_kv_format="fp8_model1",
                        config=cfg,
                    )

                got[name] = round(median_us(step_also, n_sets, args.samples), 3)
            row.setdefault("also", {})[str(cfg)] = got
        if not ok:
            row["why"] = why
        rows.append(row)
        print(json.dumps(row), flush=True)
        del sets, engine, layer
        torch.cuda.empty_cache()
    after = [
        f"C={r['C']} {key}: " + ", ".join(f"{k} {v:.2f}" for k, v in got.items())
        for r in rows
        for key, got in r.get("also", {}).items()
    ]
    table = [{k: v for k, v in r.items() if k != "also"} for r in rows]
    return finish("sglang_check", argv, args.out, rows, compiles, warm_s, flash_mla, {"pool": n_pool}, table, after)


if __name__ == "__main__":
    sys.exit(main())
