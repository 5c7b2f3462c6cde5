"""The sparse-MLA kernel's export formats (``tuner export``): its autotune tables, from the database.

Formats (only ``ok`` trials, which passed the correctness gate, are ever exported), each read by the
loader it is meant for:

- ``engine`` (default): one flat JSON file per (device, workload) in vLLM's layout,
  ``kv_format=…,heads=…,topk=…,device_name=NVIDIA_H200.json`` holding ``{"<batch>": {parameter: value}}``
  (vLLM's device name: every H200 variant is ``NVIDIA_H200``), plus a ``….provenance.json`` sidecar
  (kernel hash, Triton version, date, redacted source URL, each entry's median, CI and verdict). The
  kernel reads these files itself (:mod:`kernels.table`), and so does vLLM's ``get_moe_configs`` way of
  reading (``json.load``, ``int`` keys, nearest key). A table holds the trials of one Triton version: the
  newest measured for that device and workload.
- ``sglang``: the same tables per Triton version in ``triton_<version>/`` folders (``triton_3_6_0/``), named
  by SGLang's device name (``torch.cuda.get_device_name()`` with spaces as underscores), as SGLang's loader
  looks for them. :mod:`kernels.table` finds them there too (``$SPARSE_MLA_CONFIG_DIR``).
- ``triton``: an importable Python module with a ``triton.Config`` list per (device, workload) and the
  helpers that pick the tuned config per batch (:func:`triton_module`).

Everything written from stored strings (device names, URLs) is data: file names go through
:func:`kernels.table.raw_slug` / :func:`kernels.table.device_slug` (only ``[0-9A-Za-z_.+()-]``, cut when
long), JSON through ``json.dumps``, and the Python module holds them only as ``ascii()`` literals.

Nothing is written to the database unless asked (``record=True``, ``tuner export --record``): then each
table is also recorded in ``tuner_exports``. The formats are the adapter's :meth:`SparseMlaAdapter.exporters`, which
:mod:`tuner.export` drives.
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from pathlib import Path

from sqlalchemy.orm import Session

from ....db import queries
from ....db.models import COLUMNS_ADAPTER
from ....db.models import TrialModel
from ....db.store import Store
from ....db.store import redact_url
from ....db.verdicts import Verdict
from ....kernels.config import PARAMS
from ....kernels.config import Role
from ....kernels.table import ENV_DIR
from ....kernels.table import device_slug
from ....kernels.table import nearest_shape
from ....kernels.table import raw_slug
from ....kernels.table import sidecar_path
from ....kernels.table import table_name
from ....kernels.table import triton_folder
from ....kernels.table import version_tuple
from ...errors import TunerError
from ...export import check_output
from ...export import nothing
from ...export import now
from ...export import one
from ...export import out_folder
from ...export import record_table
from ...export import write_file
from ...progress import Progress
from .records import config_of

FORMATS = ("engine", "sglang", "triton")
DEFAULT_OUT = "tuned_configs"  # in the working directory: an export never writes into the installed package


def default_out_dir() -> Path:
    """Where tables go without ``--out``: ``$SPARSE_MLA_CONFIG_DIR`` when set (the kernel reads it first), else
    ``./tuned_configs``; never the package's own ``kernels/configs/``."""
    return Path(os.environ.get(ENV_DIR) or DEFAULT_OUT)


def winners(s: Session, backend: str | None = None) -> dict[tuple, dict[int, TrialModel]]:
    """{(device, kv_format, heads, topk, triton): {concurrency: best ok trial}} over every space.

    Results belong to the Triton version they were measured with, so each version has its own winners.
    The table name does not carry the page size, so workloads that differ only there share a table
    and the better trial (:func:`db.queries.best_of`) wins each concurrency.
    """
    out: dict[tuple, dict[int, TrialModel]] = defaultdict(dict)
    groups: dict[tuple, list[TrialModel]] = defaultdict(list)
    for t in queries.trials(s, verdict=Verdict.OK, backend=backend, adapter=COLUMNS_ADAPTER):
        if not _within_bounds(t):
            continue  # a row another tool wrote outside the declaration's bounds: never deployed
        env = t.environment
        groups[(t.concurrency, t.study.space.name, t.workload.name, env.gpu_name, t.backend, env.triton)].append(t)
    for (c, *_), ts in sorted(groups.items(), key=lambda kv: kv[0]):
        best = queries.best_of(queries.newest_kernel(ts))
        if best is None:
            continue
        t = queries.pick(list(queries.done_configs(s, best.study_id).values())) or best
        w = t.workload
        key = (t.environment.gpu_name, w.kv_format, w.heads, w.topk, t.environment.triton)
        cur = out[key].get(c)
        out[key][c] = t if cur is None else queries.best_of([cur, t])
    return dict(out)


