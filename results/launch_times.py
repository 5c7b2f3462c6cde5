"""Where a call's time goes: the whole call, its split launch alone and its combine alone, per point.

    python results/launch_times.py [--formats fp8_model1,fp8_v32] [--concurrency 1,8,48,96] \
        [--configs table,T32-w4-s1-c512-p1] [--rules default,min_splits=16,max_rows=8192+unroll_rows=0]

Each is timed as ``kernels.bench`` times the call: rotating request sets (cold L2) captured in one CUDA
graph, median of ``--samples``. The split and combine launches are the call's own (``kernels.decode._plan``),
so their grids and binaries are those of the call; the combine alone reads partials a split run left.
With programmatic dependent launch the two overlap inside the call, and so do back-to-back launches of
one part, so a part alone can look cheaper than it is in the call (docs/benchmarks.md, kernel v8).
``--rules`` times the call and its combine under each named setting of the combine's shape rule
(constants of ``kernels.decode``, named as in ``RULE_CONSTANTS``; ``default`` leaves them), the split
launch once per point. One JSON line per (format, C, config, rule), then a table.
"""

import argparse
import contextlib
import json
import statistics

from tabulate import tabulate

from kernels import decode
from kernels.bench import TOPK
from kernels.bench import _calls
from kernels.bench import parse_config
from kernels.bench import time_graph
from kernels.config import split_grid
from kernels.decode import _Cache
from kernels.decode import _plan
from kernels.decode import device_name
from kernels.decode import sm_count
from kernels.decode import sparse_mla_decode
from kernels.kv_format import get_format
from kernels.table import lookup_config
from kernels.workload import Workload
from kernels.workload import make_batch

# rule key -> kernels.decode constant (the last five exist with the patches of docs/experiments/kernel_v8)
RULE_CONSTANTS = {
    "programs": "COMBINE_PROGRAMS",  # kernel v8's first draft, docs/data/kernel_v8/variants
    "tile": "COMBINE_TILE",
    "min_splits": "COMBINE_TILE_MIN_SPLITS",
    "max_splits": "COMBINE_TILE_MAX_SPLITS",
    "max_rows": "COMBINE_TILE_MAX_ROWS",
    "unroll_rows": "COMBINE_UNROLL_MAX_ROWS",
    "large_chunk": "COMBINE_LARGE_CHUNK",  # o_large_combine_knobs.patch
    "warps": "COMBINE_WARPS",  # o_large_combine_knobs.patch
    "pdl": "COMBINE_PDL",  # p_combine_launch_order.patch
    "late": "COMBINE_LATE_TRIGGER",
    "split_late": "SPLIT_LATE_TRIGGER",  # q_split_late_trigger.patch, on top of p_combine_launch_order.patch
}


def run(launch) -> None:
    launch.kernel[launch.grid](**launch.args, **launch.constexprs, **launch.options)


def call_plans(kv_cache, fmt, qs, idx, cfg) -> list:
    """The call's launches (``kernels.decode._plan``) on each request set."""
    return [
        _plan(
            q.unsqueeze(1),
            [_Cache(kv_cache, ix.unsqueeze(1), None, fmt)],
            None,
            cfg,
            fmt.d_qk**-0.5,
            native=True,
            pdl=True,
            sms=sm_count(kv_cache.device),
        )
        for q, ix in zip(qs, idx, strict=True)
    ]


def part(kind: str, plans: list):
    """step(j): the launches named ``kind`` of request set j's call."""
    return lambda j: [run(x) for x in plans[j].launches if x.name == kind]


@contextlib.contextmanager
def combine_rule(rule: str):
    """``min_splits=16+max_rows=8192``: those constants of kernels.decode for the block, then restored."""
    pairs = [] if rule == "default" else [kv.split("=") for kv in rule.split("+")]
    saved = {RULE_CONSTANTS[k]: getattr(decode, RULE_CONSTANTS[k]) for k, _ in pairs}
    for k, v in pairs:
        setattr(decode, RULE_CONSTANTS[k], int(v))
    try:
        yield
    finally:
        for name, v in saved.items():
            setattr(decode, name, v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--formats", default="fp8_model1,fp8_v32")
    ap.add_argument("--concurrency", default="1,8,48,96")
    ap.add_argument("--configs", default="table")
    ap.add_argument("--pool", type=int, default=384)
    ap.add_argument("--samples", type=int, default=7)
    ap.add_argument("--rules", default="default")
    args = ap.parse_args()
    rows = []
    for name in args.formats.split(","):
        fmt = get_format(name)
        wl = Workload(name, 16, TOPK[name], 64, 8192)
        pool = make_batch(wl, args.pool, device="cuda", seed=1)
        for C in [int(c) for c in args.concurrency.split(",")]:
            n_sets = max(1, args.pool // C)
            qs = [pool.q[i * C : (i + 1) * C] for i in range(n_sets)]
            idx = [pool.indices[i * C : (i + 1) * C] for i in range(n_sets)]
            for text in args.configs.split(","):
                cfg = parse_config(text) or lookup_config(device_name(qs[0].device), name, 16, wl.topk, C)

                splits = split_grid(cfg, C, 16, wl.topk).slots  # the split launch, whatever the rule
                split_us = statistics.median(
                    time_graph(part("split", call_plans(pool.kv_cache, fmt, qs, idx, cfg)), n_sets, args.samples)
                )
                for rule in args.rules.split(","):
                    with combine_rule(rule):
                        ps = call_plans(pool.kv_cache, fmt, qs, idx, cfg)
                        for i in range(n_sets):  # partials for the combine alone to read
                            part("split", ps)(i)
                        combine = [x for x in ps[0].launches if x.name == "combine"]
                        row = {"format": name, "C": C, "config": str(cfg), "rule": rule, "splits": splits}
                        row["shape"] = (
                            "x".join(str(combine[0].constexprs.get(k, "-")) for k in ("CHUNK_S", "BLOCK_D"))
                            if combine
                            else "-"
                        )
                        call = _calls(sparse_mla_decode, qs, pool.kv_cache, idx, {"kv_format": name, "config": cfg})
                        row["call_us"] = statistics.median(time_graph(call, n_sets, args.samples))
                        row["split_us"] = split_us
                        row["combine_us"] = (
                            statistics.median(time_graph(part("combine", ps), n_sets, args.samples)) if combine else 0.0
                        )
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    print(tabulate(rows, headers="keys", floatfmt=".1f"))


if __name__ == "__main__":
    main()
