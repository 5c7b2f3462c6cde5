"""The compile process: compile jobs read as JSON on stdin, resource numbers out on stdout.

Started by :func:`tuner.feasibility.compile_numbers` without ``TRITON_INTERPRET``, so that
``@triton.jit`` builds compilable kernels. Each job compiles exactly what the launcher would, from
:func:`kernels.decode.compile_spec`, for the job's arch: on a machine without a GPU this is a
cross-compile (the feasibility check); for the GPU's own arch it fills Triton's on-disk cache
before a search (the warm-up), so the measurement process does not compile inside a trial.

Each finished job is reported at once on stderr as one line, ``compiled <done>/<total> <label>``
(:data:`PROGRESS_FORMAT`, in completion order), which ``compile_numbers`` reads while the process
runs; the results come in job order on stdout at the end.

Kernels that several jobs share (the combine kernel is the same for many configs, and variants of one
config often coincide) compile once: the jobs' kernels are listed first, and each distinct one goes to
the pool once.

A job's ``depth`` is ``"cubin"`` (default: through ptxas, for registers and the stack frame) or
``"shared"``: the compile stops inside Triton's own LLIR stage as soon as its shared-memory allocation
pass has run (the backend's pass manager, run up to the conversion to LLVM), and reports the
``ttg.shared`` that pass wrote, the very attribute ``triton.compile`` reports as ``metadata.shared``.
That skips the LLVM conversion and optimization, PTX and ptxas: most of the time, for a verdict that
shared memory alone decides.
"""

from __future__ import annotations

import contextlib
import hashlib
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

from .adapter import DEFAULT
from .adapter import adapter_named
from .environment import compile_jobs
from .environment import usable_cores  # noqa: F401 - feasibility.py takes it from here

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


def resources(cubin: bytes) -> tuple[int, int]:
    """(registers per thread, stack frame bytes) from ``cuobjdump --dump-resource-usage``."""
    out = cuobjdump(cubin, "--dump-resource-usage")
    for line in out.splitlines():
        if "REG:" in line:
            fields = dict(tok.split(":", 1) for tok in line.split() if ":" in tok)
            return int(fields["REG"]), int(fields.get("STACK", 0)) + int(fields.get("LOCAL", 0))
    raise RuntimeError(f"no resource usage in cuobjdump output: {out[:200]!r}")


class _SharedKnown(Exception):  # noqa: N818 - a signal, not an error: the compile stops here on purpose
    def __init__(self, shared: int) -> None:
        self.shared = shared


class _Truncate(Exception):  # noqa: N818
    def __init__(self, pm) -> None:
        self.pm = pm


@contextlib.contextmanager
def _stop_after_shared_allocation():
    """Within: ``triton.compile`` raises :class:`_SharedKnown` once the NVIDIA backend's LLIR stage has run
    its passes up to (not including) the conversion to LLVM, the shared-memory allocation among them.
    None when this Triton has no such hook point (then the caller compiles in full)."""
    try:
        from triton import knobs
        from triton.backends.nvidia import compiler as nv
    except ImportError:
        yield False
        return
    passes = getattr(getattr(getattr(nv, "nvidia", None), "passes", None), "ttgpuir", None)
    if (
        passes is None
        or not hasattr(passes, "add_to_llvmir")
        or not hasattr(knobs.runtime, "add_stages_inspection_hook")
    ):
        yield False
        return

    def cut(pm, *args, **kwargs):  # the backend is adding the conversion: run what it added so far instead
        raise _Truncate(pm)

    def hook(*args, **kwargs):  # (backend, stages, options, language, capability)
        if not args:  # Triton 3.9 first asks the hook for its part of the cache key: a cut compile is its own
            return "sparse_mla_tuner.shared_only", hashlib.sha256(b"sparse_mla_tuner.shared_only").hexdigest()
        if before is not None:
            before(*args, **kwargs)
        stages = args[1]
        make_llir = stages["llir"]

        def llir(src, metadata):
            try:
                return make_llir(src, metadata)
            except _Truncate as t:
                t.pm.run(src, "make_llir")
                raise _SharedKnown(int(src.get_int_attr("ttg.shared") or 0)) from None

        stages["llir"] = llir

    real, before = passes.add_to_llvmir, knobs.runtime.add_stages_inspection_hook
    passes.add_to_llvmir, knobs.runtime.add_stages_inspection_hook = cut, hook
    try:
        yield True
    finally:
        passes.add_to_llvmir, knobs.runtime.add_stages_inspection_hook = real, before


def _adapter(job: dict):
    """The adapter a job names (``kernel``: :attr:`tuner.adapter.KernelAdapter.spec`; the built-in one if none)."""
    return adapter_named(job.get("kernel") or DEFAULT)


def specs_of(job: dict) -> list:
    adapter = _adapter(job)
    cfg, wl = adapter.config_type.from_dict(job["config"]), adapter.workload_from_dict(job["workload"])
    return adapter.compile_specs(cfg, wl, job["cc"])


def refused(job: dict) -> dict | None:
    """``{error}`` when the kernel's planning refuses the job's config for its call (a ValueError, e.g.
    BLOCK_T 16 with an fp4_v41 extra cache: a verdict, not a crash of this process), else None."""
    try:
        specs_of(job)
    except ValueError as e:
        return {"error": f"ValueError: {str(e).splitlines()[0] if str(e) else ''}"}
    return None