def _within_bounds(t: TrialModel) -> bool:
    try:
        config_of(t)
    except (TypeError, ValueError):
        return False
    return True


def _provenance_entry(t: TrialModel) -> dict:
    st = t.statistic()
    study = list(queries.done_configs(Session.object_session(t), t.study_id).values())
    return {
        "config": t.config_key,
        # the export rule: among the configs tied with the best (within the band), the baseline if it is
        # one of them, else the best; configs that launch exactly the same kernels are equivalent
        "tied_with": [x.config_key for x in queries.ties(study) if x.id != t.id],
        "equivalent": [x.config_key for x in study if x.duplicate_of == t.id],
        "verdict": str(t.verdict),
        "effect": str(st.classification),
        "phase": str(st.phase),
        "rounds": st.n,
        "median_us": round(st.median_us, 3),
        "ci_us": [round(st.ci_low_us, 3), round(st.ci_high_us, 3)],
        "baseline_median_us": round(st.baseline_median_us, 3),
        "ratio_vs_baseline": round(st.ratio, 4),
        "ratio_ci": [round(st.ratio_ci_low, 4), round(st.ratio_ci_high, 4)],
        "noise_band": round(st.noise_band, 4),
        "trial": t.id,
        "space": t.study.space.name,
        "page_size": t.workload.page_size,
        "kernel_hash": t.study.kernel.source_hash,
        "triton": t.environment.triton,
    }


def parse_shape(text: str) -> tuple[int, int]:
    """``HEADSxTOPK`` (``8x128``) -> ``(8, 128)``; TunerError saying what is allowed otherwise."""
    m = re.fullmatch(r"\s*([1-9][0-9]{0,5})\s*[xX]\s*([1-9][0-9]{0,8})\s*", str(text))
    if not m:
        raise TunerError(f"--shape must be HEADSxTOPK with positive integers (e.g. 8x128), got {str(text)[:60]!r}")
    return int(m.group(1)), int(m.group(2))


def named_shapes(groups: dict[tuple, dict], shapes) -> dict[tuple, dict]:
    """The winners of the shapes a user names, per device, format and Triton version: a tuned shape's own, else
    those of the tuned shape :func:`kernels.table.nearest_shape` picks for it (the rule the SGLang plugin applies
    at run time; the sidecar's ``workload`` then names the shape that was measured)."""
    tuned: dict[tuple, set] = defaultdict(set)
    for device, kv, heads, topk, triton in groups:
        tuned[(device, kv, triton)].add((heads, topk))
    out = {}
    for (device, kv, triton), have in tuned.items():
        for heads, topk in shapes:
            src = nearest_shape(have, heads, topk)
            out[(device, kv, heads, topk, triton)] = groups[(device, kv, *src, triton)]
    return out


def tables(s: Session, backend: str | None, fmt: str, shapes=None) -> dict[tuple[str, str], dict[int, TrialModel]]:
    """{(folder, file name): {concurrency: trial}}: what each format writes where (folder "" = the top).

    ``engine``: vLLM's device name (H200 variants as one), the newest Triton version measured per table.
    ``sglang``: SGLang's device name, one ``triton_<version>/`` folder per version. Stored names that map to
    one file (two H200 variants, two names that differ only in characters a file name cannot hold) share
    it, the better trial winning each concurrency. ``shapes``: only these ``(heads, topk)``, each from its own
    trials or the nearest tuned shape's (:func:`named_shapes`)."""
    groups = winners(s, backend)
    if shapes:
        groups = named_shapes(groups, shapes)
    if fmt == "engine":
        newest: dict[tuple, str] = {}
        for device, kv, heads, topk, triton in groups:
            k = (device_slug(device), kv, heads, topk)
            if k not in newest or version_tuple(triton) > version_tuple(newest[k]):
                newest[k] = triton
    out: dict[tuple[str, str], dict[int, TrialModel]] = defaultdict(dict)
    for (device, kv, heads, topk, triton), by_c in sorted(groups.items()):
        if fmt == "engine":
            if newest[(device_slug(device), kv, heads, topk)] != triton:
                continue
            where = ("", table_name(device, kv, heads, topk))
        else:
            where = (triton_folder(triton), table_name(device, kv, heads, topk, slug=raw_slug(device)))
        for c, t in by_c.items():
            cur = out[where].get(c)
            out[where][c] = t if cur is None else queries.best_of([cur, t])
    return {k: dict(sorted(v.items())) for k, v in sorted(out.items())}


