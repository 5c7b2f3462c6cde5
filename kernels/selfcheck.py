"""Check the kernel against the reference on small shapes: ``python -m sparse_mla_tuner.kernels.selfcheck``.

Without CUDA the kernel runs under Triton's interpreter (set before the kernel is imported).
"""

from __future__ import annotations

import os
import sys

import torch


def main(argv: list[str] | None = None) -> int:
    import argparse

    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args(argv)  # --help; no options
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        # @triton.jit picks interpreter-or-compiler at import time: start again with it set (isolated from the
        # working folder, as every child of the package's)
        from sparse_mla_tuner import child_argv
        from sparse_mla_tuner import child_env

        os.execve(
            sys.executable,
            child_argv("sparse_mla_tuner.kernels.selfcheck"),
            child_env({**os.environ, "TRITON_INTERPRET": "1"}),
        )
    from tabulate import tabulate

    from . import KernelConfig
    from . import Workload
    from . import make_batch
    from . import sparse_mla_decode
    from .reference import compare
    from .reference import sparse_mla_decode_ref

    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows, all_ok = [], True
    for fmt in ("fp8_model1", "fp8_v32"):
        for cfg in (KernelConfig(16, 4, 2, 1), KernelConfig(16, 4, 2, 64), KernelConfig(32, 4, 2, 64)):
            bt = make_batch(
                Workload(fmt, 16, 100, 64, 400), 3, device=device, with_topk_length=True, invalid_fraction=0.1
            )
            out, lse = sparse_mla_decode(*bt.args(), **bt.kwargs(), config=cfg)
            ok, rel, lse_err, reason = compare(out, lse, *sparse_mla_decode_ref(*bt.args(), **bt.kwargs()))
            all_ok &= ok
            rows.append([fmt, str(cfg), f"{rel:.2e}", f"{lse_err:.2e}", "ok" if ok else f"WRONG: {reason}"])
    backend = "cuda" if device == "cuda" else "interpreter (CPU)"
    print(f"sparse_mla_decode vs reference, B=3 H=16 topk=100, backend: {backend}")
    print(tabulate(rows, headers=["format", "config", "out rel err", "lse abs err", "verdict"]))
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
