"""What one measurement request costs the measurement process on a GPU (host time, not kernel time).

A search's measurement process times the candidate against the baseline in rounds, each on fresh CUDA-graph
captures over many request sets (cold L2). At a small batch the sets are many (512 at V4 C=1), so what a
capture costs on the host decides a level's time. This prints, per space and batch, the wall time of one
request of ``--rounds`` rounds (the first with the correctness gate and the first captures, then repeats) and
the candidate's median.

    python benchmarks/bench_capture.py [--rounds 10] [--candidate T32-w4-s1-c256-p3]

Needs a CUDA GPU (it runs ``tuner.measure_main``'s runner in this process).
"""

from __future__ import annotations

import argparse
import time

from sparse_mla_tuner.kernels.config import KernelConfig
from sparse_mla_tuner.tuner import measure_main
from sparse_mla_tuner.tuner.protocol import MeasureRequest
from sparse_mla_tuner.tuner.space import load_space

CASES = (
    ("search_spaces/v4_flash_tp4.yaml", 1),
    ("search_spaces/v4_flash_layer_tp4.yaml", 1),
    ("search_spaces/v4_flash_tp4.yaml", 48),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--candidate", default="T32-w4-s1-c256-p3")
    args = ap.parse_args()
    runner = measure_main.Runner()
    cand = KernelConfig.parse(args.candidate)
    for path, batch in CASES:
        space = load_space(path)
        wl = space.workloads[0].workload()
        for i in range(args.repeats):
            t0 = time.perf_counter()
            req = MeasureRequest(wl, batch, cand, space.baseline, args.rounds, 7, i == 0)
            rep = runner.measure(req)
            took = time.perf_counter() - t0
            cand_us = sorted(x for x, _ in rep.samples)[len(rep.samples) // 2] if rep.samples else float("nan")
            what = f"{rep.verdict.value} {args.rounds} rounds in {took:.2f} s"
            print(f"{path} C={batch} {what}, candidate {cand_us:.2f} us")


if __name__ == "__main__":
    main()
