"""``tuner export``: the kernel's autotune table, from the database.

One JSON file per (device name, workload shape) in ``kernels/configs/`` (the kernel reads it when
called with ``config=None``), keyed by concurrency. Each entry holds the four parameters and its
provenance. Only ``ok`` trials, which passed the correctness gate, are ever exported.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from pathlib import Path

from sqlalchemy.orm import Session

from db import queries
from db.models import ExportModel
from db.models import TrialModel
from db.store import Store
from db.verdicts import Verdict
from kernels.table import CONFIG_DIR
from kernels.table import table_name
from tuner.errors import TunerError


def winners(s: Session, backend: str | None = None) -> dict[tuple, dict[int, TrialModel]]:
    """{(device, kv_format, heads, topk, page_size): {concurrency: best ok trial}} over every space."""
    out: dict[tuple, dict[int, TrialModel]] = defaultdict(dict)
    levels = sorted({t.concurrency for t in queries.trials(s, verdict=Verdict.OK, backend=backend)})
    for c in levels:
        for t in queries.best(s, c, backend=backend):
            w = t.workload
            key = (t.environment.gpu_name, w.kv_format, w.heads, w.topk, w.page_size)
            cur = out[key].get(c)
            out[key][c] = t if cur is None else queries.best_of([cur, t])
    return out


def _entry(t: TrialModel) -> dict:
    st = t.statistic()
    return {
        **t.config().as_dict(),
        "median_us": round(st.median_us, 3),
        "ratio_vs_baseline": round(st.ratio, 4),
        "ratio_ci": [round(st.ratio_ci_low, 4), round(st.ratio_ci_high, 4)],
        "noise_band": round(st.noise_band, 4),
        "verdict": st.classification,
        "trial": t.id,
        "space": t.study.space.name,
    }


def export_tables(store: Store, out_dir: Path | None = None, backend: str | None = None) -> list[Path]:
    out_dir = Path(out_dir or CONFIG_DIR)
    written = []
    with store.session() as s:
        groups = winners(s, backend)
        if not groups:
            raise TunerError(f"nothing to export: {store.url} has no ok trial (run `tuner search` first)")
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TunerError(f"cannot write to {out_dir}: {e.strerror}") from None
        for (device, kv_format, heads, topk, page_size), trials in sorted(groups.items()):
            any_t = next(iter(trials.values()))
            kernel_hashes = sorted({t.study.kernel.source_hash for t in trials.values()})
            table = {
                "device": device,
                "workload": {"kv_format": kv_format, "heads": heads, "topk": topk, "page_size": page_size},
                "kernel_hash": kernel_hashes[-1] if len(kernel_hashes) == 1 else ",".join(kernel_hashes),
                "triton": any_t.environment.triton,
                "backend": any_t.backend,
                "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                "source": store.url,
                "configs": {str(c): _entry(trials[c]) for c in sorted(trials)},
            }
            path = out_dir / table_name(device, kv_format, heads, topk)
            text = json.dumps(table, indent=1) + "\n"
            path.write_text(text)
            s.add(ExportModel(path=str(path), device=device, workload_id=any_t.workload_id, content=text))
            written.append(path)
    return written


def triton_configs(store: Store, backend: str | None = None) -> str:
    """The winners as ``triton.Config`` lists, one per (device, workload), for kernels that autotune."""
    lines = []
    with store.session() as s:
        groups = winners(s, backend)
    for (device, kv_format, heads, topk, _), by_c in sorted(groups.items()):
        lines.append(f"# {device}, {kv_format}, {heads} heads, topk {topk} (key: concurrency)")
        lines.append(f"CONFIGS_{kv_format.upper()}_H{heads}_TOPK{topk} = {{")
        for c, t in sorted(by_c.items()):
            cfg = t.config()
            kw = cfg.triton_config_kwargs()
            options = "".join(f", {k}={v}" for k, v in kw.items() if k != "kwargs")
            lines.append(
                f"    {c}: triton.Config({kw['kwargs']}{options}),  # {cfg.launch()}, {t.statistic().median_us:.2f} us"
            )
        lines.append("}")
    if not lines:
        raise TunerError(f"nothing to export: {store.url} has no ok trial (run `tuner search` first)")
    return "\n".join(lines)
