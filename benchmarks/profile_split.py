"""Run the split kernel of one format at one concurrency a dozen times on a GPU, for a profiler.

    ncu -k regex:_split_kernel --launch-skip 6 --launch-count 1 --section SpeedOfLight --section Occupancy \\
        --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \\
        --section SourceCounters python benchmarks/profile_split.py fp8_model1 96

Arguments: the format (fp8_model1: V4, top-k 512; fp8_v32: V3.2, top-k 2048), the concurrency, and optionally a
config (e.g. T32-w4-s1-c256-p3; default: the exported table's). 16 heads, 64-token pages, four rotating request
sets, as `kernels.bench` builds them. Nothing is timed here: the profiler measures.
"""

from __future__ import annotations

import argparse

import torch

from sparse_mla_tuner.kernels.bench import TOPK
from sparse_mla_tuner.kernels.bench import parse_config
from sparse_mla_tuner.kernels.decode import sparse_mla_decode
from sparse_mla_tuner.kernels.workload import Workload
from sparse_mla_tuner.kernels.workload import make_batch

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("format", choices=sorted(TOPK))
    ap.add_argument("concurrency", type=int)
    ap.add_argument("config", nargs="?", default="table", help="a config key, or table (the default: the exported one)")
    args = ap.parse_args()
    if args.concurrency < 1:
        ap.error(f"the concurrency must be a positive integer, got {args.concurrency}")
    config = parse_config(args.config)
    if not torch.cuda.is_available():
        ap.exit(2, "profile_split.py: this needs a CUDA GPU (none is visible)\n")
    C = args.concurrency
    pool = make_batch(Workload(args.format, 16, TOPK[args.format], 64, 8192), 4 * C, device="cuda", seed=1)
    for i in range(12):
        s = (i % 4) * C
        q, idx = pool.q[s : s + C], pool.indices[s : s + C]
        sparse_mla_decode(q, pool.kv_cache, idx, kv_format=args.format, config=config)
    torch.cuda.synchronize()
