"""The run-time autotune table (``kernels/configs/*.json``), written by ``tuner export``.

One JSON file per (device name, workload), keyed by concurrency (batch size). The lookup rule:
the largest key <= B, or the smallest key when B is below all keys; with no table,
:data:`kernels.config.DEFAULT_CONFIG`.
"""

from __future__ import annotations

import json
import re
import warnings
from functools import lru_cache
from pathlib import Path

from kernels.config import DEFAULT_CONFIG
from kernels.config import PARAM_NAMES
from kernels.config import KernelConfig
from kernels.config import kernel_source_hash

CONFIG_DIR = Path(__file__).parent / "configs"


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", s).strip("_")


def table_name(device_name: str, kv_format: str, heads: int, topk: int) -> str:
    """File name of the autotune table for a device and workload shape (local heads, topk)."""
    return f"{_slug(device_name)}__{kv_format}_h{heads}_topk{topk}.json"


@lru_cache(maxsize=64)
def _load_table(path: str, mtime: float) -> dict:
    with open(path) as f:
        return json.load(f)


def lookup_config(
    device_name: str, kv_format: str, heads: int, topk: int, batch: int, config_dir: Path | None = None
) -> KernelConfig:
    """The exported config for this device/workload at batch ``batch``, else :data:`DEFAULT_CONFIG`."""
    path = (config_dir or CONFIG_DIR) / table_name(device_name, kv_format, heads, topk)
    if not path.is_file():
        return DEFAULT_CONFIG
    table = _load_table(str(path), path.stat().st_mtime)
    entries = {int(k): v for k, v in table.get("configs", {}).items()}
    if not entries:
        return DEFAULT_CONFIG
    below = [k for k in entries if k <= batch]
    key = max(below) if below else min(entries)
    _warn_if_stale(table, path)
    return KernelConfig.from_dict({p: entries[key][p] for p in PARAM_NAMES if p in entries[key]})


_warned: set[str] = set()


def _warn_if_stale(table: dict, path: Path) -> None:
    table_hash = table.get("kernel_hash")
    current = kernel_source_hash()
    if table_hash and table_hash != current and str(path) not in _warned:
        _warned.add(str(path))
        warnings.warn(
            f"autotune table {path.name} was tuned for kernel {table_hash}, the current kernel is {current}; "
            "using it anyway (re-run `tuner search` to refresh)",
            stacklevel=3,
        )