def export_tables(
    store: Store,
    out_dir: Path | None = None,
    backend: str | None = None,
    fmt: str = "engine",
    record: bool = False,
    shapes=None,
    progress: Progress | None = None,
) -> list[Path]:
    """Write each table and its provenance sidecar; returns the paths written (table, sidecar, ...).

    ``record``: also add a row per table to the database's ``tuner_exports`` (else the database is only read).
    ``shapes``: ``(heads, topk)`` pairs: only the tables of these shapes (see :func:`named_shapes`).
    ``progress`` shows the reading and each table written on stderr.
    """
    progress = progress or Progress(quiet=True)
    if fmt not in ("engine", "sglang"):
        raise TunerError(f"export format must be engine or sglang here, got {fmt!r}")
    out_dir = Path(out_dir) if out_dir is not None else default_out_dir()
    out_folder(out_dir)
    source = redact_url(store.url)
    date = now()
    written = []
    with store.session() as s:
        with progress.slow(f"export: reading the best trials of {source}"):
            found = tables(s, backend, fmt, shapes)
        if not found:
            raise nothing(store, COLUMNS_ADAPTER)
        task = progress.task("export", total=len(found))
        for (sub, name), by_c in found.items():
            task.advance(1, postfix=name)
            folder = out_folder(out_dir, sub)  # a triton_<version>/ inside it: never a link out of it
            first = next(iter(by_c.values()))
            w = first.workload
            table = {str(c): config_of(t).as_dict() for c, t in by_c.items()}
            path = folder / name
            provenance = {
                "table": path.name,
                "device": one({t.environment.gpu_name for t in by_c.values()}),
                "workload": {"kv_format": w.kv_format, "heads": w.heads, "topk": w.topk},
                "kernel_hash": one({t.study.kernel.source_hash for t in by_c.values()}),
                "triton": one({t.environment.triton for t in by_c.values()}),
                "backend": one({t.backend for t in by_c.values()}),
                "date": date,
                "source": source,
                "lookup": "nearest batch key; a tie goes to the smaller key",
                "entries": {str(c): _provenance_entry(t) for c, t in by_c.items()},
            }
            text = json.dumps(table, indent=1) + "\n"
            side = sidecar_path(path)
            side_text = json.dumps(provenance, indent=1) + "\n"
            write_file(path, text, root=out_dir)
            write_file(side, side_text, root=out_dir)
            if record:
                content = {"format": fmt, "table": table, "provenance": provenance}
                record_table(s, path, provenance["device"], first.workload_id, content)
            written += [path, side]
        task.close(f"{len(found)} tables")
    return written


def exporter(fmt: str):
    """``tuner export --format FMT`` of the engine layouts (``engine``, ``sglang``), as :mod:`tuner.export` calls it."""

    def write(store, adapter, out_dir, *, backend=None, record=False, shapes=(), progress=None) -> list[Path]:
        named = [parse_shape(x) for x in shapes]
        return export_tables(store, out_dir, backend, fmt, record=record, shapes=named, progress=progress)

    return write


def triton_exporter(store, adapter, out_dir, *, backend=None, record=False, shapes=(), progress=None):
    """``tuner export --format triton``: the module's text (``out_dir`` None), else the file written there."""
    if shapes:
        raise TunerError("--shape applies to the engine and sglang formats, not to --format triton")
    if out_dir is not None:
        check_output(out_dir)
    text = triton_module(store, backend, progress)
    if out_dir is None:
        return text
    write_file(out_dir, text)  # atomically, a regular file only (never a FIFO, never through a link)
    return [out_dir]


