"""Where a kernel's warps wait, per SASS opcode, from Nsight Compute's source page (no GPU needed to read it).

    ncu --set full -k regex:_split_kernel --launch-skip 6 --launch-count 1 -o prof \\
        python benchmarks/profile_split.py fp8_model1 96
    ncu --import prof.ncu-rep --page source --csv --print-source sass > sass.csv
    python benchmarks/ncu_stalls.py sass.csv            # the 25 opcodes with the most stall samples
    python benchmarks/ncu_stalls.py sass.csv --top 0    # all of them

Per opcode (predicate and modifiers dropped: ``@!P0 LDG.E.128`` is ``LDG``): its share of the warp-state
samples, how many warp-level instructions of it ran, and its three largest sampled reasons (``short_sb``:
waiting on shared memory, MUFU or a conversion; ``long_sb``: on global or local memory; ``wait``: a fixed
latency; ``mio``: the shared-memory queue is full; ``selected``: issuing). ``results/ncu_h200/`` has its output
for the split kernel at V4 C = 96.
"""

from __future__ import annotations

import argparse
import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def _int(text: str) -> int:
    text = text.strip().replace(",", "")
    return int(float(text)) if text and text not in ("-", "n/a") else 0


def opcode(source: str) -> str:
    """The base opcode of one SASS line: ``@!P0 LDG.E.128 R4, [R2.64]`` -> ``LDG``."""
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def read(path: str) -> tuple[list[dict], int]:
    """Per opcode {opcode, samples, executed, reasons: Counter}, most samples first, and the samples in all.

    Raises ValueError when the file is not ncu's source page as CSV."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header_at = next((i for i, r in enumerate(rows) if "Address" in r and "Source" in r), None)
    if header_at is None or SAMPLES not in rows[header_at]:
        raise ValueError(
            f"{path} is not Nsight Compute's SASS source page as CSV (no 'Address', 'Source' and '{SAMPLES}' "
            "columns); write it with `ncu --import REPORT --page source --csv --print-source sass`"
        )
    header = rows[header_at]
    col = {name: i for i, name in enumerate(header)}
    reasons = [c for c in header if c.startswith("stall_") and "Not Issued" not in c]
    by_op: dict[str, dict] = {}
    total = 0
    for r in rows[header_at + 1 :]:
        if len(r) < len(header):
            continue
        op = opcode(r[col["Source"]])
        entry = by_op.setdefault(op, {"opcode": op, "samples": 0, "executed": 0, "reasons": collections.Counter()})
        samples = _int(r[col[SAMPLES]])
        entry["samples"] += samples
        entry["executed"] += _int(r[col[EXECUTED]]) if EXECUTED in col else 0
        for c in reasons:
            entry["reasons"][c.removeprefix("stall_")] += _int(r[col[c]])
        total += samples
    return sorted(by_op.values(), key=lambda e: (-e["samples"], e["opcode"])), total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", help="ncu's source page: ncu --import REPORT --page source --csv --print-source sass")
    ap.add_argument("--top", type=int, default=25, help="opcodes to print, most samples first (0: all)")
    args = ap.parse_args(argv)
    if args.top < 0:
        ap.error(f"--top must be 0 (all) or a positive number of opcodes, got {args.top}")
    try:
        ops, total = read(args.csv)
    except OSError as e:
        print(f"ncu_stalls.py: cannot read {args.csv}: {e.strerror}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"ncu_stalls.py: {e}", file=sys.stderr)
        return 2
    from tabulate import tabulate

    shown = ops if args.top == 0 else ops[: args.top]
    table = [
        [
            e["opcode"],
            e["samples"],
            100.0 * e["samples"] / total if total else 0.0,
            e["executed"],
            ", ".join(f"{name} {n}" for name, n in e["reasons"].most_common(3) if n),
        ]
        for e in shown
    ]
    print(f"{total} warp-state samples over {len(ops)} opcodes")
    print(tabulate(table, headers=["opcode", "samples", "%", "executed", "largest reasons"], floatfmt=".1f"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
