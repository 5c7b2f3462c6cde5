"""What the results database's columns mean for the sparse-MLA kernel.

The schema (:mod:`db.models`) names the kernel's parameters as the ``tuner_trials`` columns
(:data:`db.models.CONFIG_COLUMNS`) and its workload's shape as the ``tuner_workloads`` columns, so that reading the
database imports no kernel module. Here they are read back as the kernel's own types.
"""

from __future__ import annotations

import json

from ....db.models import PARAM_COLUMNS
from ....kernels.config import KernelConfig
from ....kernels.workload import Workload


def config_of(trial) -> KernelConfig:
    """The :class:`KernelConfig` of a ``tuner_trials`` row: its parameter columns."""
    return KernelConfig(**{name: getattr(trial, name) for name in PARAM_COLUMNS})


def workload_of(row) -> Workload:
    """The whole :class:`Workload` a ``tuner_workloads`` row stands for, the call's extra cache, sink and query
    tokens (``call``) included, so bytes moved and table keys are those of the call measured."""
    call = json.loads(row.call) if row.call else {}
    extra = call.get("extra")
    return Workload(
        row.kv_format,
        row.heads,
        row.topk,
        row.page_size,
        row.context,
        extra=None if extra is None else Workload(**{**extra, "heads": row.heads}),
        attn_sink=bool(call.get("attn_sink", False)),
        q_tokens=int(call.get("q_tokens", 1)),
    )


def shape(workload) -> tuple:
    """What a recording is replayed for: the main cache's shape (a table is not keyed by the call's rest)."""
    w = workload
    return (w.kv_format, int(w.heads), int(w.topk), int(w.page_size), int(w.context))