triton_exporter.records = False  # a module, not a table: --record does not apply


def _ident(*parts) -> str:
    """An ASCII identifier part from any strings (letters, digits and underscores only)."""
    return re.sub(r"[^0-9A-Za-z]+", "_", "_".join(map(str, parts))).strip("_").upper() or "UNNAMED"


# The module's fixed code: how a caller picks the tuned config per batch. Nothing here is built from data.
_HELPERS = '''

def nearest_batch(name, batch):
    """The tuned batch size nearest ``batch`` (a tie goes to the smaller, as vLLM's ``min`` over sorted keys)."""
    keys = sorted(CONFIG_INDEX[name])
    return min(keys, key=lambda k: abs(k - batch))


def config_for(name, batch):
    """The tuned ``triton.Config`` for ``batch``: ``CONFIGS[name][CONFIG_INDEX[name][nearest batch]]``."""
    return CONFIGS[name][CONFIG_INDEX[name][nearest_batch(name, batch)]]


def target_ctas(name, batch):
    """The tuned ``TARGET_CTAS`` for ``batch``: the launcher's split target (it sizes the grid)."""
    return TARGET_CTAS[name][nearest_batch(name, batch)]


def prune_configs_by(name, batch_arg):
    """``triton.autotune(prune_configs_by=...)``: keeps only the config tuned for the batch size that the
    kernel argument ``batch_arg`` holds (an int, or a tensor whose first dimension is the batch)."""

    def early_config_prune(configs, named_args, **kwargs):
        batch = {**named_args, **kwargs}[batch_arg]
        batch = int(batch.shape[0]) if hasattr(batch, "shape") else int(batch)
        return [configs[CONFIG_INDEX[name][nearest_batch(name, batch)]]]

    return {"early_config_prune": early_config_prune}


def no_timing(kernel_call, quantiles):
    """``triton.autotune(do_bench=...)`` that times nothing: the configs were timed by the tuner. (Triton 3.9
    skips timing a lone pruned config by itself; older versions time it.)"""
    return [0.0] * len(quantiles)


def autotune_kwargs(name, batch_arg):
    """Everything ``triton.autotune`` needs to run the tuned config per batch without re-timing::

        kernel = triton.autotune(**autotune_kwargs(NAME, "B"))(kernel)
    """
    return {
        "configs": CONFIGS[name],
        "key": [batch_arg],
        "prune_configs_by": prune_configs_by(name, batch_arg),
        "do_bench": no_timing,
    }
'''


