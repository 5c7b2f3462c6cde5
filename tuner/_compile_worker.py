"""Child process of :mod:`tuner.feasibility`: compile jobs read as JSON on stdin, numbers out on stdout.

Started without ``TRITON_INTERPRET`` so that ``@triton.jit`` builds compilable kernels.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from functools import lru_cache

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
POINTERS = {
    "Out": "*bf16",
    "Lse": "*fp32",
    "OPart": "*fp32",
    "LPart": "*fp32",
    "Q": "*bf16",
    "KV8": "*u8",
    "KV16": "*bf16",
    "KV32": "*fp32",
    "Idx": "*i32",
    "TopkLen": "*i32",
}
# q strides are multiples of 16 for both formats (H*512 or H*576, 512 or 576): the JIT specializes them so
ALIGNED_INTS = {"stride_qb": "i32", "stride_qh": "i32"}
INTS = {"sm_scale": "fp32", "topk": "i32", "num_tokens": "i32", "tiles_per_split": "i32", "num_splits": "i32"}


def _resources(cubin: bytes) -> tuple[int, int]:
    """(registers per thread, stack frame bytes) from ``cuobjdump --dump-resource-usage``."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([CUOBJDUMP, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if "REG:" in line:
            fields = dict(tok.split(":", 1) for tok in line.split() if ":" in tok)
            return int(fields["REG"]), int(fields.get("STACK", 0)) + int(fields.get("LOCAL", 0))
    raise RuntimeError(f"no resource usage in cuobjdump output: {out[:200]!r}")


def _split_source(cfg: dict, wl: dict):
    from kernels.decode import FORMAT_IDS
    from kernels.decode import _split_kernel
    from kernels.decode import block_h_for

    sig = {**POINTERS, **ALIGNED_INTS, **INTS}
    const = {
        "H": wl["heads"],
        "FORMAT": FORMAT_IDS[wl["kv_format"]],
        "PAGE_SIZE": wl["page_size"],
        "BLOCK_H": block_h_for(wl["heads"]),
        "BLOCK_T": cfg["BLOCK_T"],
        "HAS_TOPK_LEN": False,
        "WRITE_FINAL": False,
        "DOT_F32": False,
        "NATIVE_FP8": None,
    }
    sig.update({k: "constexpr" for k in const})
    names = list(_split_kernel.arg_names)
    attrs = {(names.index(k),): [["tt.divisibility", 16]] for k in list(POINTERS) + list(ALIGNED_INTS)}
    return _split_kernel, sig, const, attrs


@lru_cache(maxsize=8)
def _combine_shared(cc: int) -> int:
    from kernels.decode import _combine_kernel

    sig = {
        "Out": "*bf16",
        "Lse": "*fp32",
        "OPart": "*fp32",
        "LPart": "*fp32",
        "num_splits": "i32",
        "H": "constexpr",
        "BLOCK_S": "constexpr",
    }
    src = ASTSource(_combine_kernel, sig, {"H": 16, "BLOCK_S": 128})
    return triton.compile(src, target=GPUTarget("cuda", cc, 32), options={"num_warps": 4}).metadata.shared


def compile_one(job: dict) -> dict:
    cfg, wl, cc = job["config"], job["workload"], job["cc"]
    fn, sig, const, attrs = _split_source(cfg, wl)
    const["NATIVE_FP8"] = cc >= 89  # as the launcher decides on a GPU of that arch
    try:
        k = triton.compile(
            ASTSource(fn, sig, const, attrs),
            target=GPUTarget("cuda", cc, 32),
            options={"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]},
        )
    except Exception as e:  # a config the compiler rejects is a verdict, not a crash
        return {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"}
    regs, stack = _resources(k.asm["cubin"])
    return {"shared": max(k.metadata.shared, _combine_shared(cc)), "registers": regs, "stack": stack}


def main() -> int:
    jobs = json.load(sys.stdin)
    workers = min(len(jobs), os.cpu_count() or 1)
    if workers <= 1:
        results = [compile_one(j) for j in jobs]
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(compile_one, jobs))
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
