"""What a study prints: the end-of-search summary row and the progress bar's postfix."""

from __future__ import annotations

from sqlalchemy.orm import Session

from ..db import queries
from ..db.models import StudyModel
from ..db.verdicts import Verdict
from .output import pct
from .output import us


def summary_row(session: Session, study_id: int, workload: str, concurrency: int) -> dict:
    trials = list(queries.done_configs(session, study_id).values())
    study = session.get(StudyModel, study_id)
    tally = {v.value: sum(t.verdict == v for t in trials) for v in Verdict if v is not Verdict.OK}
    row = {
        "workload": workload,
        "C": concurrency,
        "best": "-",
        "median_us": "-",
        "ratio vs baseline (95% CI)": "-",
        "effect": "-",
        "noise band": pct(study.noise_band or 0),
        "ok": sum(t.verdict == Verdict.OK and t.statistic() is not None for t in trials),
        **tally,
    }
    b = queries.best_of(trials)
    if b is not None:
        st = b.statistic()
        row.update(
            best=b.config_key,
            median_us=f"{st.median_us:.2f}",
            **{"ratio vs baseline (95% CI)": f"{st.ratio:.3f} [{st.ratio_ci_low:.3f}, {st.ratio_ci_high:.3f}]"},
            effect=st.classification,
        )
    return row


def postfix(best: tuple[str, float, float] | None, band: float) -> str:
    """``best (config, ratio, median µs)`` of the screening so far, and the band."""
    if best is None:
        return f"band {pct(band)}"
    return f"best {best[0]} {us(best[2])} ({best[1]:.3f}x), band {pct(band)}"


TIME_KINDS = ("compile", "gpu", "model", "database", "other")


def time_lines(rows: list[dict]) -> list[str]:
    """Where the time went, per level and in total: ``v4_flash C=1: 12.3 s = compile 0.4, gpu 8.1, ...``."""

    def line(head: str, r: dict) -> str:
        parts = ", ".join(f"{k} {r.get(f'{k}_s', 0.0):.1f}" for k in TIME_KINDS)
        return f"{head}: {r.get('wall_s', 0.0):.1f} s = {parts}"

    timed = [r for r in rows if "wall_s" in r]
    if not timed:
        return []
    total = {f"{k}_s": sum(r.get(f"{k}_s", 0.0) for r in timed) for k in (*TIME_KINDS, "wall")}
    return [line(f"{r['workload']} C={r['C']}", r) for r in timed] + [line("total", total)]
