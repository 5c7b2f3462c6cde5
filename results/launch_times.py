"""Where a call's time goes: the whole call, its split launch alone and its combine alone, per point.

    python results/launch_times.py [--formats fp8_model1,fp8_v32] [--concurrency 1,8,48,96] \
        [--configs table,T32-w4-s1-c512-p1]

Each is timed as ``kernels.bench`` times the call: rotating request sets (cold L2) captured in one CUDA
graph, median of ``--samples``. The split and combine launches are the call's own (``kernels.decode._plan``),
so their grids and binaries are those of the call; the combine alone reads partials a split run left.
With programmatic dependent launch the two overlap inside the call, so call <= split + combine.
One JSON line per (format, C, config), then a table.
"""

import argparse
import json
import statistics

from tabulate import tabulate

from kernels.bench import TOPK
from kernels.bench import _calls
from kernels.bench import parse_config
from kernels.bench import time_graph
from kernels.config import split_grid
from kernels.decode import _Cache
from kernels.decode import _plan
from kernels.decode import device_name
from kernels.decode import sparse_mla_decode
from kernels.kv_format import get_format
from kernels.table import lookup_config
from kernels.workload import Workload
from kernels.workload import make_batch


def run(launch) -> None:
    launch.kernel[launch.grid](**launch.args, **launch.constexprs, **launch.options)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--formats", default="fp8_model1,fp8_v32")
    ap.add_argument("--concurrency", default="1,8,48,96")
    ap.add_argument("--configs", default="table")
    ap.add_argument("--pool", type=int, default=384)
    ap.add_argument("--samples", type=int, default=7)
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
                plans = [
                    _plan(
                        q.unsqueeze(1),
                        [_Cache(pool.kv_cache, ix.unsqueeze(1), None, fmt)],
                        None,
                        cfg,
                        fmt.d_qk**-0.5,
                        native=True,
                        pdl=True,
                    )
                    for q, ix in zip(qs, idx, strict=True)
                ]

                def part(kind, plans=plans):
                    return lambda j: [run(x) for x in plans[j].launches if x.name == kind]

                row = {"format": name, "C": C, "config": str(cfg), "splits": split_grid(cfg, C, 16, wl.topk).slots}
                call = _calls(sparse_mla_decode, qs, pool.kv_cache, idx, {"kv_format": name, "config": cfg})
                row["call_us"] = statistics.median(time_graph(call, n_sets, args.samples))
                row["split_us"] = statistics.median(time_graph(part("split"), n_sets, args.samples))
                has_combine = any(x.name == "combine" for x in plans[0].launches)
                row["combine_us"] = (
                    statistics.median(time_graph(part("combine"), n_sets, args.samples)) if has_combine else 0.0
                )
                print(json.dumps(row), flush=True)
                rows.append(row)
    print(tabulate(rows, headers="keys", floatfmt=".1f"))


if __name__ == "__main__":
    main()
