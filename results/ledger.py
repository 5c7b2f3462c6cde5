"""results/ledger.jsonl: one row per benchmark run, appended, never rewritten; and the README's headline from it.

A row is ``{"date", "device", "commit", "kernel", "command", "file", "kind", "figures"}``: when and where it ran,
the commit it ran at, the kernel's source hash, the command, the raw output it wrote under results/ and the figures
read from that output (µs per call and the like, per format and concurrency). The raw file is replaced by a newer
run of the same command; the ledger keeps every run's figures::

    python results/ledger.py add results/bench_single_h200.json --command "python -m ..."   # append its row
    python results/ledger.py headline            # the README's headline table, from the newest rows
    python results/ledger.py headline --write    # and put it into README.md (between its headline markers)

Only the standard library is used.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LEDGER = HERE / "ledger.jsonl"
README = ROOT / "README.md"
BEGIN, END = "<!-- headline: python results/ledger.py headline --write -->", "<!-- /headline -->"
HEADLINE_C = (1, 8, 48, 96)


class LedgerError(Exception):
    """A file the ledger cannot read, in one sentence."""


def _r(x, digits: int = 2):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else round(float(x), digits)


def _bench_single(d: dict) -> dict:
    return {
        f"{r['format']} C={r['C']}": {
            "us": _r(r["us"]),
            "flashmla_us": _r(r.get("flashmla_us")),
            "pct_copy": _r(r.get("pct_copy"), 1),
        }
        for r in d["rows"]
        if r.get("config") == "table"
    }


def _bench_call(d: dict) -> dict:
    return {f"layer C={r['C']}": {"us": _r(r["ours_us"]), "flashmla_us": _r(r.get("flashmla_us"))} for r in d["rows"]}


def _sglang_check(d: dict) -> dict:
    out = {f"hook C={r['C']}": {"us": _r(r["hook_us"]), "layer_call_us": _r(r.get("layer_call_us"))} for r in d["rows"]}
    return {"ratio_median": d["env"].get("ratio_median"), "ratio_max": d["env"].get("ratio_max"), **out}


def _feasibility(d: dict) -> dict:
    return {
        f"{r['space']} {r['depth']}": {"configs": r["configs"], "feasible": r["feasible"], "s": r["seconds"]}
        for r in d["rows"]
    }


def _retune(rows: list) -> dict:
    return {
        f"{r['workload']} C={r['C']}": {"pick": r["best"], "us": _r(float(r["median_us"])), "ok": r["ok"]} for r in rows
    }


def _bench_search(rows: list) -> dict:
    out: dict[str, dict] = {}
    for run in rows:
        f = out.setdefault(
            f"{run['case']} {run['strategy']}", {"runs": 0, "levels": 0, "within_1pct": 0, "measured": 0, "launches": 0}
        )
        f["runs"] += 1
        for lv in run["levels"]:
            f["levels"] += 1
            f["within_1pct"] += lv["regret"] is not None and lv["regret"] <= 0.01
            f["measured"] += lv["measured"]
            f["launches"] += lv["launches"]
    return {
        k: {
            "runs": f["runs"],
            "within_1pct": _r(100 * f["within_1pct"] / f["levels"], 1),
            "measured_pct": _r(100 * f["measured"] / f["launches"], 1),
        }
        for k, f in out.items()
    }


def _generic(rows: list[dict]) -> dict:
    """A row's numbers (rounded) under its words and small integers (``fp8_v32 C=96``), for a benchmark whose
    output this file does not know by name."""
    out = {}
    for i, r in enumerate(rows):
        words = [
            f"{k}={v}" if isinstance(v, int) and not isinstance(v, bool) and k in ("C", "batch") else str(v)
            for k, v in r.items()
            if isinstance(v, str) or (k in ("C", "batch") and isinstance(v, int))
        ]
        numbers = {k: _r(v, 3) for k, v in r.items() if isinstance(v, float) and not isinstance(v, bool)}
        out[" ".join(words) or f"row {i}"] = numbers
    return out


def figures(path: Path) -> tuple[str, dict, dict]:
    """The kind of a raw output file, its figures and what it says about its run (date, device, kernel, command)."""
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise LedgerError(f"{path}: not a readable JSON file ({e})") from None
    if isinstance(d, dict) and "replay_kernel" in d and "wall_s" in d:  # bench_search.py --overhead
        keys = ("wall_s", "model_s", "waiting_s", "database_s", "levels_s", "optimizations")
        return "search_overhead", {k: _r(d[k]) for k in keys if k in d}, {"kernel": d["replay_kernel"]}
    if isinstance(d, list) and d and "levels" in d[0]:
        return "bench_search", _bench_search(d), {}
    if isinstance(d, list) and d and "best" in d[0]:
        return "retune", _retune(d), {}
    env = d.get("env", d) if isinstance(d, dict) else {}
    about = {k: env[k] for k in ("date", "device", "command") if k in env}
    if "kernel_hash" in env:
        about["kernel"] = env["kernel_hash"]
    rows = d.get("rows", []) if isinstance(d, dict) else []
    if rows and "hook_us" in rows[0]:
        return "sglang_check", _sglang_check(d), about
    if rows and {"C", "ours_us", "config"} <= set(rows[0]):
        return "bench_call", _bench_call(d), about
    if rows and {"format", "config", "us"} <= set(rows[0]):
        return "bench_single", _bench_single(d), about
    if rows and "seconds" in rows[0]:
        return "feasibility", _feasibility(d), about
    if rows and all(isinstance(r, dict) for r in rows):  # another benchmark's rows: its numbers, by its words
        return path.stem.removesuffix("_h200"), _generic(rows), about
    raise LedgerError(
        f"{path}: not a benchmark output the ledger knows "
        "(bench, bench_call, sglang_check, feasibility, retune, bench_search, its --overhead)"
    )


def _head() -> str:
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def row_of(path: Path, **given) -> dict:
    """The ledger row of one raw output file; what the file does not say comes from ``given``."""
    kind, figs, about = figures(path)
    row = {"date": None, "device": None, "commit": None, "kernel": None, "command": None}
    row.update({k: v for k, v in about.items() if v})
    row.update({k: v for k, v in given.items() if v})
    row["commit"] = row["commit"] or _head()
    missing = [k for k in ("date", "device", "kernel", "command") if not row[k]]
    if missing:
        raise LedgerError(f"{path} does not say its {', '.join(missing)}: give --{' --'.join(missing)}")
    file = path.resolve()
    row.update(file=str(file.relative_to(ROOT)) if file.is_relative_to(ROOT) else str(path), kind=kind, figures=figs)
    return row


def read() -> list[dict]:
    if not LEDGER.is_file():
        return []
    return [json.loads(line) for line in LEDGER.read_text().splitlines() if line.strip()]


def newest(kind: str, rows: list[dict] | None = None) -> dict | None:
    found = [r for r in (read() if rows is None else rows) if r["kind"] == kind]
    return found[-1] if found else None  # the ledger is appended in the order the runs were added


def headline(rows: list[dict] | None = None) -> str:
    """The README's table: ours against FlashMLA at four concurrencies, single cache (V4, V3.2) and the V4 layer
    call, from the newest bench and bench_call rows, with each run's date, device, kernel and command."""
    single, call = newest("bench_single", rows), newest("bench_call", rows)
    if single is None or call is None:
        raise LedgerError("the ledger holds no bench_single or no bench_call row")
    head = "| µs per call, ours / FlashMLA | " + " | ".join(f"C={c}" for c in HEADLINE_C) + " |"
    lines = [head, "|---|" + "---|" * len(HEADLINE_C)]
    for label, run, prefix in (
        ("DeepSeek-V4, one cache (`fp8_model1`)", single, "fp8_model1"),
        ("DeepSeek-V3.2, one cache (`fp8_v32`)", single, "fp8_v32"),
        ("DeepSeek-V4 layer call (two caches + sink)", call, "layer"),
    ):
        cells = []
        for c in HEADLINE_C:
            f = run["figures"].get(f"{prefix} C={c}", {})
            cells.append(f"{f['us']:.1f} / {f['flashmla_us']:.1f}" if f.get("us") and f.get("flashmla_us") else "-")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    for name, run in (("One cache", single), ("Layer call", call)):
        lines.append(
            f"{name}: {run['device']}, {run['date']}, kernel `{run['kernel']}`, commit `{run['commit']}`: "
            f"`{run['command']}` (`{run['file']}`)."
        )
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def readme_headline(text: str) -> str:
    """What README.md holds between its headline markers."""
    if BEGIN not in text or END not in text:
        raise LedgerError(f"README.md has no headline markers ({BEGIN} ... {END})")
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"


