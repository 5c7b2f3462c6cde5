"""Compile the split kernel (no GPU needed) and count, per config, what its PTX does.

    python benchmarks/ptx_stats.py T32-w4-s2-c512 T32-w4-s1-c512-p1 ...   # fp8_v32, sm_120, one JSON line each
    python benchmarks/ptx_stats.py --format fp8_model1 --arch 90 --batch 96 T32-w4-s1-c256-p1-b1
    python benchmarks/ptx_stats.py --format fp8_model1 --arch 90 --batch 96 --sass T16-w4-s1-c512-p2   # + SASS counts
    python benchmarks/ptx_stats.py --layer 256,64 --arch 90 --batch 16 --sass T32-w4-s1-c128-p3   # the V4 layer call

``--layer PAGE,XPAGE`` compiles the V4 layer call instead (fp8_model1: the window, top-k 128 on pages of PAGE
tokens, and the compressed cache, top-k 512 on pages of XPAGE tokens, with the sink; SGLang's layout is 256,64).
``--batch`` compiles exactly the launch of a call at that batch (a ``BALANCED=1`` config's balanced
kernel needs one: without it the first variant is the one-split kernel, which runs the per-row code).

Registers and stack come from the cubin (as ``tuner check`` reads them); the counts are static PTX
instructions: byte and wide shared-memory loads, ldmatrix, cp.async, global loads and mma. ``--sass`` adds
the cubin's SASS instructions (``cuobjdump -sass``): their total and the count of each opcode in
:data:`SASS_OPCODES`, e.g. the local loads and stores that spills cost. Used to check a kernel variant's
register, spill and shared-memory cost before it is timed on a GPU.
"""

import argparse
import collections
import json
import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from sparse_mla_tuner.kernels import KernelConfig
from sparse_mla_tuner.kernels import Workload
from sparse_mla_tuner.kernels.bench import TOPK
from sparse_mla_tuner.kernels.decode import compile_spec
from sparse_mla_tuner.tuner.compile_process import cuobjdump
from sparse_mla_tuner.tuner.compile_process import resources

PATTERNS = {
    "ld_shared_b8": r"ld\.shared(?:\.v\d)?\.(?:u8|b8|s8)",
    "ld_shared_wide": r"ld\.shared(?:\.v\d)?\.(?:b16|u16|b32|u32|b64)",
    "ldmatrix": r"ldmatrix",
    "cp_async": r"cp\.async\.(?:ca|cg)",
    "ld_global": r"ld\.global",
    "mma": r"mma\.sync",
}

SASS_OPCODES = ("LDG", "STG", "LDS", "STS", "LDSM", "HMMA", "BAR", "PRMT", "F2FP", "MOV", "LDL", "STL")
SASS_OP = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def sass_counts(cubin: bytes) -> dict:
    """The SASS instructions of a cubin: their total and the count of each opcode in SASS_OPCODES."""
    ops = collections.Counter(SASS_OP.findall(cuobjdump(cubin, "-sass")))
    return {"sass_total": sum(ops.values()), **{f"sass_{op}": ops[op] for op in SASS_OPCODES}}


def stats(key: str, wl: Workload, arch: int = 120, batch: int | None = None, sass: bool = False) -> dict:
    call = {"extra": wl.extra, "attn_sink": wl.attn_sink} if wl.extra is not None else {}
    spec = next(s for s in compile_spec(KernelConfig.parse(key), wl, arch, batch, **call) if s.name == "split")
    k = triton.compile(
        ASTSource(spec.kernel, spec.signature, spec.constexprs, spec.attrs),
        target=GPUTarget("cuda", arch, 32),
        options=spec.options,
    )
    regs, stack = resources(k.asm["cubin"])
    ptx = k.asm["ptx"]
    counts = {name: len(re.findall(pat, ptx)) for name, pat in PATTERNS.items()}
    if sass:
        counts.update(sass_counts(k.asm["cubin"]))
    return {"config": key, "registers": regs, "stack": stack, "shared": k.metadata.shared, **counts}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--format", default="fp8_v32", choices=["fp8_model1", "fp8_v32"])
    ap.add_argument("--arch", type=int, default=120, help="compute capability, e.g. 120 or 90")
    ap.add_argument("--batch", type=int, default=None, help="the launch of a call at this batch size")
    ap.add_argument("--sass", action="store_true", help="also count the cubin's SASS instructions")
    ap.add_argument("--layer", metavar="PAGE,XPAGE", help="the V4 layer call, its caches on these page sizes")
    args = ap.parse_args()
    workload = Workload(args.format, 16, TOPK[args.format], 64, 8192)
    if args.layer:
        try:
            page, xpage = (int(v) for v in args.layer.split(","))
            extra = Workload("fp8_model1", 16, 512, xpage, 8192)
            workload = Workload("fp8_model1", 16, 128, page, 128, extra=extra, attn_sink=True)
        except ValueError as e:
            ap.error(f"--layer takes two positive page sizes, PAGE,XPAGE (e.g. 256,64), got {args.layer!r} ({e})")
    for key in args.configs:
        print(json.dumps(stats(key, workload, args.arch, args.batch, args.sass)), flush=True)
