"""Feasibility before launch: compile the real kernel for the *target* arch, no GPU needed.

``triton.compile(ASTSource(...), target=GPUTarget("cuda", cc, 32))`` produces the target's cubin
and ``metadata.shared`` on any machine. Registers and the stack frame (where ptxas puts spills)
are read from the cubin with the ``cuobjdump`` that ships inside the triton package. The verdict
always comes from the compiled number; :func:`estimate_shared` explains it.

``@triton.jit`` decides interpreter-or-compiler at import time, so compiles run in a child process
started without ``TRITON_INTERPRET`` (several configs in parallel, one per core). Verdicts are
cached by (kernel source hash, triton version, target, config, workload shape) in the results
database (table ``tuner_feasibility``), or, for checks made without one, in a local SQLite file
(``$TUNER_CACHE_DIR`` or ``~/.cache/sparse-mla-tuner``).
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from dataclasses import asdict
from dataclasses import dataclass
from pathlib import Path

import triton

from kernels.config import KernelConfig
from kernels.decode import block_h_for
from kernels.decode import kernel_source_hash
from kernels.kv_format import get_format
from kernels.workload import Workload
from tuner.errors import FeasibilityError
from tuner.space import TARGETS


@dataclass(frozen=True)
class Verdict:
    feasible: bool
    shared_bytes: int  # compiled, the larger of the split and combine kernels
    limit_bytes: int
    registers: int  # per thread, split kernel
    spill_bytes: int  # stack frame of the split kernel (ptxas spills live there)
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


def estimate_shared(config: KernelConfig, workload: Workload) -> int:
    """Shared bytes of the split kernel from the tiles it stages; explains the compiled number.

    Fitted term by term to Triton 3.6's allocation for this kernel (sm_90/sm_120 cubins; the worst
    error over the default space is asserted in tests/test_feasibility.py):

    - ``q`` staged as an mma operand: ``BLOCK_H x D_qk`` bf16;
    - the key tile's layout change before the dots: fp8_model1 reshapes the fp32
      ``[BLOCK_T, 8, 64]`` tile (4 B per element, ``2048 * BLOCK_T``), fp8_v32 the byte tile
      (``512 * BLOCK_T``);
    - ``num_stages >= 2``: one more copy of the gathered bytes in flight (Triton 3.6 gives the
      dependent gather a pipeline distance of 1 whatever ``num_stages`` > 2 says, so stages 3 and 4
      cost next to nothing more): 512 e4m3 + 128 rope + 4 index bytes per token (fp8_model1), the
      rope, scales and index only (180 B, fp8_v32: the e4m3 bytes land in the byte tile above);
    - the epilogue converts the ``[BLOCK_H, 512]`` fp32 accumulator through the same memory after
      the loop, so the kernel needs the larger of loop and epilogue.
    """
    fmt = get_format(workload.kv_format)
    T, block_h = config.BLOCK_T, block_h_for(workload.heads)
    q_tile = block_h * fmt.d_qk * 2
    if fmt.name == "fp8_model1":
        loop = q_tile + T * 512 * 4 + (T * (512 + 128 + 4) if config.num_stages >= 2 else 0)
    else:
        loop = q_tile + T * 512 + (T * 180 if config.num_stages >= 2 else 0)
    epilogue = block_h * 512 * 4
    return max(loop, epilogue)


def _cache_path() -> Path:
    root = Path(os.environ.get("TUNER_CACHE_DIR") or Path.home() / ".cache" / "sparse-mla-tuner")
    root.mkdir(parents=True, exist_ok=True)
    return root / "feasibility.sqlite"


def cache_key(config: KernelConfig, workload: Workload, target: str) -> str:
    """TARGET_CTAS only sets the grid, not the compiled code, so it is not part of the key."""
    shape = (workload.kv_format, workload.heads, workload.topk, workload.page_size)
    compiled = (config.BLOCK_T, config.num_warps, config.num_stages)
    raw = json.dumps([kernel_source_hash(), triton.__version__, target, compiled, shape])
    return hashlib.sha256(raw.encode()).hexdigest()


class _DbCache:
    """The verdict cache in the results database (table ``tuner_feasibility``)."""

    def __init__(self, store) -> None:
        self.store = store

    def get_many(self, keys: list[str]) -> dict[str, dict]:
        from sqlalchemy import select

        from db.models import FeasibilityModel

        out = {}
        with self.store.session() as s:
            for i in range(0, len(keys), 500):
                rows = s.scalars(select(FeasibilityModel).where(FeasibilityModel.key.in_(keys[i : i + 500])))
                out.update({r.key: json.loads(r.value) for r in rows})
        return out

    def put_many(self, items: dict[str, dict]) -> None:
        from db.models import FeasibilityModel

        with self.store.session() as s:
            for k, v in items.items():
                s.merge(FeasibilityModel(key=k, value=json.dumps(v)))


class _Cache:
    """The verdict cache in a local SQLite file, for checks made without a results database."""

    def __init__(self) -> None:
        self.con = sqlite3.connect(_cache_path(), timeout=30)
        self.con.execute("CREATE TABLE IF NOT EXISTS verdict (key TEXT PRIMARY KEY, value TEXT NOT NULL)")

    def get_many(self, keys: list[str]) -> dict[str, dict]:
        out = {}
        for i in range(0, len(keys), 500):
            chunk = keys[i : i + 500]
            q = f"SELECT key, value FROM verdict WHERE key IN ({','.join('?' * len(chunk))})"
            out.update({k: json.loads(v) for k, v in self.con.execute(q, chunk)})
        return out

    def put_many(self, items: dict[str, dict]) -> None:
        with self.con:
            self.con.executemany(
                "INSERT OR REPLACE INTO verdict VALUES (?, ?)", [(k, json.dumps(v)) for k, v in items.items()]
            )


def compile_numbers(jobs: list[dict]) -> list[dict]:
    """Compile each job ``{config, workload, cc}`` in a child process; ``{shared, registers, stack}`` each."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "tuner._compile_worker"],
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        env=env,
    )
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        raise FeasibilityError(f"the compile-only check failed: {tail[0]}")
    return json.loads(proc.stdout)


