"""``tuner export``: the kernel's autotune tables, from the database.

Formats (only ``ok`` trials, which passed the correctness gate, are ever exported):

- ``engine`` (default): one flat JSON file per (device, workload) in the layout serving engines
  use, ``kv_format=…,heads=…,topk=…,device_name=NVIDIA_H200.json`` holding
  ``{"<batch>": {parameter: value}}``, plus a ``….provenance.json`` sidecar (kernel hash, Triton
  version, date, redacted source URL, each entry's median, CI and verdict). The kernel reads these
  files itself (:mod:`kernels.table`).
- ``sglang``: the same files in a ``triton_<version>/`` folder (``triton_3_6_0/``), as SGLang keeps them.
- ``triton``: an importable Python module with a ``triton.Config`` list per (device, workload).
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections import defaultdict
from pathlib import Path

from sqlalchemy.orm import Session

from db import queries
from db.models import ExportModel
from db.models import TrialModel
from db.store import Store
from db.store import redact_url
from db.verdicts import Verdict
from kernels.config import PARAMS
from kernels.config import Role
from kernels.table import CONFIG_DIR
from kernels.table import sidecar_path
from kernels.table import table_name
from tuner.errors import TunerError

FORMATS = ("engine", "sglang", "triton")


def winners(s: Session, backend: str | None = None) -> dict[tuple, dict[int, TrialModel]]:
    """{(device, kv_format, heads, topk): {concurrency: best ok trial}} over every space.

    The table name does not carry the page size, so workloads that differ only there share a table
    and the better trial (:func:`db.queries.best_of`) wins each concurrency.
    """
    out: dict[tuple, dict[int, TrialModel]] = defaultdict(dict)
    levels = sorted({t.concurrency for t in queries.trials(s, verdict=Verdict.OK, backend=backend)})
    for c in levels:
        for best in queries.best(s, c, backend=backend):
            t = queries.pick(list(queries.done_configs(s, best.study_id).values())) or best
            w = t.workload
            key = (t.environment.gpu_name, w.kv_format, w.heads, w.topk)
            cur = out[key].get(c)
            out[key][c] = t if cur is None else queries.best_of([cur, t])
    return dict(out)


def _nothing(store: Store) -> TunerError:
    return TunerError(f"nothing to export: {redact_url(store.url)} has no ok trial (run `tuner search` first)")


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


def _one(values: set[str]) -> str:
    return next(iter(values)) if len(values) == 1 else ",".join(sorted(values))


def triton_folder(version: str) -> str:
    """SGLang's folder for a Triton version: ``3.6.0`` -> ``triton_3_6_0``."""
    return "triton_" + re.sub(r"[^0-9A-Za-z]+", "_", version).strip("_")


def export_tables(
    store: Store, out_dir: Path | None = None, backend: str | None = None, fmt: str = "engine"
) -> list[Path]:
    """Write each table and its provenance sidecar; returns the paths written (table, sidecar, ...)."""
    if fmt not in ("engine", "sglang"):
        raise TunerError(f"export format must be engine or sglang here, got {fmt!r}")
    out_dir = Path(out_dir or CONFIG_DIR)
    source = redact_url(store.url)
    date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    written = []
    with store.session() as s:
        groups = winners(s, backend)
        if not groups:
            raise _nothing(store)
        for (device, kv_format, heads, topk), trials in sorted(groups.items()):
            by_c = dict(sorted(trials.items()))
            tritons = {t.environment.triton for t in by_c.values()}
            folder = out_dir / triton_folder(_one(tritons)) if fmt == "sglang" else out_dir
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise TunerError(f"cannot write to {folder}: {e.strerror}") from None
            table = {str(c): t.config().as_dict() for c, t in by_c.items()}
            path = folder / table_name(device, kv_format, heads, topk)
            provenance = {
                "table": path.name,
                "device": device,
                "workload": {"kv_format": kv_format, "heads": heads, "topk": topk},
                "kernel_hash": _one({t.study.kernel.source_hash for t in by_c.values()}),
                "triton": _one(tritons),
                "backend": _one({t.backend for t in by_c.values()}),
                "date": date,
                "source": source,
                "lookup": "nearest batch key; a tie goes to the smaller key",
                "entries": {str(c): _provenance_entry(t) for c, t in by_c.items()},
            }
            text = json.dumps(table, indent=1) + "\n"
            side = sidecar_path(path)
            side_text = json.dumps(provenance, indent=1) + "\n"
            try:
                path.write_text(text)
                side.write_text(side_text)
            except OSError as e:
                raise TunerError(f"cannot write {path}: {e.strerror}") from None
            content = json.dumps({"format": fmt, "table": table, "provenance": provenance})
            workload_id = next(iter(by_c.values())).workload_id
            s.add(ExportModel(path=_recorded_path(path), device=device, workload_id=workload_id, content=content))
            written += [path, side]
    return written


