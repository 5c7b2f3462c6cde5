"""The sparse-MLA kernel's sections of ``tuner report`` (:class:`tuner.report.ReportSections`): the call's line,
the note on the bytes a call moves, and the same-run benchmark against FlashMLA that the median plot shows."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from ....db.paths import PathError
from ....db.paths import read_bytes
from ....kernels.workload import Workload
from ...errors import TunerError
from ...report import ReportSections
from ...report import md_code
from .records import workload_of

BENCH_MODULE = "sparse_mla_tuner.kernels.bench"  # the same-run benchmark against FlashMLA (``tuner report --bench``)


@dataclass(frozen=True)
class Bench:
    """A same-run benchmark of ours against FlashMLA (``python -m kernels.bench`` or
    ``kernels.bench_call`` JSON): its name as given, device, date and rows."""

    name: str
    device: str
    date: str
    rows: list[dict]

    def points(self, w: Workload) -> dict[int, tuple[float, float]]:
        """{C: (ours µs, FlashMLA µs)} for workload ``w``: kernels.bench's rows of its format (one cache),
        kernels.bench_call's rows (no format: DeepSeek-V4's layer call, two caches and a sink); both correct."""
        out: dict[int, tuple[float, float]] = {}
        for r in self.rows:
            ours, theirs = r.get("us", r.get("ours_us")), r.get("flashmla_us")
            ok = r.get("correct", r.get("ours_ok")) and r.get("flashmla_correct", r.get("flashmla_ok"))
            if "format" in r:
                fits = w.extra is None and not w.attn_sink and r["format"] == w.kv_format
            else:  # kernels.bench_call times DeepSeek-V4's layer call alone (not V4.1's, whose caches differ)
                fits = w.extra is not None and w.attn_sink and w.kv_format == w.extra.kv_format == "fp8_model1"
            if fits and ok and isinstance(ours, float) and isinstance(theirs, float) and math.isfinite(theirs):
                out.setdefault(int(r["C"]), (ours, theirs))
        return out


def load_bench(path: str) -> Bench:
    """A benchmark JSON file (``{"env": {"device", "date", ...}, "rows": [...]}``); a file of another shape
    is one sentence."""
    try:
        doc = json.loads(read_bytes(path, 64 << 20, "benchmark file"))  # a regular file only, never a FIFO's wait
        env, rows = doc["env"], doc["rows"]
        return Bench(Path(path).name, str(env["device"]), str(env.get("date", "")), [r for r in rows if "C" in r])
    except PathError as e:
        raise TunerError(f"cannot read {path}: {e}") from None
    except (ValueError, KeyError, TypeError, RecursionError):
        raise TunerError(
            f"{path} is not a benchmark of python -m {BENCH_MODULE} or kernels.bench_call "
            '(JSON with "env": {"device", "date"} and "rows")'
        ) from None


def call_text(w: Workload) -> str:
    """What a whole-call workload adds to one cache and one query token, for the workload line."""
    parts = []
    if w.extra is not None:
        e = w.extra
        parts.append(
            f"an extra {md_code(e.kv_format)} cache (topk {e.topk}, page {e.page_size}, context {e.context}) "
            "in the same softmax"
        )
    if w.attn_sink:
        parts.append("a learned attention sink per head")
    if w.q_tokens > 1:
        parts.append(f"{w.q_tokens} query tokens per request")
    return "; the whole call: " + ", ".join(parts) if parts else ""


class SparseMlaSections(ReportSections):
    """The call's shape (cache format, local heads, TP, top-k, page, context, the whole call's rest), the bytes a
    call moves, and FlashMLA beside ours from a same-run benchmark."""

    def workload_line(self, row) -> str:
        w = row
        return (
            f"- Workload: {md_code(w.kv_format)}, {w.heads} local heads (TP {w.tp}), topk {w.topk}, page "
            f"{w.page_size}, context {w.context}{call_text(workload_of(w))}."
        )

    def bytes_note(self) -> str:
        return (
            "- % copy BW: the fewest bytes a call must move (gathered KV rows of every cache attended, q, out, lse, "
            "indices, for every query token) per µs of the best median, as a share of the measured "
            "device-to-device copy bandwidth."
        )

    def load_bench(self, path: str) -> Bench:
        return load_bench(path)


__all__ = ["BENCH_MODULE", "Bench", "SparseMlaSections", "call_text", "load_bench"]