def counts_resources(job: dict, spec) -> bool:
    """Whether a kernel's registers and stack frame are a job's (the adapter's ``resource_kernels``, else all)."""
    names = _adapter(job).resource_kernels
    return names is None or spec.name in names


def compile_kernel(spec, cc: int, depth: str = "cubin", resources_too: bool = True) -> dict:
    """One kernel: ``{shared}`` (and ``{registers, stack}`` at depth cubin when ``resources_too``), or ``{error}``."""
    truncated = depth == "shared"
    with _stop_after_shared_allocation() if truncated else contextlib.nullcontext(False) as stops:
        try:
            k = triton.compile(
                ASTSource(spec.kernel, spec.signature, spec.constexprs, spec.attrs),
                target=GPUTarget("cuda", cc, 32),
                options=spec.options,
            )
        except _SharedKnown as known:
            return {"shared": known.shared}
        except _Truncate:  # this Triton adds the conversion outside its LLIR stage: compile in full instead
            return compile_kernel(spec, cc, "cubin", resources_too) | {"registers": None, "stack": None}
        except Exception as e:  # a config the compiler rejects is a verdict, not a crash
            text = str(e).strip()
            return {"error": f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"}
    out = {"shared": k.metadata.shared}  # a cache hit, or a Triton without the hook point: compiled in full
    if resources_too and not (truncated and stops):
        out["registers"], out["stack"] = resources(k.asm["cubin"])
    return out


def combine(results: list[dict], depth: str = "cubin") -> dict:
    """A job's numbers from its kernels': the largest shared memory of the call's kernels, the split
    kernel's registers and stack frame (its worst variant), or the first error."""
    for r in results:
        if "error" in r:
            return {"error": r["error"]}
    out = {"shared": max((r["shared"] for r in results), default=0)}
    if depth == "shared":
        return {**out, "registers": None, "stack": None}
    regs = [r["registers"] for r in results if "registers" in r]
    stacks = [r["stack"] for r in results if "stack" in r]
    return {**out, "registers": max(regs, default=0), "stack": max(stacks, default=0)}


def compile_one(job: dict) -> dict:
    """``{config, workload, cc[, depth]}`` -> the call's numbers (:func:`combine`); ``{error}`` when the
    compiler refuses."""
    depth = job.get("depth", "cubin")
    no = refused(job)
    if no is not None:
        return no
    results = []
    for spec in specs_of(job):
        results.append(compile_kernel(spec, job["cc"], depth, counts_resources(job, spec)))
        if "error" in results[-1]:
            break
    return combine(results, depth)


def _compile_indexed(job: dict, i: int) -> dict:
    """Kernel ``i`` of ``job`` (the pool gets indices: kernels are not picklable, their lists are cheap)."""
    spec = specs_of(job)[i]
    return compile_kernel(spec, job["cc"], job.get("depth", "cubin"), counts_resources(job, spec))


def _report(done: int, total: int, job: dict) -> None:
    cfg = _adapter(job).config_type.from_dict(job["config"])
    label = cfg.compile_label() if hasattr(cfg, "compile_label") else str(cfg)
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
    n = min(len(jobs), compile_jobs())
    # every distinct kernel once: (job, kernel index) of its first use, and each job's kernels by key
    first: dict[tuple, tuple[int, int]] = {}
    kernels_of: list[list[tuple]] = []
    results: list[dict | None] = [refused(job) for job in jobs]
    for j, job in enumerate(jobs):
        keys = [] if results[j] else [(job["cc"], job.get("depth", "cubin"), spec.key()) for spec in specs_of(job)]
        kernels_of.append(keys)
        for i, key in enumerate(keys):
            first.setdefault(key, (j, i))
    waiting = {j: set(keys) for j, keys in enumerate(kernels_of)}
    users: dict[tuple, list[int]] = {}
    for j, keys in enumerate(kernels_of):
        for key in set(keys):
            users.setdefault(key, []).append(j)
    numbers: dict[tuple, dict] = {}
    done = 0

    def finished(key: tuple, value: dict) -> None:
        nonlocal done
        numbers[key] = value
        for j in users[key]:
            waiting[j].discard(key)
            if not waiting[j] and results[j] is None:
                job = jobs[j]
                results[j] = combine([numbers[k] for k in kernels_of[j]], job.get("depth", "cubin"))
                done += 1
                _report(done, len(jobs), job)

    for j, keys in enumerate(kernels_of):  # a job without kernels (none planned, or refused) is done at once
        if not keys:
            results[j] = results[j] or combine([], jobs[j].get("depth", "cubin"))
            done += 1
            _report(done, len(jobs), jobs[j])
    if n <= 1:
        for key, (j, i) in first.items():
            finished(key, _compile_indexed(jobs[j], i))
    else:
        with ProcessPoolExecutor(max_workers=n, initializer=_die_with_parent) as pool:
            futures = {pool.submit(_compile_indexed, jobs[j], i): key for key, (j, i) in first.items()}
            for fut in as_completed(futures):
                finished(futures[fut], fut.result())
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
