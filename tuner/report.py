"""``tuner report``: the A/B document engineers used to write by hand after tuning, generated from the database.

Per (space, workload, device, backend): the environment and the noise band (and a warning when the
space's target arch is not the GPU's); the best config per concurrency with its share of copy
bandwidth; each lever (one parameter changed from the baseline) as win / flat / regression with its
CI per concurrency, or the reason it could not run and the nearest variant that did; the levers that
never win and are in no best config (dead ends); infeasible configs; optional PNG plots (median µs
per concurrency with each point's winner, and a lever × concurrency heatmap).

It speaks of one kernel's results, through its adapter (``tuner report --kernel``): the parameters, the configs'
keys and compiled labels, the bytes a call moves; what only the kernel can say, the workload's line, the note on
bytes moved and a same-run benchmark, are its :class:`ReportSections` (the built-in kernel's own show the call's
caches and a same-run benchmark against FlashMLA).
"""

from __future__ import annotations

import math
import os
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..db import queries
from ..db.models import TrialModel
from ..db.paths import PathError
from ..db.paths import folder as safe_folder
from ..db.paths import write_atomic
from ..db.store import Store
from ..db.store import redact_url
from ..db.verdicts import Effect
from ..db.verdicts import Phase
from ..db.verdicts import Verdict
from .adapter import KernelAdapter
from .adapter import default_adapter
from .errors import TunerError
from .output import bounded
from .output import gbps
from .output import pct
from .progress import Progress

