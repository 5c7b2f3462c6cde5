"""The compile process: compile jobs read as JSON on stdin, resource numbers out on stdout.

Started by :func:`tuner.feasibility.compile_numbers` without ``TRITON_INTERPRET``, so that
``@triton.jit`` builds compilable kernels. Each job compiles exactly what the launcher would, from
:func:`kernels.decode.compile_spec`, for the job's arch: on a machine without a GPU this is a
cross-compile (the feasibility check); for the GPU's own arch it fills Triton's on-disk cache
before a search (the warm-up), so the measurement process does not compile inside a trial.

Each finished job is reported at once on stderr as one line, ``compiled <done>/<total> <label>``
(:data:`PROGRESS_FORMAT`, in completion order), which ``compile_numbers`` reads while the process
runs; the results come in job order on stdout at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import as_completed

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels.config import KernelConfig
from kernels.decode import compile_spec
from kernels.workload import Workload

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
# one stderr line per finished job; tuner.feasibility.PROGRESS_LINE parses it (kept apart: importing this
# module imports the kernel, which the parent may have under TRITON_INTERPRET)
PROGRESS_FORMAT = "compiled {done}/{total} {label}"


def cuobjdump(cubin: bytes, *flags: str) -> str:
    """What ``cuobjdump FLAGS`` prints for a cubin (e.g. ``--dump-resource-usage``, ``-sass``)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([CUOBJDUMP, *flags, f.name], capture_output=True, text=True).stdout


def _resources(cubin: bytes) -> tuple[int, int]:
    """(registers per thread, stack frame bytes) from ``cuobjdump --dump-resource-usage``."""
    out = cuobjdump(cubin, "--dump-resource-usage")
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
    for spec in compile_spec(cfg, wl, cc, extra=wl.extra, attn_sink=wl.attn_sink, q_tokens=wl.q_tokens):
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


def _report(done: int, total: int, job: dict) -> None:
    label = KernelConfig.from_dict(job["config"]).compile_label()
    print(PROGRESS_FORMAT.format(done=done, total=total, label=label), file=sys.stderr, flush=True)


def _die_with_parent() -> None:
    """On Linux, this process is killed when the process that started it ends, however it ends: a
    ``tuner check`` stopped by SIGTERM or SIGKILL would otherwise leave its compiles running."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def main() -> int:
    _die_with_parent()
    jobs = json.load(sys.stdin)
    n = min(len(jobs), int(os.environ.get("TUNER_COMPILE_JOBS") or os.cpu_count() or 1))
    results: list[dict | None] = [None] * len(jobs)
    if n <= 1:
        for i, job in enumerate(jobs):
            results[i] = compile_one(job)
            _report(i + 1, len(jobs), job)
    else:
        with ProcessPoolExecutor(max_workers=n, initializer=_die_with_parent) as pool:
            futures = {pool.submit(compile_one, job): i for i, job in enumerate(jobs)}
            for done, fut in enumerate(as_completed(futures), 1):
                i = futures[fut]
                results[i] = fut.result()
                _report(done, len(jobs), jobs[i])
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
