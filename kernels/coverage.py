"""Which decode shapes the kernel serves on a device, and where each one's config comes from.

One function decides, :func:`coverage`; the engine plugins route calls with it and ``tuner shapes`` prints it, so
an engine's log and the inspector never disagree. It imports neither the tuner nor an engine::

    from sparse_mla_tuner.kernels.coverage import coverage
    c = coverage("fp8_v32", heads=16, topk=2048, q_tokens=2, device_name="NVIDIA H200")
    c.served      # True: the kernel takes the call (subject to the call's own tensors: dtypes, strides)
    c.reason      # None, or the one sentence naming the argument that rules the shape out
    c.origin      # "measured" | "replayed" | "unverified" | "nearest" | "default" | "none" (see Coverage)
    c.tuned       # (heads, topk) of the table whose configs serve, or None
    c.max_rows    # B * s_q served up to this (the table's largest batch); None: no limit
    c.tune        # the command that tunes this shape's own table (None when it has one)

A shape is served when its format, heads, top-k and query tokens are ones the kernel runs (:func:`shape_problem`)
and the device has a usable table for the format (its own, or the nearest tuned shape's by
:func:`kernels.table.nearest_shape`). On Triton's interpreter (device ``cpu-interpreter``) a shape without a
table runs the default config. A batch above the table's largest key is left to the engine (the plugin
checks ``rows`` against :attr:`Coverage.max_rows`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .kv_format import EXTRA_PAIRS
from .kv_format import FORMATS
from .models import MAX_Q_TOKENS
from .models import SERVED_HEADS
from .models import tune_command
from .table import _read_json
from .table import candidates
from .table import device_slug
from .table import load_table
from .table import nearest_shape
from .table import raw_slug
from .table import running_triton
from .table import search_dirs
from .table import sidecar_path
from .table import tuned_shapes

# a call's main cache format (its table's key); fp4_v41 is only the extra cache next to an fp8_v41 main cache
SERVED_FORMATS = ("fp8_model1", "fp8_v32", "fp8_v32_nope", "fp8_v41")
INTERPRETER = "cpu-interpreter"
# the shapes users run (issue 54): `tuner shapes` lists these when no shape is named
USER_HEADS = SERVED_HEADS
USER_TOPKS = (64, 128, 256, 512, 1024, 1152, 2048)


@dataclass(frozen=True)
class Coverage:
    """What :func:`coverage` says of one shape on one device.

    ``origin``: ``measured`` (a table of this very shape whose provenance says it was measured at this shape on
    this device), ``replayed`` (the same, but drawn by ``--backend replay`` from another database's samples of
    this device: a stand-in for measuring), ``unverified`` (a table under this shape's name without provenance,
    or tuned on another edition of the chip), ``nearest`` (no table of its own: the nearest tuned shape's
    configs, ``tuned``; also a table ``tuner export --shape`` wrote from another shape), ``default`` (the
    interpreter without a table: the default config), ``none`` (not served)."""

    kv_format: str
    heads: int
    topk: int
    q_tokens: int
    device: str
    served: bool
    reason: str | None
    origin: str
    tuned: tuple[int, int] | None
    max_rows: int | None
    tune: str | None

    def as_dict(self) -> dict:
        return {
            "kv_format": self.kv_format,
            "heads": self.heads,
            "topk": self.topk,
            "q_tokens": self.q_tokens,
            "device": self.device,
            "served": self.served,
            "reason": self.reason,
            "origin": self.origin,
            "tuned": None if self.tuned is None else f"{self.tuned[0]}x{self.tuned[1]}",
            "max_rows": self.max_rows,
            "tune": self.tune,
        }


def shape_problem(kv_format: str, heads: int, topk: int, q_tokens: int = 1) -> str | None:
    """Why the kernel does not run a shape, naming the argument (None: it does)."""
    fmt = FORMATS.get(kv_format)
    if fmt is not None and fmt.extra_only:
        pairs = ", ".join(main for main, extra in sorted(EXTRA_PAIRS) if extra == kv_format)
        return f"kv_format {kv_format!r} is an extra cache only, next to an {pairs} main cache whose table serves"
    if kv_format not in SERVED_FORMATS:
        return f"kv_format {kv_format!r} (served: {', '.join(SERVED_FORMATS)})"
    if heads not in SERVED_HEADS:
        return f"q has {heads} heads (served: {', '.join(map(str, SERVED_HEADS))})"
    if topk < 1:
        return f"top-k {topk} (served: 1 or more)"
    if not 1 <= q_tokens <= MAX_Q_TOKENS:
        return f"q has {q_tokens} query tokens per request (served: 1 to {MAX_Q_TOKENS})"
    return None


def _stamp(path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_mtime_ns, st.st_size)


def _table_file(device_name: str, kv_format: str, heads: int, topk: int, config_dir=None):
    """The file :func:`kernels.table.lookup_config` reads for this shape, its candidate and its parsed table
    (None when no file is there)."""
    version = running_triton()
    for d in search_dirs(config_dir):
        for c in candidates(Path(d), device_name, kv_format, heads, topk, version):
            stamp = _stamp(c.path)
            if stamp is not None:
                return c, load_table(str(c.path), stamp, _stamp(sidecar_path(c.path)))
    return None


def largest_batch(device_name: str, kv_format: str, heads: int, topk: int, config_dir=None) -> int:
    """The largest batch key of the table ``lookup_config`` reads for this shape (0: none usable)."""
    found = _table_file(device_name, kv_format, heads, topk, config_dir)
    if found is None or found[1].problem:
        return 0
    return max(found[1].configs, default=0)


def _provenance(path: Path) -> tuple[tuple[int, int] | None, str | None]:
    """The ``(heads, topk)`` a table's provenance says was measured, and on which backend (None, None without a
    readable sidecar)."""
    try:
        doc = _read_json(sidecar_path(path))
        w = doc.get("workload") or {}
        return (int(w["heads"]), int(w["topk"])), doc.get("backend")
    except (ValueError, TypeError, KeyError, AttributeError):
        return None, None


def coverage(
    kv_format: str,
    heads: int,
    topk: int,
    *,
    q_tokens: int = 1,
    device_name: str = INTERPRETER,
    config_dir: Path | None = None,
) -> Coverage:
    """Whether the kernel serves ``(kv_format, heads, topk, q_tokens)`` on ``device_name``
    (``torch.cuda.get_device_name()``, or ``cpu-interpreter``) and from which table; see :class:`Coverage`.
    Never raises for a shape: an unserved one says why in ``reason``."""

    def out(served, reason, origin, tuned=None, max_rows=None, tune=None):
        return Coverage(kv_format, heads, topk, q_tokens, device_name, served, reason, origin, tuned, max_rows, tune)

    problem = shape_problem(kv_format, heads, topk, q_tokens)
    if problem:
        return out(False, problem, "none")
    command = tune_command(kv_format, heads, topk)
    shape = nearest_shape(tuned_shapes(device_name, kv_format, config_dir), heads, topk)
    if shape is None:
        if device_name == INTERPRETER:
            return out(True, None, "default", tune=command)
        return out(False, f"no exported {kv_format} table for {device_name}", "none", tune=command)
    found = _table_file(device_name, kv_format, *shape, config_dir)
    if found is None or found[1].problem or not found[1].configs:
        why = found[1].problem if found is not None and found[1].problem else "no usable entry"
        return out(False, f"the table heads={shape[0]}, topk={shape[1]} is not usable: {why}", "none", tune=command)
    cand, table = found
    largest = max(table.configs)
    if shape != (heads, topk):
        return out(True, None, "nearest", shape, largest, command)
    measured, backend = _provenance(cand.path)
    own = cand.slug in (device_slug(device_name), raw_slug(device_name))
    if measured is not None and measured != (heads, topk):
        return out(True, None, "nearest", measured, largest, command)
    if backend == "replay":
        return out(True, None, "replayed", shape, largest, command)
    if measured is None or not own or backend not in ("cuda", None):
        return out(True, None, "unverified", shape, largest, command)
    return out(True, None, "measured", shape, largest, None)


def inventory(
    device_name: str = INTERPRETER,
    formats=SERVED_FORMATS,
    heads=USER_HEADS,
    topks=USER_TOPKS,
    q_tokens=(1,),
    config_dir: Path | None = None,
) -> list[Coverage]:
    """:func:`coverage` of every combination asked (default: the shapes users run, on this device)."""
    return [
        coverage(f, h, k, q_tokens=s, device_name=device_name, config_dir=config_dir)
        for f in formats
        for h in heads
        for k in topks
        for s in q_tokens
    ]


def formats() -> dict[str, int]:
    """The served formats and their bytes per token."""
    return {f: FORMATS[f].bytes_per_token for f in SERVED_FORMATS}