def triton_module(store: Store, backend: str | None = None, progress: Progress | None = None) -> str:
    """The winners as an importable module: per (device, workload) a ``list`` of ``triton.Config``.

    A ``triton.Config`` holds only the kernel's meta-parameters (``KernelConfig.meta()``, all kernel
    arguments) and compile options (``num_warps``, ``num_stages``, ``maxnreg``): the JIT rejects any other
    keyword. The launch-side ``TARGET_CTAS`` shapes the grid, so it travels beside the list, per batch.
    The module's helpers (``config_for``, ``target_ctas``, ``prune_configs_by``, ``autotune_kwargs``) pick the
    tuned config per batch; ``tests/test_export.py`` runs them.
    """
    progress = progress or Progress(quiet=True)
    with store.session() as s:
        with progress.slow(f"export: reading the best trials of {redact_url(store.url)}"):
            found = tables(s, backend, "engine")
        if not found:
            raise nothing(store, COLUMNS_ADAPTER)
        body, names, meta_rows = [], [], {}
        task = progress.task("export", total=len(found))
        for (_, _file), by_c in found.items():
            task.advance(1, postfix=_file)
            first = next(iter(by_c.values()))
            w = first.workload
            devices = sorted({t.environment.gpu_name for t in by_c.values()})
            name = base = _ident(w.kv_format, f"H{w.heads}", f"TOPK{w.topk}", device_slug(devices[0]))
            n = 2
            while name in names:  # two stored names with one identifier: both kept
                name, n = f"{base}_{n}", n + 1
            names.append(name)
            compiled: dict[tuple, list[int]] = {}
            for c, t in by_c.items():
                compiled.setdefault(config_of(t).compile_key(), []).append(c)
            index = {c: i for i, cs in enumerate(compiled.values()) for c in cs}
            meta_rows[name] = {
                "devices": devices,
                "kv_format": w.kv_format,
                "heads": w.heads,
                "topk": w.topk,
                "kernel_hash": sorted({t.study.kernel.source_hash for t in by_c.values()}),
                "triton": sorted({t.environment.triton for t in by_c.values()}),
                "median_us": {c: round(t.statistic().median_us, 3) for c, t in by_c.items()},
            }
            body += ["", f"CONFIGS_{name} = ["]
            for cs in compiled.values():
                t = by_c[cs[0]]
                kw = config_of(t).triton_config_kwargs()
                options = "".join(f", {k}={int(v)!r}" for k, v in kw.items() if k != "kwargs")
                meta = {str(k): int(v) for k, v in kw["kwargs"].items()}
                keys = ", ".join(f"C={c} {config_of(by_c[c])}" for c in cs)  # each batch's own pick
                body.append(f"    triton.Config({meta!r}{options}),  # {keys}")
            body += [
                "]",
                f"CONFIG_INDEX_{name} = { ({int(c): i for c, i in index.items()})!r}",
                f"TARGET_CTAS_{name} = { ({int(c): int(t.TARGET_CTAS) for c, t in by_c.items()})!r}",
            ]
        task.close(f"{len(found)} tables")
    meta = ", ".join(p.name for p in PARAMS if p.role is Role.META)
    options = ", ".join(p.name for p in PARAMS if p.role is Role.OPTION)
    head = [
        '"""Tuned configs of the sparse-MLA decode kernel, written by `tuner export --format triton`.',
        "",
        "Per device and workload NAME (see TABLES): CONFIGS_<NAME>, a list of triton.Config holding the",
        f"kernel's meta-parameters ({meta}, all kernel arguments) and compile options ({options};",
        "a 0 maxnreg is left out); CONFIG_INDEX_<NAME>, batch size -> the index of the config tuned there;",
        "TARGET_CTAS_<NAME>, batch size -> the launch-side split target (it sizes the grid: not a kernel",
        "argument). BALANCED=1 changes the grid's shape too: kernels.config.split_grid gives it.",
        "",
        "Pick by batch, never by re-timing (the tuner measured these under its noise control):",
        "",
        "    cfg = config_for(NAME, B)          # the tuned triton.Config for the nearest tuned batch",
        "    ctas = target_ctas(NAME, B)        # and its TARGET_CTAS, for the grid",
        "    kernel = triton.autotune(**autotune_kwargs(NAME, 'B'))(kernel)   # or let autotune pick it",
        "",
        "autotune_kwargs gives triton.autotune the configs, key=[batch_arg], a prune_configs_by that keeps",
        "the tuned config for the batch, and a do_bench that times nothing.",
        '"""',
        "",
        "import triton",
        "",
        f"SOURCE = {ascii(redact_url(store.url))}",
        "# NAME -> the device names (as stored), workload, kernel hash, Triton version and median per batch",
        f"TABLES = {ascii(meta_rows)}",
        *body,
        "",
        "CONFIGS = {" + ", ".join(f"{n!r}: CONFIGS_{n}" for n in names) + "}",
        "CONFIG_INDEX = {" + ", ".join(f"{n!r}: CONFIG_INDEX_{n}" for n in names) + "}",
        "TARGET_CTAS = {" + ", ".join(f"{n!r}: TARGET_CTAS_{n}" for n in names) + "}",
    ]
    exported = [f"{p}_{n}" for n in names for p in ("CONFIGS", "CONFIG_INDEX", "TARGET_CTAS")]
    helpers = ["nearest_batch", "config_for", "target_ctas", "prune_configs_by", "no_timing", "autotune_kwargs"]
    tail = [
        "",
        "__all__ = " + repr(["SOURCE", "TABLES", "CONFIGS", "CONFIG_INDEX", "TARGET_CTAS", *exported, *helpers]),
    ]
    return "\n".join(head) + "\n" + _HELPERS + "\n".join(tail) + "\n"
