"""CUDA-graph timing shared by the benchmark and the tuner's worker.

Decode kernels run for microseconds: a plain launch-per-sample loop measures launch gaps and moves
by ~12 % between runs on an H200, a graph replay by under 1 %. So a sample is many replays of a
graph that holds one call per request set (sets rotate so that consecutive calls miss in L2).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch


def capture(step: Callable[[int], object], n_sets: int, warm: bool = True) -> torch.cuda.CUDAGraph:
    """A graph of ``step(0) … step(n_sets - 1)``, warmed up (compiled, allocated) on a side stream first
    unless ``warm`` is false (the steps already ran: a recapture)."""
    if warm:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for i in range(n_sets):
                step(i)
        torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(n_sets):
            step(i)
    return graph


def sampler(graph: torch.cuda.CUDAGraph, n_sets: int, target_ms: float) -> Callable[[], tuple[float, int]]:
    """``sample() -> (µs per call, calls averaged)``: enough replays for one sample to last ``target_ms``."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    graph.replay()
    end.record()
    torch.cuda.synchronize()
    reps = max(1, int(target_ms / max(start.elapsed_time(end), 1e-3)))

    def sample() -> tuple[float, int]:
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / (reps * n_sets), reps * n_sets

    return sample


def portable_argv(argv: list[str] | None) -> list[str]:
    """A benchmark's command line as recorded: ``--out``'s file by its name alone (where a run wrote it is that
    machine's)."""
    args = list(argv if argv is not None else sys.argv[1:])
    for i, a in enumerate(args):
        if a == "--out" and i + 1 < len(args):
            args[i + 1] = Path(args[i + 1]).name
        elif a.startswith("--out="):
            args[i] = "--out=" + Path(a.removeprefix("--out=")).name
    return args