def _recorded_path(path: Path) -> str:
    """Where a table went, as the export history records it: relative to the working directory when
    it lies inside it (a committed database then names no machine's folders), else absolute."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _ident(*parts) -> str:
    return re.sub(r"\W+", "_", "_".join(map(str, parts))).strip("_").upper()


def triton_module(store: Store, backend: str | None = None) -> str:
    """The winners as an importable module: per (device, workload) a ``list`` of ``triton.Config``.

    A ``triton.Config`` holds only the kernel's meta-parameters (``KernelConfig.meta()``) and compile
    options (``num_warps``, ``num_stages``, ``maxnreg``): the JIT rejects any other keyword. The
    launch-side ``TARGET_CTAS`` shapes the grid, so it travels beside the list, per batch.
    """
    with store.session() as s:
        groups = winners(s, backend)
        if not groups:
            raise _nothing(store)
        body = []
        names = []
        for (device, kv_format, heads, topk), trials in sorted(groups.items()):
            by_c = dict(sorted(trials.items()))
            name = _ident(kv_format, f"H{heads}", f"TOPK{topk}", device)
            names.append(name)
            compiled: dict[tuple, list[int]] = {}
            for c, t in by_c.items():
                compiled.setdefault(t.config().compile_key(), []).append(c)
            index = {c: i for i, cs in enumerate(compiled.values()) for c in cs}
            kernels_ = sorted({t.study.kernel.source_hash for t in by_c.values()})
            tritons = sorted({t.environment.triton for t in by_c.values()})
            body += [
                "",
                f"# {device}, {kv_format}, {heads} local heads, topk {topk}; kernel {', '.join(kernels_)}, "
                f"triton {', '.join(tritons)}",
                f"CONFIGS_{name} = [",
            ]
            for cs in compiled.values():
                t = by_c[cs[0]]
                kw = t.config().triton_config_kwargs()
                options = "".join(f", {k}={v!r}" for k, v in kw.items() if k != "kwargs")
                medians = ", ".join(f"C={c} {by_c[c].statistic().median_us:.2f} us" for c in cs)
                body.append(f"    triton.Config({kw['kwargs']!r}{options}),  # {medians}")
            body += [
                "]",
                f"# batch -> index into CONFIGS_{name} (the tuned winner at that batch)",
                f"CONFIG_INDEX_{name} = {index!r}",
                "# batch -> TARGET_CTAS, read by the launcher (grid size), not a kernel argument",
                f"TARGET_CTAS_{name} = { ({c: t.TARGET_CTAS for c, t in by_c.items()})!r}",
            ]
    meta = ", ".join(p.name for p in PARAMS if p.role is Role.META)
    options = ", ".join(p.name for p in PARAMS if p.role is Role.OPTION)
    head = [
        '"""Tuned configs of the sparse-MLA decode kernel, written by `tuner export --format triton`.',
        "",
        "Per device and workload: CONFIGS_<NAME>, a list of triton.Config for",
        "@triton.autotune(configs=CONFIGS_<NAME>, key=[...]) holding the kernel's meta-parameters",
        f"({meta}) and compile options ({options}; a 0 maxnreg is left out);",
        "CONFIG_INDEX_<NAME>, the winner per batch size; TARGET_CTAS_<NAME>, the launch-side split target",
        "per batch size (it sizes the grid, so the launcher reads it for the nearest batch key; it is not",
        "a kernel argument). BALANCED=1 changes the grid's shape too: kernels.config.split_grid gives it.",
        f"Source: {redact_url(store.url)}; only configs that passed the correctness gate.",
        '"""',
        "",
        "import triton",
        "",
        "__all__ = [",
        *(f'    "{p}_{n}",' for n in names for p in ("CONFIGS", "CONFIG_INDEX", "TARGET_CTAS")),
        "]",
    ]
    return "\n".join(head + body) + "\n"