NOT_MEASURED = "not measured"
_WHOLE = "`tuner show` or -f json"  # where a stored text the report cuts is whole
# what gives a character meaning inside a line of Markdown text or a table: always these; `_` only at a
# word's edge (CommonMark never reads an underscore between two letters or digits as emphasis); `>` quotes
# only at a line's start, where no stored string is put
_MD_SPECIAL = re.compile(r"[\\`*\[\]<|~$]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


def md(text: object) -> str:
    """A stored string (a device, host or space name, a compiler's message) as Markdown *text*: control
    characters (a newline included) become one space and what Markdown or a table gives meaning to is
    escaped, so a name can neither end a line, a table cell or a heading nor make a link or an image. A text
    beyond ``TEXT_MAX`` characters (a compiler's megabyte of output kept as a reason) is cut, its length said."""
    return _MD_SPECIAL.sub(lambda m: "\\" + m.group(0), _CONTROL.sub(" ", bounded(str(text), whole=_WHOLE)))


def md_code(text: object) -> str:
    """A stored string as a Markdown code span (config keys, hashes, URLs): no backtick or line end
    can leave it; bounded as :func:`md` is."""
    text = _CONTROL.sub(" ", bounded(str(text), whole=_WHOLE)).replace("`", "'").replace("|", "\\|")
    return f"`{text}`"


def file_stem(*parts: object) -> str:
    """A file name from stored names: letters, digits, ``.``, ``-`` and ``_`` only, no leading dot, at
    most 150 characters; nothing in a name can climb out of the plots folder or hide a file."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", "_".join(map(str, parts))).lstrip(".") or "plot"
    return stem[:150]


PLOT_TEXT_MAX = 200  # characters of a label or title (a megabyte of text made a figure too wide to draw)


def plot_text(text: object) -> str:
    """A stored string as a matplotlib label: one line of at most :data:`PLOT_TEXT_MAX` characters, and ``$``
    escaped so it is never read as math."""
    text = _CONTROL.sub(" ", str(text))
    if len(text) > PLOT_TEXT_MAX:
        text = text[: PLOT_TEXT_MAX - 1] + "…"
    return text.replace("$", r"\$")


def _outcome(t: TrialModel | None) -> str | None:
    """What a trial says about its config, from the data: None (not measured), a verdict other than
    ok, or the ok trial's effect (win / flat / regression); a duplicate says what its original says."""
    if t is None:
        return None
    if t.verdict == Verdict.DUPLICATE and t.original is not None:
        return _outcome(t.original)
    if t.verdict != Verdict.OK:
        return str(t.verdict)
    st = t.statistic(Phase.SCREEN) or t.statistic()
    return str(st.classification) if st is not None else str(t.verdict)


def _cell(t: TrialModel | None) -> str:
    if t is None:
        return NOT_MEASURED
    if t.verdict == Verdict.INFEASIBLE:
        return str(t.verdict)  # the reason is listed once, under "Infeasible"
    if t.verdict == Verdict.DUPLICATE and t.original is not None:  # the measurement that stands for it
        return f"{_cell(t.original)} (same launch as {md_code(t.original.config_key)})"
    if t.verdict != Verdict.OK:
        return f"{t.verdict}: {md(t.reason)}" if t.reason else str(t.verdict)
    st = t.statistic(Phase.SCREEN) or t.statistic()
    if st is None:
        return str(t.verdict)
    return f"{st.classification} {st.ratio:.3f} [{st.ratio_ci_low:.3f}, {st.ratio_ci_high:.3f}]"


def _groups(s, adapter: KernelAdapter) -> dict[tuple, list[TrialModel]]:
    """Trials per (space, workload, device, backend), at each concurrency only those of the newest kernel
    measured there (as ``tuner best`` and export read them: older kernels' numbers are history)."""
    out = defaultdict(list)
    for t in queries.trials(s, adapter=adapter.spec):
        out[(t.study.space.name, t.workload.name, t.environment.gpu_name, t.backend)].append(t)
    for key, ts in out.items():
        by_c = defaultdict(list)
        for t in ts:
            by_c[t.concurrency].append(t)
        out[key] = sorted((t for level in by_c.values() for t in queries.newest_kernel(level)), key=lambda t: t.id)
    return out


class ReportSections:
    """What only the kernel can say in its report, behind :meth:`KernelAdapter.report_sections`; these defaults
    speak of any kernel from its adapter and its stored workload description."""

    def __init__(self, adapter: KernelAdapter) -> None:
        self.adapter = adapter

    def workload_line(self, row) -> str:
        """The header's line of the workload measured (a ``tuner_workloads`` row)."""
        fields = ", ".join(f"{md(k)} {md_code(v)}" for k, v in row.description().items() if k != "name")
        return f"- Workload: {md_code(row.name)}" + (f", {fields}." if fields else ".")

    def bytes_note(self) -> str:
        """The header's line on the % copy bandwidth column."""
        return (
            "- % copy BW: the fewest bytes a call must move (the kernel adapter's `bytes_moved`) per µs of the best "
            "median, as a share of the measured device-to-device copy bandwidth."
        )

    def load_bench(self, path: str):
        """A same-run benchmark file (``tuner report --bench``): an object with ``name``, ``device``, ``date`` and
        ``points(workload)`` (``{C: (ours µs, theirs µs)}``); a kernel without one refuses."""
        raise TunerError(f"--bench: the {self.adapter.name} kernel has no same-run benchmark to show")


def sections_of(adapter: KernelAdapter) -> ReportSections:
    """The adapter's report sections, else the generic ones."""
    return adapter.report_sections() or ReportSections(adapter)


def _save(fig, path: Path, plots_dir: Path) -> None:
    """A figure as a PNG at ``path``, written atomically inside ``plots_dir`` (a regular file, never through a link)."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    try:
        write_atomic(path, buf.getvalue(), root=plots_dir)
    except PathError as e:
        raise TunerError(str(e)) from None


def render_report(
    store: Store,
    plots_dir: Path | None = None,
    link_prefix: str = "",
    benches: tuple = (),
    progress: Progress | None = None,
    adapter: KernelAdapter | None = None,
) -> str:
    """The report in Markdown of ``adapter``'s kernel (the built-in one by default); ``benches``: its sections'
    :meth:`ReportSections.load_bench`; ``progress`` shows the reading and each section on stderr (a report of the
    whole H200 record takes about a minute)."""
    progress = progress or Progress(quiet=True)
    adapter = adapter or default_adapter()
    sections = sections_of(adapter)
    if plots_dir is not None:
        _pyplot()  # before any work: a missing matplotlib is one sentence, not a half-written report
        try:  # a FIFO or a file where the folder should be: one sentence before any work
            if os.path.lexists(plots_dir):
                safe_folder(Path(plots_dir), create=False)
        except PathError as e:
            raise TunerError(str(e)) from None
    source = redact_url(store.url)
    lines = ["# A/B report", "", f"Generated by `tuner report` from {md_code(source)}.", ""]
    with store.session() as s:
        with progress.slow(f"report: reading the trials of {source}"):
            groups = _groups(s, adapter)
        if not groups and (others := queries.other_adapters(s, adapter.spec)):
            raise TunerError(
                f"nothing to report: {source} holds results of {others} only, and tuner report speaks of the "
                f"{adapter.spec} kernel's results only (another kernel's: --kernel NAME; docs/adapters.md)"
            )
        if not groups:
            raise TunerError(f"nothing to report: {source} has no trials (run `tuner search` first)")
        task = progress.task("report", total=len(groups))  # a line per 10 % and 10 s at most, then "done in"
        for (space, workload, device, backend), trials in sorted(groups.items()):
            lines += _section(sections, space, workload, device, backend, trials, plots_dir, link_prefix, benches)
            task.advance(1, postfix=f"{space}/{workload} on {device}")
        task.close(f"{len(groups)} sections")
    return "\n".join(lines) + "\n"


def _target(space_text: str) -> str:
    try:
        doc = yaml.safe_load(space_text)
    except yaml.YAMLError:
        doc = None
    return str(doc.get("target", "sm_120")) if isinstance(doc, dict) else "sm_120"


def _arch(compute_capability: str) -> str | None:
    """``"9.0"`` -> ``"sm_90"``; None when it is not a compute capability (the interpreter)."""
    major, _, minor = str(compute_capability).partition(".")
    return f"sm_{major}{minor or 0}" if major.isdigit() and (minor or "0").isdigit() else None


def _copy_share(adapter, w, batch: int, median_us: float, copy_gbps: float | None) -> float | None:
    """Achieved bytes/s of the fewest bytes a call must move (:meth:`KernelAdapter.bytes_moved`), as a fraction of
    copy bandwidth."""
    if not copy_gbps or not median_us:
        return None
    return adapter.bytes_moved(w, batch) / (median_us * 1e-6) / (copy_gbps * 1e9)


@dataclass
class _Level:
    c: int
    best: TrialModel | None
    median_us: float = math.nan
    ci: tuple[float, float] = (math.nan, math.nan)
    baseline_us: float = math.nan
    share: float | None = None


def _section(sections, space, workload, device, backend, trials, plots_dir, link_prefix, benches=()) -> list[str]:
    adapter = sections.adapter
    by_c: dict[int, dict[str, TrialModel]] = defaultdict(dict)
    for t in trials:
        by_c[t.concurrency][t.config_key] = t
    levels = sorted(by_c)
    base_key = next((t.config_key for t in trials if t.is_baseline), None)
    out = [f"## {md(space)} / {md(workload)} on {md(device)} ({md(backend)})", ""]
    out += _header(sections, trials, device, backend, base_key)
    table, series = _summary(adapter, trials[-1], by_c, levels)
    out += table
    rows = _lever_rows(adapter, by_c, levels, base_key)
    out += _levers(adapter, rows, by_c, levels, series)
    out += _infeasible(adapter, trials)
    if plots_dir is not None and any(lv.best for lv in series):
        stem = file_stem(space, workload, device, backend)
        bands = {c: next(iter(by_c[c].values())).study.noise_band or 0.0 for c in levels}
        title = plot_text(f"{space}/{workload} on {device} ({backend})")
        wl = adapter.recorded_workload(trials[-1].workload)
        # the newest same-run benchmark of this device and call that has FlashMLA at some measured level
        found = [(b, pts) for b in benches if b.device == device and backend == "cuda" for pts in [b.points(wl)]]
        found = [(b, pts) for b, pts in found if set(pts) & set(levels)]
        bench = max(found, key=lambda bp: bp[0].date, default=None)
        out += _plots(Path(plots_dir), link_prefix, stem, title, series, base_key, bench)
        out += _heatmap(adapter, Path(plots_dir), link_prefix, stem, title, rows, by_c, levels, bands, base_key)
    return out


def _header(sections, trials, device, backend, base_key) -> list[str]:
    """What was measured, where, with which kernel, and how to read the verdicts."""
    env, w, study = trials[-1].environment, trials[-1].workload, trials[-1].study
    hashes = sorted({t.study.kernel.source_hash for t in trials})
    target, arch = _target(study.space.text), _arch(env.compute_capability)
    out = []
    if arch and arch != target:
        target, device = md(target), md(device)  # stored strings: text in the paragraph below
        out += [
            f"> **Target {target}, measured on {arch}.** Feasibility (shared memory, registers) was checked "
            f"against {target}, the space's target, but the timings come from {device} ({arch}). Configs "
            f"rejected for {target} may run here, and the ranking is the {arch} ranking: re-tune on a "
            f"{target} GPU before shipping tables for it.",
            "",
        ]
    out += [
        sections.workload_line(w),
        f"- Environment: {md(env.gpu_name)}, compute capability {md(env.compute_capability)}, {env.sm_count} SMs, "
        f"driver {md(env.driver)}, CUDA {md(env.cuda)}, torch {md(env.torch)}, triton {md(env.triton)}, "
        f"host {md_code(env.host)}" + (f", copy bandwidth {gbps(env.copy_gbps)}." if env.copy_gbps else "."),
        f"- Target arch (feasibility): {md(target)}. Kernel source hash {', '.join(md_code(h) for h in hashes)}"
        + (" (the newest measured at each level)" if len(hashes) > 1 else "")
        + f"; baseline {md_code(base_key)}.",
        "- Verdicts (`tuner/stats.py`): each round times the candidate and the baseline back to back, giving "
        "the log ratio d = log(candidate / baseline). A trial is a **win** when a one-sided paired t-test "
        "finds mean(d) below log(1 − noise band), a **regression** when one finds it above log(1 + band), "
        "else **flat**; the calls of one study (one row below) are kept at a false-discovery rate of 5 % "
        "(Benjamini–Hochberg over the study's p-values). The ratio is exp(mean(d)), the geometric-mean time "
        "relative to the baseline, with its 95 % t interval; the noise band is the larger of the A/A spread "
        "and the space's `min_effect`.",
        sections.bytes_note(),
        "",
    ]
    if backend == "interpreter":
        out += [
            "> Interpreter backend: wall-clock timings of the kernel under `TRITON_INTERPRET=1` on the CPU. "
            "They test the pipeline, not the GPU.",
            "",
        ]
    return out


def _summary(adapter, last: TrialModel, by_c, levels) -> tuple[list[str], list[_Level]]:
    """One row per concurrency: the best config, its numbers and the tally of verdicts; and the series."""
    env = last.environment
    wl = adapter.recorded_workload(last.workload)
    out = [
        "| C | noise band | best | median µs | % copy BW | ratio vs baseline (95 % CI) | effect | "
        + " | ".join(map(str, Verdict))
        + " |",
        "|---|---|---|---|---|---|---|" + "---|" * len(Verdict),
    ]
    series: list[_Level] = []
    for c in levels:
        ts = list(by_c[c].values())
        band = ts[0].study.noise_band
        tally = [sum(t.verdict == v for t in ts) for v in Verdict]
        b = queries.best_of(ts)
        lv = _Level(c, b)
        if b is not None:
            st = b.statistic()
            lv.median_us, lv.ci, lv.baseline_us = st.median_us, (st.ci_low_us, st.ci_high_us), st.baseline_median_us
            lv.share = _copy_share(adapter, wl, c, st.median_us, env.copy_gbps)
            cells = [
                md_code(b.config_key),
                f"{st.median_us:.2f}",
                pct(lv.share, sign=False),
                f"{st.ratio:.3f} [{st.ratio_ci_low:.3f}, {st.ratio_ci_high:.3f}]",
                st.classification,
            ]
        else:
            cells = ["-"] * 5
        series.append(lv)
        out.append(f"| {c} | {pct(band or 0, 2)} | " + " | ".join(cells) + " | " + " | ".join(map(str, tally)) + " |")
    out.append("")
    return out, series


@dataclass
class _Row:
    """One line of the lever table: a one-step lever, or the nearest feasible variant of one."""

    param: str
    value: int
    key: str
    via: str | None = None  # set: this row is the nearest measured-ok variant of an infeasible lever
    changes: str = ""

    @property
    def label(self) -> str:
        return f"{self.param} = {self.value}" + (f" via {md_code(self.key)}" if self.via else "")


def _lever_configs(adapter, base_key: str, values: dict[str, set]) -> list[tuple[str, int, str]]:
    base = adapter.parse_config(base_key)
    out = []
    for p in adapter.param_names:
        for v in sorted(values[p]):
            if v != getattr(base, p):
                out.append((p, v, str(base.replace(**{p: v}))))
    return out


def _values(by_c) -> dict[str, set]:
    """Every value each parameter takes in the measured configs."""
    values = defaultdict(set)
    for ts in by_c.values():
        for t in ts.values():
            for p, v in t.param_values().items():
                values[p].add(v)
    return values


def _param(t: TrialModel, p: str) -> int:
    """One parameter of a trial's config: the built-in kernel's column, or another adapter's ``params``."""
    return getattr(t, p) if t.params is None else t.param_values()[p]


def _ok_somewhere(by_c, key: str) -> bool:
    return any(key in ts and ts[key].verdict == Verdict.OK for ts in by_c.values())


def _nearest_feasible(adapter, by_c, p: str, v: int, key: str) -> tuple[str, str] | None:
    """The measured-ok config with ``p = v`` that differs from ``key`` in the fewest parameters
    (then: ok at the most levels, then the lowest key), and what changed."""
    names = adapter.param_names
    want = adapter.parse_config(key).as_dict()
    cands = {}
    for ts in by_c.values():
        for k, t in ts.items():
            if t.verdict == Verdict.OK and _param(t, p) == v:
                cands[k] = t.param_values()
    if not cands:
        return None

    def rank(k):
        diff = sum(cands[k][q] != want[q] for q in names)
        ok_levels = sum(k in ts and ts[k].verdict == Verdict.OK for ts in by_c.values())
        return (diff, -ok_levels, k)

    k = min(cands, key=rank)
    changes = ", ".join(f"{q} {want[q]} → {cands[k][q]}" for q in names if cands[k][q] != want[q])
    return k, changes


def _lever_rows(adapter, by_c, levels, base_key) -> list[_Row]:
    """Each lever alone; where it never ran ok, its nearest variant that did follows it (``via``), and a
    lever with no trial at any level is left out for that variant (its row would only say "not measured")."""
    if base_key is None:
        return []
    rows = []
    for p, v, key in _lever_configs(adapter, base_key, _values(by_c)):
        alone = _Row(p, v, key)
        near = None if _ok_somewhere(by_c, key) else _nearest_feasible(adapter, by_c, p, v, key)
        if near is None or any(key in ts for ts in by_c.values()):
            rows.append(alone)
        if near is not None:
            rows.append(_Row(p, v, near[0], via=key, changes=near[1]))
    return rows


def _levers(adapter, rows: list[_Row], by_c, levels, series: list[_Level]) -> list[str]:
    if not rows:
        return []
    out = [
        "### Levers (one parameter changed from the baseline; screening rounds)",
        "",
        "A lever that never ran ok alone (infeasible, or not measured at any level) is followed by, or, "
        "when it has no trial at all, shown only as, the nearest variant that ran: the same value with the "
        "fewest other parameters changed (`via`, with what else it changes). Such a row measures that "
        "variant, not the lever alone.",
        "",
        "| lever | " + " | ".join(f"C={c}" for c in levels) + " |",
        "|---|" + "---|" * len(levels),
    ]
    in_best: dict[tuple[str, int], list[int]] = defaultdict(list)
    for lv in series:
        if lv.best is not None:
            for p, v in lv.best.param_values().items():
                in_best[(p, v)].append(lv.c)
    wins: dict[tuple[str, int], bool] = defaultdict(bool)
    verdicts: dict[tuple[str, int], set] = defaultdict(set)
    keys: dict[tuple[str, int], str] = {}
    for r in rows:
        trials = [by_c[c].get(r.key) for c in levels]
        label = r.label + (f" ({r.changes})" if r.via else "")
        out.append(f"| {label} | " + " | ".join(_cell(t) for t in trials) + " |")
        pv = (r.param, r.value)
        keys.setdefault(pv, r.key)
        outcomes = {o for o in map(_outcome, trials) if o is not None}  # from the data, not the cells' text
        wins[pv] |= Effect.WIN in outcomes
        verdicts[pv] |= outcomes
    dead, kept, unmeasured = [], [], []
    for pv, won in wins.items():
        if won:
            continue
        p, v = pv
        what = ", ".join(sorted(verdicts[pv]))
        if not verdicts[pv]:  # a bounded search may not reach a lever: no evidence either way
            unmeasured.append(f"- **{p} = {v}** ({md_code(keys[pv])} and its nearest variants)")
            continue
        if not any(_param(t, p) == v and t.verdict == Verdict.OK for ts in by_c.values() for t in ts.values()):
            dead.append(f"- **{p} = {v}** never runs: every measured config with {p} = {v} is {what}.")
        elif in_best.get(pv):
            cs = ", ".join(map(str, in_best[pv]))
            kept.append(f"- **{p} = {v}**: {what} as a single change; in the best config at C={cs}.")
        else:
            dead.append(f"- **{p} = {v}** ({md_code(keys[pv])}) never wins and is in no best config: {what}.")
    out += ["", "### Dead ends", ""] + (dead or ["- none: every lever wins somewhere or is in a best config."])
    out += [""] + (["### Never a win alone, but part of a best config", ""] + kept + [""] if kept else [])
    if unmeasured:
        out += ["### Not measured at any level (neither a win nor a dead end)", ""] + unmeasured + [""]
    return out


def _infeasible(adapter, trials) -> list[str]:
    compiled = [p.name for p in adapter.params if p.compiled]
    bad = {}
    for t in trials:
        if t.verdict == Verdict.INFEASIBLE:
            values = t.param_values()
            bad.setdefault(tuple(values[p] for p in compiled), (adapter.recorded_config(t), t))
    if not bad:
        return []
    launch = ", ".join(p.name for p in adapter.params if not p.compiled)
    why = f"; {launch} does not change the code" if launch else ""
    out = [f"### Infeasible ({len(bad)} compiled configs, never launched{why})", ""]
    for cfg, t in sorted(bad.values(), key=lambda ct: ct[1].shared_bytes or 0):
        out.append(f"- {md_code(adapter.compiled_label(cfg))}: {md(t.reason)}")
    return out + [""]


MATPLOTLIB_MISSING = (
    "tuner report --plots needs matplotlib, which is not installed: "
    "pip install 'sparse-mla-tuner[report]' (or pip install matplotlib)"
)


def _pyplot():
    try:
        import matplotlib
    except ImportError:  # an extra ([report]): only the plots need it
        raise TunerError(MATPLOTLIB_MISSING) from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def matplotlib_ticker():
    import matplotlib.ticker

    return matplotlib.ticker


def _plots(plots_dir: Path, prefix, stem, title, series: list[_Level], base_key, bench=None) -> list[str]:
    """Median µs per concurrency, best and baseline; below the axis, each level's best config and its
    % copy BW, written upright in its own column so labels never overlap, however many levels. With a
    same-run benchmark (``bench``: (Bench, points)), FlashMLA and ours as that run measured them.

    The x axis is one slot per measured level (1, 8, 48, ... are not evenly spaced); a level with no
    ok trial is a NaN, so no line crosses it.
    """
    plt = _pyplot()
    xs = list(range(len(series)))
    labels = [
        None if lv.best is None else lv.best.config_key + ("" if lv.share is None else f"  {pct(lv.share, sign=False)}")
        for lv in series
    ]
    # upright 7 pt monospace: about 0.06 in per character, plus a margin
    below = 0.65 + 0.06 * max((len(t) for t in labels if t), default=10)  # ticks and axis label first
    fig, (ax, lab) = plt.subplots(
        2,
        1,
        figsize=(max(8.0, 1.5 + 0.5 * len(series)), 4.2 + below),
        sharex=True,
        gridspec_kw={"height_ratios": [4.2, below], "hspace": 0.0},
    )
    ax.plot(xs, [lv.baseline_us for lv in series], "o--", color="0.45", label=plot_text(f"baseline {base_key}"))
    med = [lv.median_us for lv in series]
    ax.errorbar(
        xs,
        med,
        yerr=[[lv.median_us - lv.ci[0] for lv in series], [lv.ci[1] - lv.median_us for lv in series]],
        fmt="s-",
        color="tab:blue",
        capsize=3,
        label="best per concurrency (95 % CI)",
    )
    bench_us: list[float] = []
    if bench is not None:
        b, pts = bench
        at = [(x, pts[lv.c]) for x, lv in zip(xs, series, strict=True) if lv.c in pts]
        bench_us = [v for _, pair in at for v in pair]
        when = f", {b.date}" if b.date else ""
        ax.plot(
            [x for x, _ in at],
            [p[1] for _, p in at],
            "^-",
            color="tab:red",
            label=plot_text(f"FlashMLA, same-run benchmark ({b.name}{when})"),
        )
        ax.plot([x for x, _ in at], [p[0] for _, p in at], "x:", color="tab:blue", label="ours in that benchmark")
    for x, text in zip(xs, labels, strict=True):
        if text is None:
            ax.axvspan(x - 0.4, x + 0.4, color="0.92", zorder=0)
            ax.text(x, 0.5, "no ok trial", transform=ax.get_xaxis_transform(), ha="center", fontsize=7, rotation=90)
            continue
        lab.annotate(
            plot_text(text),
            (x, 1.0),
            xytext=(0, -30),  # under the tick labels and the axis label
            textcoords="offset points",
            ha="center",
            va="top",
            rotation=90,
            fontsize=7,
            color="tab:blue",
            family="monospace",
        )
    lab.set_ylim(0, 1)
    lab.set_yticks([])
    lab.axis("off")
    ax.set_xticks(xs, [str(lv.c) for lv in series])
    ax.tick_params(labelbottom=True)
    ax.set_xlim(-0.6, len(xs) - 0.4)
    ax.set_xlabel("concurrency (batch); below: each level's best config and its % copy BW", fontsize=9)
    ax.set_yscale("log")  # times span 1 to 96 requests
    finite = [v for lv in series for v in (lv.median_us, lv.baseline_us) if math.isfinite(v)]
    finite += [v for v in bench_us if math.isfinite(v)]
    if finite:
        ax.set_ylim(min(finite) * 0.8, max(finite) * 1.25)
    ax.yaxis.set_major_locator(matplotlib_ticker().LogLocator(subs=(1, 2, 5)))
    ax.yaxis.set_major_formatter(matplotlib_ticker().ScalarFormatter())
    ax.yaxis.set_minor_formatter(matplotlib_ticker().NullFormatter())
    ax.set_ylabel("µs per call (median, log scale)")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    f1 = plots_dir / f"{stem}_median.png"
    _save(fig, f1, plots_dir)
    plt.close(fig)
    out = [f"![median µs vs concurrency, each level's best config]({prefix}{f1.name})", ""]
    if bench is not None:
        b, pts = bench
        out += [
            f"FlashMLA in the plot: {md_code(b.name)} ({md(b.date or 'undated')}), ours and FlashMLA measured in one "
            f"run at C={', '.join(map(str, sorted(pts)))}; the search's medians come from its own runs.",
            "",
        ]
    return out


def _heatmap_rows(rows: list[_Row], by_c, levels) -> list[tuple[str, str, bool]]:
    """(label, config key, stand-in?) per heatmap row: each lever alone that has a trial somewhere, and
    each nearest variant standing in for levers that never ran ok alone, one row per config however
    many levers it stands in for."""
    out: dict[str, tuple[list[str], bool]] = {}
    for r in rows:
        if not any(r.key in by_c[c] for c in levels):
            continue
        names, stand_in = out.setdefault(r.key, ([], bool(r.via)))
        names.append(f"{r.param}={r.value}")
    labels = []
    for key, (names, stand_in) in out.items():
        if stand_in:
            labels.append((plot_text(f"{key}  (stands in for {', '.join(names)})"), key, True))
        else:
            labels.append((plot_text(", ".join(names)), key, False))
    return labels


def _ratio_ticks(lim: float) -> list[float]:
    """Colour-bar ticks within ±``lim`` (log2 of the ratio), 1 first, none closer than a sixth of the
    range to another, so their labels never overlap however wide the range."""
    kept = [1.0]
    for t in (0.8, 1.25, 0.67, 1.5, 0.5, 2.0, 0.9, 1.1, 0.25, 4.0, 0.125, 8.0, 16.0, 0.95, 1.05, 0.98, 1.02):
        x = math.log2(t)
        if abs(x) <= lim and all(abs(x - math.log2(k)) >= lim / 6 for k in kept):
            kept.append(t)
    return sorted(kept)


SPARSE = 0.5  # a one-lever grid measured in fewer of its cells than this is drawn per parameter value instead


def _lever_grid(rows: list[_Row], by_c, levels):
    """Each lever alone (and the stand-ins of those that never ran alone): (labels, ratios, cell texts)."""
    shown_rows = _heatmap_rows(rows, by_c, levels)
    ratio = [[math.nan] * len(levels) for _ in shown_rows]
    text = [["" for _ in levels] for _ in shown_rows]
    for i, (_, key, _) in enumerate(shown_rows):
        for j, c in enumerate(levels):
            t = by_c[c].get(key)
            if t is None:
                text[i][j] = "–"
            elif t.verdict == Verdict.DUPLICATE and t.original is not None and t.original.verdict == Verdict.OK:
                t = t.original  # the same launch: its measurement stands for this config
            if t is not None and t.verdict != Verdict.OK:
                text[i][j] = str(t.verdict)
            elif t is not None and (st := t.statistic(Phase.SCREEN) or t.statistic()) is not None:
                ratio[i][j] = st.ratio
                text[i][j] = f"{st.ratio:.2f}"
    return [(label, stand_in) for label, _, stand_in in shown_rows], ratio, text


def _value_grid(adapter, by_c, levels, base_key):
    """Each value of each parameter that varies: the best ok config with that value at each level (its ratio
    to the baseline), so every cell holds a measurement wherever the level measured that value at all."""
    base = adapter.parse_config(base_key).as_dict() if base_key else {}
    values = _values(by_c)
    labels, ratio, text = [], [], []
    for p in adapter.param_names:
        if len(values[p]) < 2:
            continue
        for v in sorted(values[p]):
            labels.append((plot_text(f"{p}={v}" + ("  (baseline's)" if base.get(p) == v else "")), False))
            r_row, t_row = [], []
            for c in levels:
                ok = [t for t in by_c[c].values() if t.verdict == Verdict.OK and _param(t, p) == v]
                b = queries.best_of(ok) if ok else None
                st = b.statistic() if b is not None else None
                r_row.append(st.ratio if st is not None else math.nan)
                t_row.append(f"{st.ratio:.2f}" if st is not None else "–")
            ratio.append(r_row)
            text.append(t_row)
    return labels, ratio, text


def _heatmap(
    adapter, plots_dir: Path, prefix, stem, title, rows: list[_Row], by_c, levels, bands, base_key
) -> list[str]:
    """Lever × concurrency; colour = log ratio to the baseline on a diverging scale centred at 1,
    white inside that level's noise band, grey where nothing ran. Where the search measured the one-lever
    grid in fewer than SPARSE of its cells (a strategy that does not try each lever alone), each row is a
    parameter value instead, its cell the best measured config with that value: data, not stand-ins."""
    import numpy as np

    plt = _pyplot()
    from matplotlib.colors import TwoSlopeNorm

    labels, ratio_rows, text = _lever_grid(rows, by_c, levels) if rows else ([], [], [])
    measured = sum(math.isfinite(x) for r in ratio_rows for x in r) / max(len(ratio_rows) * len(levels), 1)
    per_value = measured < SPARSE
    if per_value:
        labels, ratio_rows, text = _value_grid(adapter, by_c, levels, base_key)
    if not labels:
        return []
    ratio = np.array(ratio_rows, dtype=float)
    shown = np.log2(ratio)
    for j, c in enumerate(levels):
        inside = np.abs(ratio[:, j] - 1) <= bands[c]
        shown[inside, j] = 0.0
    lim = max(float(np.nanmax(np.abs(shown))) if np.isfinite(shown).any() else 0.0, 0.05)
    cmap = plt.get_cmap("RdBu_r").with_extremes(bad="0.85")
    fig, ax = plt.subplots(figsize=(1.6 + 0.75 * len(levels) + 3.0, 1.4 + 0.38 * len(labels)))
    im = ax.imshow(
        np.ma.masked_invalid(shown), cmap=cmap, norm=TwoSlopeNorm(0.0, -lim, lim), aspect="auto", interpolation="none"
    )
    for i in range(len(labels)):
        for j in range(len(levels)):
            dark = np.isfinite(shown[i, j]) and abs(shown[i, j]) > 0.6 * lim
            ax.text(j, i, text[i][j], ha="center", va="center", fontsize=7, color="white" if dark else "black")
    ax.set_xticks(range(len(levels)), [f"C={c}" for c in levels])
    ax.set_yticks(range(len(labels)), [label for label, _ in labels], fontsize=8)
    for tick, (_, stand_in) in zip(ax.get_yticklabels(), labels, strict=True):
        if stand_in:
            tick.set_fontstyle("italic")
    if per_value:
        what = (
            f"{title}: the best measured config with each parameter value, time ratio vs baseline\n"
            "(< 1 faster; white = inside the noise band; grey = no ok trial with that value; "
            f"the search measured {measured:.0%} of the one-lever grid, too little to show each lever alone)"
        )
    else:
        what = (
            f"{title}: each lever alone, time ratio vs baseline\n"
            "(< 1 faster; white = inside the noise band; grey = no ok trial)"
            + (
                "; italic rows: a lever never measured ok alone, shown by the nearest config that ran"
                if any(si for _, si in labels)
                else ""
            )
        )
    ax.set_title(what, fontsize=8)
    ticks = _ratio_ticks(lim)
    cb = fig.colorbar(im, ax=ax, ticks=[math.log2(t) for t in ticks], fraction=0.05, pad=0.02)
    cb.ax.set_yticklabels([f"{t:g}" for t in ticks])
    cb.set_label("ratio (log scale)")
    f2 = plots_dir / f"{stem}_levers.png"
    _save(fig, f2, plots_dir)
    plt.close(fig)
    alt = "parameter value" if per_value else "lever"
    return [f"![{alt} × concurrency heatmap of time ratios]({prefix}{f2.name})", ""]
