"""Feasibility before launch: compile the real kernel for the *target* arch, no GPU needed.

``triton.compile(ASTSource(...), target=GPUTarget("cuda", cc, 32))`` produces the target's cubin
and ``metadata.shared`` on any machine. What is compiled comes from :func:`kernels.decode.compile_spec`,
the launcher's own plan, so the check cannot drift from what runs. Registers and the stack frame
(where ptxas puts spills) are read from the cubin with the ``cuobjdump`` that ships inside the
triton package. The verdict always comes from the compiled number; :func:`estimate_shared` explains it.

``@triton.jit`` decides interpreter-or-compiler at import time, so compiles run in the compile
process (:mod:`tuner.compile_process`) started without ``TRITON_INTERPRET``, several kernels in
parallel, each distinct kernel once. Verdicts are cached in the results database (table
``tuner_feasibility``) by (kernel source hash, triton version, target, compile key, workload shape).

Where registers cannot decide the verdict (no ``max_spill_bytes``) a check may stop each compile once
Triton's own shared-memory allocation has run (``registers=False``, the compile process's ``shared``
depth): the verdict is the compiler's ``shared`` for the target, and registers and the stack frame
are left unknown (None). Those numbers are cached apart from full ones, so a search, which records
registers with every trial, still compiles through ptxas.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from dataclasses import dataclass

from .. import child_argv
from .. import child_env
from ..db import queries
from .adapter import default_adapter
from .errors import FeasibilityError
from .space import TARGETS

KernelConfig = Workload = object  # annotations: the adapter's config and workload types


@dataclass(frozen=True)
class Feasibility:
    """Whether a config fits the target, with the compiled numbers (a trial's outcome is a ``db.verdicts.Verdict``)."""

    feasible: bool
    shared_bytes: int  # compiled, the larger of the split and combine kernels
    limit_bytes: int
    registers: int | None  # per thread, split kernel (None: not compiled that far, see registers=False)
    spill_bytes: int | None  # stack frame of the split kernel (ptxas spills live there)
    estimate_bytes: int  # analytic estimate, see estimate_shared
    reason: str  # why it does not fit; for a feasible config, warnings (spills) or ""

    def as_dict(self) -> dict:
        return asdict(self)


def fmt_bytes(n: int) -> str:
    return f"{n:,}".replace(",", " ") + " B"


def target_cc(target: str) -> int:
    if target not in TARGETS:
        raise FeasibilityError(f"unknown target {target!r}; allowed: {sorted(TARGETS)}")
    return int(target.removeprefix("sm_"))


def cache_key(config: KernelConfig, workload: Workload, target: str, depth: str = "cubin", adapter=None) -> str:
    """The compiled binary's identity: the kernel's source hash, Triton's version, the target and the adapter's
    :meth:`~tuner.adapter.KernelAdapter.compile_identity` (the built-in kernel's: its compile key, without
    TARGET_CTAS, which only sets the grid, and the shape). ``depth="shared"`` names the shared-memory-only
    numbers (no registers), kept apart from full ones."""
    adapter = adapter or default_adapter()
    import triton  # the version of the compiler that compiles (imported where a compile is keyed, not at import)

    raw = json.dumps([adapter.source_hash(), triton.__version__, target, *adapter.compile_identity(config, workload)])
    if depth != "cubin":
        raw += f"|{depth}"
    return hashlib.sha256(raw.encode()).hexdigest()


PROGRESS_LINE = re.compile(r"^compiled (\d+)/(\d+)\b")  # the compile process's PROGRESS_FORMAT


def compile_numbers(
    configs: list[KernelConfig],
    workload: Workload,
    cc: int,
    on_progress: Callable[[int, int], None] | None = None,
    depth: str = "cubin",
    on_start: Callable[[subprocess.Popen], None] | None = None,
    jobs_env: dict[str, str] | None = None,
    adapter=None,
) -> list[dict]:
    """Compile each config's kernels for ``sm_<cc>`` in the compile process: ``{shared, registers, stack}``
    or ``{error}`` per config (``depth="shared"``: registers and stack None, see the module docstring).

    ``on_progress(done, total)`` is called with ``(0, total)`` before the first compile, then once per
    finished compile as the process reports it (from this thread, in completion order). ``on_start(proc)``
    gets the compile process as it starts (a background compile's owner kills it when no longer needed);
    ``jobs_env`` adds environment variables (``TUNER_COMPILE_JOBS``: how many cores it uses).
    """
    env = child_env({k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | (jobs_env or {}))
    adapter = adapter or default_adapter()
    wl, kernel = adapter.workload_dict(workload), adapter.spec
    jobs = [{"config": c.as_dict(), "workload": wl, "cc": cc, "depth": depth, "kernel": kernel} for c in configs]
    if on_progress is not None:
        on_progress(0, len(jobs))
    proc = subprocess.Popen(
        child_argv("sparse_mla_tuner.tuner.compile_process"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    if on_start is not None:
        on_start(proc)
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)  # a full pipe blocks
    reader.start()
    other: list[str] = []  # anything else on stderr: the last line explains a failure
    try:
        try:
            proc.stdin.write(json.dumps(jobs))
            proc.stdin.close()
        except BrokenPipeError:  # it died before reading its jobs: its stderr says why
            pass
        for line in proc.stderr:
            m = PROGRESS_LINE.match(line)
            if m is None:
                other.append(line)
            elif on_progress is not None:
                on_progress(int(m.group(1)), int(m.group(2)))
        proc.wait()
        reader.join()
    except BaseException:  # Ctrl-C or a failing callback: no compile process left behind
        proc.kill()
        proc.wait()
        raise
    if proc.returncode != 0:
        tail = "".join(other).strip().splitlines()[-1:] or ["no output"]
        raise FeasibilityError(f"the compile-only check failed: {tail[0]}")
    return json.loads(out[0])


def warm(configs: list[KernelConfig], workload: Workload, cc: int, adapter=None, **kw) -> list[str]:
    """Compile ``configs`` for the GPU's own arch before a search (fills Triton's on-disk cache, which
    the measurement process then hits); returns the compile errors, which the trials will meet again."""
    adapter = adapter or default_adapter()
    unique = list({json.dumps(adapter.compile_identity(c, workload)): c for c in configs}.values())
    return [
        f"{c}: {n['error']}"
        for c, n in zip(unique, compile_numbers(unique, workload, cc, adapter=adapter, **kw), strict=True)
        if "error" in n
    ]


class BackgroundWarm:
    """:func:`warm` on a thread, while the search measures: the measurement process compiles what it
    needs first itself (Triton's JIT, one config at a time) and finds the rest in Triton's on-disk cache
    as this fills it. It leaves ``spare`` cores to the measurement process and the model's worker.
    ``wait()`` returns the seconds it took; ``close()`` stops it (its compiles are not needed any more)."""

    def __init__(self, configs: list[KernelConfig], workload: Workload, cc: int, spare: int = 2, adapter=None) -> None:
        from .compile_process import usable_cores

        self.proc: subprocess.Popen | None = None
        self.errors: list[str] = []
        self.seconds: float | None = None
        self._closed = False
        jobs = str(max(1, usable_cores() - spare))
        t0 = time.monotonic()

        def run() -> None:
            try:
                self.errors = warm(
                    configs, workload, cc, adapter, on_start=self._started, jobs_env={"TUNER_COMPILE_JOBS": jobs}
                )
            except Exception as e:  # noqa: BLE001 - the trials compile (and fail) on their own
                self.errors = [f"background compile: {e}"]
            self.seconds = time.monotonic() - t0

        self.thread = threading.Thread(target=run, name="background-compile", daemon=True)
        self.thread.start()

    def _started(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        if self._closed:
            proc.kill()

    def done(self) -> bool:
        return not self.thread.is_alive()

    def close(self) -> None:
        self._closed = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        self.thread.join(timeout=10)


def _verdict(
    numbers: dict,
    config: KernelConfig,
    workload: Workload,
    target: str,
    limit: int,
    max_spill_bytes: int | None,
    adapter=None,
) -> Feasibility:
    est = (adapter or default_adapter()).estimate_shared(config, workload)
    if "error" in numbers:
        return Feasibility(False, 0, limit, 0, 0, est, f"does not compile for {target}: {numbers['error']}")
    shared, regs, spill = numbers["shared"], numbers.get("registers"), numbers.get("stack")
    reasons = []
    if shared > limit:
        reasons.append(f"shared {fmt_bytes(shared)} > {target} limit {fmt_bytes(limit)}")
    if max_spill_bytes is not None and spill is not None and spill > max_spill_bytes:
        reasons.append(f"spills {fmt_bytes(spill)} > max_spill_bytes {fmt_bytes(max_spill_bytes)}")
    if reasons:
        return Feasibility(False, shared, limit, regs, spill, est, "; ".join(reasons))
    note = f"spills {fmt_bytes(spill)} (stack frame)" if spill else ""  # None: not compiled to SASS
    return Feasibility(True, shared, limit, regs, spill, est, note)


def device_limit() -> int | None:
    """The running GPU's own opt-in shared memory per block, when there is a GPU."""
    try:
        import torch

        if torch.cuda.is_available():
            return int(torch.cuda.get_device_properties(0).shared_memory_per_block_optin)
    except Exception:  # no driver, no device: the target's limit alone applies
        return None
    return None


def check_many(
    configs: list[KernelConfig],
    workload: Workload,
    target: str = "sm_120",
    *,
    max_spill_bytes: int | None = None,
    enforce_device: bool = False,
    store=None,
    on_progress: Callable[[int, int], None] | None = None,
    registers: bool = True,
    adapter=None,
) -> list[Feasibility]:
    """Verdicts for many configs of one workload; uncached ones compile in one compile process.

    With a results database (``store``) verdicts are cached there; without one every check compiles.
    ``on_progress(done, total)`` counts the compiles (one per uncached compile key, see
    :func:`compile_numbers`); it is not called when everything is cached. ``registers=False`` (allowed
    only without ``max_spill_bytes``: spills would decide) stops each compile after shared-memory
    allocation; the verdicts' registers and spill bytes are then None unless full numbers are cached.
    ``adapter``: the kernel's (default: the built-in one).
    """
    adapter = adapter or default_adapter()
    cc = target_cc(target)
    limit = TARGETS[target]
    if enforce_device and (dev := device_limit()) is not None:
        limit = min(limit, dev)
    depth = "cubin" if registers or max_spill_bytes is not None else "shared"
    full = [cache_key(c, workload, target, adapter=adapter) for c in configs]
    keys = full if depth == "cubin" else [cache_key(c, workload, target, depth, adapter) for c in configs]
    known: dict[str, dict] = {}
    if store is not None:
        with store.session() as s:
            known = queries.feasibility_get(s, list(dict.fromkeys(full + keys)))
        # full numbers answer a shared-only question too
        known.update({k: known[f] for f, k in zip(full, keys, strict=True) if f in known})
    todo = list({k: i for i, k in enumerate(keys) if k not in known}.values())  # one compile per key
    if todo:
        numbers = compile_numbers([configs[i] for i in todo], workload, cc, on_progress, depth, adapter=adapter)
        fresh = dict(zip([keys[i] for i in todo], numbers, strict=True))
        if store is not None:
            with store.session() as s:
                queries.feasibility_put(s, fresh)
        known.update(fresh)
    return [
        _verdict(known[k], c, workload, target, limit, max_spill_bytes, adapter)
        for k, c in zip(keys, configs, strict=True)
    ]


def check(config: KernelConfig, workload: Workload, target: str = "sm_120", **kw) -> Feasibility:
    """Does ``config`` fit ``target`` for ``workload``? Compiles (or reads the cache), never launches."""
    return check_many([config], workload, target, **kw)[0]
