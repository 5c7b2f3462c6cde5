"""Compile the feasible configs in parallel before a GPU search (fills Triton's on-disk cache).

Each config has two compiled variants of the split kernel (partials or final output). Compiling
them one by one inside the measurement worker would dominate a search's wall time; here a pool of
processes (one per spare CPU core) runs every config once per variant on a tiny batch.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor

from kernels.config import KernelConfig
from kernels.workload import Workload


def _compile(args) -> str:
    wl_fields, cfg_fields = args
    try:
        import torch

        from kernels.decode import sparse_mla_decode
        from kernels.workload import make_batch

        wl = Workload(**{**wl_fields, "context": 256})
        cfg = KernelConfig(**cfg_fields)
        bt = make_batch(wl, 1, device="cuda", seed=0)
        for ctas in (1, 10**6):  # one split (final output) and many (partials + combine)
            c = KernelConfig(cfg.BLOCK_T, cfg.num_warps, cfg.num_stages, ctas)
            sparse_mla_decode(*bt.args(), kv_format=wl.kv_format, config=c)
        torch.cuda.synchronize()
        return ""
    except Exception as e:  # the worker will meet it again and record it
        return f"{cfg_fields}: {type(e).__name__}: {e}"


def warm(configs: list[KernelConfig], workload: Workload, processes: int | None = None) -> list[str]:
    """Compile ``configs`` for ``workload``; returns the errors (empty when all compiled)."""
    n = processes or max(1, min(16, (os.cpu_count() or 2) - 1))
    seen = {(c.BLOCK_T, c.num_warps, c.num_stages): c for c in configs}
    jobs = [(workload.__dict__, c.as_dict()) for c in seen.values()]
    import multiprocessing as mp

    with ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("spawn")) as pool:
        return [e for e in pool.map(_compile, jobs) if e]
