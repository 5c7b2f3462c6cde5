"""Kernel tunables and the run-time autotune table (``kernels/configs/*.json``).

The table is written by ``tuner export``: one JSON file per (device name, workload), keyed by
concurrency (batch size). The lookup rule: the largest key <= B, or the smallest key when B is
below all keys; with no table, :data:`DEFAULT_CONFIG`.
"""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import asdict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

CONFIG_DIR = Path(__file__).parent / "configs"
PARAMS = ("BLOCK_T", "num_warps", "num_stages", "TARGET_CTAS")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_pow2(x) -> bool:
    return _is_int(x) and x > 0 and (x & (x - 1)) == 0


@dataclass(frozen=True)
class KernelConfig:
    """What the tuner searches.

    BLOCK_T: tokens per tile, a power of two >= 16 (tl.dot needs 16).
    num_warps: Triton launch option, a power of two in 1..32.
    num_stages: software-pipelining depth of the tile loop, 1..8.
    TARGET_CTAS: grid size the split count aims for:
        num_splits = clamp(ceil(TARGET_CTAS / (B * head_blocks)), 1, ceil(topk / BLOCK_T)).
    """

    BLOCK_T: int = 16
    num_warps: int = 4
    num_stages: int = 2
    TARGET_CTAS: int = 256

    def __post_init__(self) -> None:
        if not (_is_pow2(self.BLOCK_T) and self.BLOCK_T >= 16):
            raise ValueError(f"BLOCK_T must be a power of two >= 16, got {self.BLOCK_T!r}")
        if not (_is_pow2(self.num_warps) and self.num_warps <= 32):
            raise ValueError(f"num_warps must be a power of two in 1..32, got {self.num_warps!r}")
        if not (_is_int(self.num_stages) and 1 <= self.num_stages <= 8):
            raise ValueError(f"num_stages must be an integer in 1..8, got {self.num_stages!r}")
        if not (_is_int(self.TARGET_CTAS) and self.TARGET_CTAS > 0):
            raise ValueError(f"TARGET_CTAS must be a positive integer, got {self.TARGET_CTAS!r}")

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> KernelConfig:
        unknown = set(d) - set(PARAMS)
        if unknown:
            raise ValueError(f"unknown config keys {sorted(unknown)}; allowed: {list(PARAMS)}")
        return cls(**{k: d[k] for k in PARAMS if k in d})

    def __str__(self) -> str:
        return f"T{self.BLOCK_T}-w{self.num_warps}-s{self.num_stages}-c{self.TARGET_CTAS}"


# The seeds' production starting point (SGLang sm120 kernel): BLOCK_T 16, 4 warps, 2 stages, 256 CTAs.
DEFAULT_CONFIG = KernelConfig()


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
    return KernelConfig.from_dict({p: entries[key][p] for p in PARAMS})


_warned: set[str] = set()


def _warn_if_stale(table: dict, path: Path) -> None:
    from kernels.decode import kernel_source_hash  # late: decode imports this module

    table_hash = table.get("kernel_hash")
    current = kernel_source_hash()
    if table_hash and table_hash != current and str(path) not in _warned:
        _warned.add(str(path))
        warnings.warn(
            f"autotune table {path.name} was tuned for kernel {table_hash}, the current kernel is {current}; "
            "using it anyway (re-run `tuner search` to refresh)",
            stacklevel=3,
        )
