"""What the SGLang and vLLM plugins share: a served shape class's route (its table and the config of each row
count, resolved once) and the device rule of a call's tensors. It imports no engine."""

from __future__ import annotations

import torch

from .config import DEFAULT_CONFIG
from .config import KernelConfig
from .decode import INTERPRET
from .decode import device_name
from .table import fit_config
from .table import lookup_config


class Route:
    """A served shape class (every row count): which table serves it, and the config of each row count, once."""

    def __init__(self, device, kv_format: str, heads: int, topk: int, shape, max_rows):
        self.device, self.kv_format, self.heads, self.topk = device, kv_format, heads, topk
        self.shape = shape  # the tuned (heads, topk) whose table serves; None: the default config (interpreter)
        self.max_rows = max_rows  # rows served up to this (the table's largest batch); None: no limit
        self.configs: dict[int, KernelConfig] = {}
        self.warm = False

    def config(self, rows: int) -> KernelConfig:
        cfg = self.configs.get(rows)
        if cfg is None:
            if self.shape is None:
                cfg = DEFAULT_CONFIG
            else:
                cfg = lookup_config(device_name(self.device), self.kv_format, *self.shape, rows)
                if self.shape[1] > self.topk:
                    cfg = fit_config(cfg, self.topk)
            self.configs[rows] = cfg
        return cfg

    def serves(self, rows: int) -> bool:
        return self.max_rows is None or rows <= self.max_rows


def device_reason(q: torch.Tensor, devices: set) -> str | None:
    """Why a call's tensors (on ``devices``, ``q`` among them) are not served where they are (None: they are)."""
    if len(devices) != 1:
        return f"the tensors are on several devices ({sorted(map(str, devices))})"
    if q.device.type == "cpu" and not INTERPRET:
        return "tensors on the CPU without Triton's interpreter"
    if q.device.type not in ("cpu", "cuda"):
        return f"device {q.device.type} (served: CUDA GPUs)"
    return None


def warm_counts(route: Route, counts, capture_sizes, per: int = 1) -> list[int]:
    """The counts a warm-up runs: ``counts`` (None: each count up to the table's largest batch, ``per`` rows a
    count, or without a limit ``capture_sizes``) whose ``count * per`` rows the route serves."""
    if counts is None:
        counts = range(1, route.max_rows // per + 1) if route.max_rows else capture_sizes
    return [c for c in counts if route.serves(c * per)]
