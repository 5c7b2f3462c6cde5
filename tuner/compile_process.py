"""The compile process: compile jobs read as JSON on stdin, resource numbers out on stdout.

Started by :func:`tuner.feasibility.compile_numbers` without ``TRITON_INTERPRET``, so that
``@triton.jit`` builds compilable kernels. Each job compiles exactly what the launcher would, from
:func:`kernels.decode.compile_spec`, for the job's arch: on a machine without a GPU this is a
cross-compile (the feasibility check); for the GPU's own arch it fills Triton's on-disk cache
before a search (the warm-up), so the measurement process does not compile inside a trial.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels.config import KernelConfig
from kernels.decode import compile_spec
from kernels.workload import Workload

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


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


def compile_one(job: dict) -> dict:
    """``{config, workload, cc}`` -> the largest shared memory of the call's kernels, and the split
    kernel's registers and stack frame (its worst variant); ``{error}`` when the compiler refuses."""
    cfg, wl, cc = KernelConfig.from_dict(job["config"]), Workload(**job["workload"]), job["cc"]
    shared, regs, stack = 0, 0, 0
    for spec in compile_spec(cfg, wl, cc):
        try:
            k = triton.compile(
                ASTSource(spec.kernel, spec.signature, spec.constexprs, spec.attrs),
                target=GPUTarget("cuda", cc, 32),
                options=spec.options,
            )
        except Exception as e:  # a config the compiler rejects is a verdict, not a crash
            text = str(e).strip()
            return {"error": f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"}
        shared = max(shared, k.metadata.shared)
        if spec.name == "split":
            r, st = _resources(k.asm["cubin"])
            regs, stack = max(regs, r), max(stack, st)
    return {"shared": shared, "registers": regs, "stack": stack}


def main() -> int:
    jobs = json.load(sys.stdin)
    n = min(len(jobs), int(os.environ.get("TUNER_COMPILE_JOBS") or os.cpu_count() or 1))
    if n <= 1:
        results = [compile_one(j) for j in jobs]
    else:
        with ProcessPoolExecutor(max_workers=n) as pool:
            results = list(pool.map(compile_one, jobs))
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
