"""``tuner export``: a kernel's tables, from the database, in the formats its adapter names.

The adapter's :meth:`~tuner.adapter.KernelAdapter.exporters` name the formats and write them (the built-in
kernel's: its engine tables in vLLM's and SGLang's layouts, and a Triton module). A kernel that names none gets the
tuner's own format, :func:`json_tables`: one JSON file per (device, workload), the adapter's
:meth:`~tuner.adapter.KernelAdapter.export_table` of the best ok config per concurrency, beside a provenance
sidecar. Only ``ok`` trials, which passed the correctness gate, are ever exported.

Everything written from stored strings (device and workload names, URLs) is data: a file name keeps only
``[0-9A-Za-z_.+()-]`` (:func:`file_part`), JSON goes through ``json.dumps``. Nothing is written to the database
unless asked (``record=True``, ``tuner export --record``): then each table is also recorded in ``tuner_exports``.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections import defaultdict
from pathlib import Path

from ..db import queries
from ..db.models import ExportModel
from ..db.models import TrialModel
from ..db.paths import PathError
from ..db.paths import check_target
from ..db.paths import folder as safe_folder
from ..db.paths import write_atomic
from ..db.store import Store
from ..db.store import redact_url
from ..db.verdicts import Verdict
from .errors import TunerError
from .progress import Progress

JSON = "json"  # the tuner's own format, of a kernel whose adapter names none
SIDECAR_SUFFIX = ".provenance.json"


def formats(adapter) -> dict:
    """The adapter's export formats by name, the first the default (:meth:`KernelAdapter.exporters`)."""
    return dict(adapter.exporters()) or {JSON: json_tables}


def export(store: Store, adapter, fmt: str | None = None, out_dir=None, **kw):
    """Write ``adapter``'s tables in ``fmt`` (its first format when None): the paths written, or a format's text
    when it allows ``out_dir`` None. ``kw``: ``backend``, ``record``, ``shapes``, ``progress``."""
    found = formats(adapter)
    fmt = fmt or next(iter(found))
    if fmt not in found:
        raise TunerError(f"--format {fmt}: the {adapter.name} kernel's formats are {', '.join(found)}")
    kw.setdefault("progress", Progress(quiet=True))
    return found[fmt](store, adapter, None if out_dir is None else Path(out_dir), **kw)


def records(adapter, fmt: str | None) -> bool:
    """Whether ``fmt`` can record its tables in the database (``--record``): a format that writes a module does not."""
    found = formats(adapter)
    return getattr(found.get(fmt or next(iter(found))), "records", True)


def check_output(path: Path) -> None:
    """TunerError unless ``path`` can be written as a file: nothing there, or a regular file (not a link)."""
    try:
        check_target(path)
    except PathError as e:
        raise TunerError(str(e)) from None


def write_file(path: Path, text: str, root: Path | None = None) -> None:
    """``text`` written atomically to the regular file ``path`` (never through a link, never out of ``root``)."""
    try:
        write_atomic(path, text, root)
    except PathError as e:
        raise TunerError(str(e)) from None


def out_folder(out_dir: Path, sub: str = "") -> Path:
    """The folder a table goes to: ``out_dir`` (the user's choice; a link to a folder is theirs to choose), or a
    folder ``sub`` inside it, never a link out of it."""
    try:
        safe_folder(out_dir)
        if not sub:
            return out_dir
        safe_folder(out_dir / sub, root=out_dir)
    except PathError as e:
        raise TunerError(str(e)) from None
    return out_dir / sub


def recorded_path(path: Path) -> str:
    """Where a table went, as the export history records it: relative to the working directory when
    it lies inside it (a committed database then names no machine's folders), else absolute."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def record_table(s, path: Path, device: str, workload_id: int, content: dict) -> None:
    """A row of ``tuner_exports``: where a table went and what it held."""
    s.add(ExportModel(path=recorded_path(path), device=device, workload_id=workload_id, content=json.dumps(content)))


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def one(values: set[str]) -> str:
    return next(iter(values)) if len(values) == 1 else ",".join(sorted(values))


def file_part(text: str, limit: int = 80) -> str:
    """A stored name as part of a file name: only ``[0-9A-Za-z_.+()-]``, no leading dot, cut when long."""
    return re.sub(r"[^0-9A-Za-z_.+()-]+", "_", str(text)).lstrip(".")[:limit] or "unnamed"


def nothing(store: Store, spec: str) -> TunerError:
    """Why there is nothing of the kernel ``spec`` (:attr:`KernelAdapter.spec`) to export: no ok trial, or only other
    kernels' results."""
    with store.session() as s:
        others = queries.other_adapters(s, spec)
    if others:
        return TunerError(
            f"nothing to export: {redact_url(store.url)} holds results of {others} only, and tuner export writes the "
            f"{spec} kernel's tables (another kernel's: --kernel NAME, its export_table(); docs/adapters.md)"
        )
    return TunerError(f"nothing to export: {redact_url(store.url)} has no ok trial (run `tuner search` first)")


