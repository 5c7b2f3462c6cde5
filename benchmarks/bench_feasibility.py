"""The feasibility check's cost, cold: every config of a space compiled for its target as `tuner search` compiles
it, with no cache (neither the results database's nor Triton's), on every core this process may use.

    python benchmarks/bench_feasibility.py search_spaces/v4_flash_tp4.yaml search_spaces/v32_tp8.yaml
    python benchmarks/bench_feasibility.py SPACE --depth both -o out.json   # shared-only and full compiles

``--depth search`` (the default) compiles as a search does: only to Triton's shared-memory allocation unless the
space sets ``max_spill_bytes`` (`tuner.search._feasibility`); ``full`` compiles to a cubin (registers and spills,
as `tuner check` does); ``both`` runs each. Prints one row per space, workload and depth: configs, distinct
compiles, feasible configs and seconds; ``-o`` writes the rows as JSON with the date, host and core count.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tabulate import tabulate  # noqa: E402


def measure(path: str, depth: str) -> list[dict]:
    """One row per workload of the space at ``path``: the cold check's time at ``depth``."""
    from sparse_mla_tuner.tuner.feasibility import check_many
    from sparse_mla_tuner.tuner.space import load_space

    space = load_space(path)
    rows = []
    for spec in space.workloads:
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-cold-")  # cold: no earlier compile reused
        wl, configs = spec.workload(), space.configs()
        registers = depth == "full" or space.max_spill_bytes is not None
        t0 = time.perf_counter()
        verdicts = check_many(configs, wl, space.target, max_spill_bytes=space.max_spill_bytes, registers=registers)
        rows.append(
            {
                "space": space.name,
                "workload": spec.name,
                "depth": "full" if registers else "shared",
                "configs": len(configs),
                "feasible": sum(v.feasible for v in verdicts),
                "seconds": round(time.perf_counter() - t0, 2),
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spaces", nargs="+")
    ap.add_argument("--depth", choices=("search", "full", "both"), default="search")
    ap.add_argument("-o", "--out")
    args = ap.parse_args()
    depths = ("search", "full") if args.depth == "both" else (args.depth,)
    rows = [row for path in args.spaces for depth in depths for row in measure(path, depth)]
    if args.out:
        info = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(),
            "cores": len(os.sched_getaffinity(0)),
            "command": " ".join(["python", *sys.argv]),
            "rows": rows,
        }
        Path(args.out).write_text(json.dumps(info, indent=1) + "\n")
    print(tabulate(rows, headers="keys"))


if __name__ == "__main__":
    main()