def _verdict(
    numbers: dict, config: KernelConfig, workload: Workload, target: str, limit: int, max_spill_bytes: int | None
) -> Verdict:
    est = estimate_shared(config, workload)
    if "error" in numbers:
        return Verdict(False, 0, limit, 0, 0, est, f"does not compile for {target}: {numbers['error']}")
    shared, regs, spill = numbers["shared"], numbers["registers"], numbers["stack"]
    reasons = []
    if shared > limit:
        reasons.append(f"shared {fmt_bytes(shared)} > {target} limit {fmt_bytes(limit)}")
    if max_spill_bytes is not None and spill > max_spill_bytes:
        reasons.append(f"spills {fmt_bytes(spill)} > max_spill_bytes {fmt_bytes(max_spill_bytes)}")
    if reasons:
        return Verdict(False, shared, limit, regs, spill, est, "; ".join(reasons))
    note = f"spills {fmt_bytes(spill)} (stack frame)" if spill else ""
    return Verdict(True, shared, limit, regs, spill, est, note)


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
) -> list[Verdict]:
    """Verdicts for many configs of one workload; uncached ones compile in one child process.

    With a results database (``store``) the cache lives there, else in a local SQLite file.
    """
    cc = target_cc(target)
    limit = TARGETS[target]
    if enforce_device and (dev := device_limit()) is not None:
        limit = min(limit, dev)
    cache = _DbCache(store) if store is not None else _Cache()
    keys = [cache_key(c, workload, target) for c in configs]
    known = cache.get_many(keys)
    todo = list({k: i for i, k in enumerate(keys) if k not in known}.values())  # one compile per key
    if todo:
        wl = asdict(workload)
        jobs = [{"config": configs[i].as_dict(), "workload": wl, "cc": cc} for i in todo]
        fresh = {keys[i]: n for i, n in zip(todo, compile_numbers(jobs), strict=True)}
        cache.put_many(fresh)
        known.update(fresh)
    return [_verdict(known[k], c, workload, target, limit, max_spill_bytes) for k, c in zip(keys, configs, strict=True)]


def check(config: KernelConfig, workload: Workload, target: str = "sm_120", **kw) -> Verdict:
    """Does ``config`` fit ``target`` for ``workload``? Compiles (or reads the cache), never launches."""
    return check_many([config], workload, target, **kw)[0]


def out_of_resources_verdict(err: Exception, config: KernelConfig, workload: Workload, target: str) -> Verdict:
    """A launch that raised Triton's ``OutOfResources``, recorded as infeasible with its numbers."""
    required = getattr(err, "required", 0) or 0
    limit = getattr(err, "limit", 0) or 0
    name = getattr(err, "name", "resource")
    reason = f"OutOfResources at launch: {name} {fmt_bytes(required)} > device limit {fmt_bytes(limit)}"
    return Verdict(False, int(required), int(limit), 0, 0, estimate_shared(config, workload), reason)