def winners(s, adapter, backend: str | None = None) -> dict[tuple, dict[int, TrialModel]]:
    """{(device, workload, triton): {concurrency: best ok trial}} of ``adapter``'s kernel over every space: at each
    level the newest kernel measured there, and of two spaces' studies of one workload the better trial."""
    groups: dict[tuple, list[TrialModel]] = defaultdict(list)
    for t in queries.trials(s, verdict=Verdict.OK, backend=backend, adapter=adapter.spec):
        env = t.environment
        groups[(t.concurrency, t.study.space.name, t.workload.name, env.gpu_name, t.backend, env.triton)].append(t)
    out: dict[tuple, dict[int, TrialModel]] = defaultdict(dict)
    for (c, *_), ts in sorted(groups.items(), key=lambda kv: kv[0]):
        best = queries.best_of(queries.newest_kernel(ts))
        if best is None:
            continue
        t = queries.pick(list(queries.done_configs(s, best.study_id).values())) or best
        key = (t.environment.gpu_name, t.workload.name, t.environment.triton)
        cur = out[key].get(c)
        out[key][c] = t if cur is None else queries.best_of([cur, t])
    return {k: dict(sorted(v.items())) for k, v in sorted(out.items())}


def json_tables(store: Store, adapter, out_dir: Path | None, *, backend=None, record=False, shapes=(), progress=None):
    """The tuner's own tables: per (device, workload, Triton version) ``WORKLOAD,device_name=DEVICE,triton=V.json``
    holding the adapter's :meth:`~tuner.adapter.KernelAdapter.export_table` of the picks, and its sidecar (each
    entry's config, median and ratio, the kernel hash and the source)."""
    if shapes:
        raise TunerError(f"--shape applies to the sparse_mla kernel's tables, not to the {adapter.name} kernel's")
    if out_dir is None:
        raise TunerError("--format json writes files: give --out DIR")
    progress = progress or Progress(quiet=True)
    folder, source, date, written = out_folder(out_dir), redact_url(store.url), now(), []
    with store.session() as s:
        with progress.slow(f"export: reading the best trials of {source}"):
            found = winners(s, adapter, backend)
        if not found:
            raise nothing(store, adapter.spec)
        task = progress.task("export", total=len(found))
        for (device, workload, triton), by_c in found.items():
            name = f"{file_part(workload)},device_name={file_part(device)},triton={file_part(triton)}.json"
            task.advance(1, postfix=name)
            table = adapter.export_table({c: adapter.recorded_config(t) for c, t in by_c.items()})
            first = next(iter(by_c.values()))
            provenance = {
                "table": name,
                "kernel": adapter.spec,
                "device": device,
                "workload": first.workload.description(),
                "kernel_hash": one({t.study.kernel.source_hash for t in by_c.values()}),
                "triton": triton,
                "date": date,
                "source": source,
                "entries": {str(c): _entry(t) for c, t in by_c.items()},
            }
            path = folder / name
            side = path.with_name(path.name.removesuffix(".json") + SIDECAR_SUFFIX)
            write_file(path, json.dumps(table, indent=1) + "\n", root=out_dir)
            write_file(side, json.dumps(provenance, indent=1) + "\n", root=out_dir)
            if record:
                record_table(
                    s, path, device, first.workload_id, {"format": JSON, "table": table, "provenance": provenance}
                )
            written += [path, side]
        task.close(f"{len(found)} tables")
    return written


def _entry(t: TrialModel) -> dict:
    st = t.statistic()
    return {
        "config": t.config_key,
        "median_us": round(st.median_us, 3),
        "ci_us": [round(st.ci_low_us, 3), round(st.ci_high_us, 3)],
        "ratio_vs_baseline": round(st.ratio, 4),
        "effect": str(st.classification),
        "trial": t.id,
        "space": t.study.space.name,
    }