def write_readme() -> bool:
    text = README.read_text()
    new = headline()
    if readme_headline(text) == new:
        return False
    before, rest = text.split(BEGIN, 1)
    README.write_text(before + BEGIN + "\n" + new + END + rest.split(END, 1)[1])
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python results/ledger.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command_name", required=True)
    a = sub.add_parser("add", help="append FILE's row to results/ledger.jsonl")
    a.add_argument("file", type=Path, help="a benchmark's raw output (JSON) under results/")
    for opt in ("date", "device", "kernel", "command", "commit"):
        a.add_argument(f"--{opt}", default=None, help=f"the run's {opt}, where the file does not say it")
    h = sub.add_parser("headline", help="print the README's headline table from the ledger")
    h.add_argument("--write", action="store_true", help="write it into README.md between its markers")
    args = parser.parse_args(argv)
    try:
        if args.command_name == "add":
            given = {k: getattr(args, k) for k in ("date", "device", "kernel", "command", "commit")}
            row = row_of(args.file, **given)
            with LEDGER.open("a") as f:
                f.write(json.dumps(row, sort_keys=True) + "\n")
            print(f"{LEDGER.relative_to(ROOT)}: {row['kind']} of {row['date']} added", file=sys.stderr)
        elif args.write:
            print("README.md " + ("updated" if write_readme() else "is current"), file=sys.stderr)
        else:
            print(headline(), end="")
    except LedgerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
