"""Compile the fp8_v32 split kernel for sm_120 (no GPU needed) and count, per config, what its PTX does.

    python results/ptx_stats.py T32-w4-s2-c512 T32-w4-s1-c512-p1 ...   # one JSON line per config

Registers and stack come from the cubin (as ``tuner check`` reads them); the counts are static PTX
instructions: byte and wide shared-memory loads, ldmatrix, cp.async, global loads and mma. Used to
check a kernel variant's register, spill and shared-memory cost before it is timed on a GPU.
"""

import json
import re
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels import KernelConfig
from kernels import Workload
from kernels.decode import compile_spec
from tuner.compile_process import _resources

PATTERNS = {
    "ld_shared_b8": r"ld\.shared(?:\.v\d)?\.(?:u8|b8|s8)",
    "ld_shared_wide": r"ld\.shared(?:\.v\d)?\.(?:b16|u16|b32|u32|b64)",
    "ldmatrix": r"ldmatrix",
    "cp_async": r"cp\.async\.(?:ca|cg)",
    "ld_global": r"ld\.global",
    "mma": r"mma\.sync",
}


def stats(key: str, wl: Workload) -> dict:
    spec = next(s for s in compile_spec(KernelConfig.parse(key), wl, 120) if s.name == "split")
    k = triton.compile(
        ASTSource(spec.kernel, spec.signature, spec.constexprs, spec.attrs),
        target=GPUTarget("cuda", 120, 32),
        options=spec.options,
    )
    regs, stack = _resources(k.asm["cubin"])
    ptx = k.asm["ptx"]
    counts = {name: len(re.findall(pat, ptx)) for name, pat in PATTERNS.items()}
    return {"config": key, "registers": regs, "stack": stack, "shared": k.metadata.shared, **counts}


if __name__ == "__main__":
    workload = Workload("fp8_v32", 16, 2048, 64, 8192)
    for key in sys.argv[1:]:
        print(json.dumps(stats(key, workload)), flush=True)
