"""Sparse MLA decode kernel for DeepSeek FP8 KV caches (Triton), its torch reference and formats.

File roles (fla style): ``decode.py`` kernels + launcher + public function + ``compile_spec``;
``reference.py`` the pure-torch ground truth with the same signature; ``kv_format.py`` byte layouts;
``config.py`` the declaration of the tunable parameters; ``table.py`` the exported autotune table;
``workload.py`` realistic random batches; ``bench.py`` the GPU benchmark; ``_interpreter.py`` two patches
of Triton's interpreter (bool masks, speed), installed under ``TRITON_INTERPRET=1``.
"""

import importlib
import os

from .config import DEFAULT_CONFIG
from .config import KernelConfig
from .config import kernel_source_hash

# torch and triton load on first use: reading a config or the results database needs neither
_LAZY = {
    "sparse_mla_decode": "sparse_mla_tuner.kernels.decode",
    "FORMATS": "sparse_mla_tuner.kernels.kv_format",
    "Workload": "sparse_mla_tuner.kernels.workload",
    "make_batch": "sparse_mla_tuner.kernels.workload",
}

__all__ = [
    "DEFAULT_CONFIG",
    "FORMATS",
    "KernelConfig",
    "Workload",
    "kernel_source_hash",
    "make_batch",
    "sparse_mla_decode",
]


if os.environ.get("TRITON_INTERPRET", "0") == "1":  # the interpreter's masks and per-call overhead (_interpreter.py)
    from . import _interpreter

    _interpreter.install_bool_masks()
    _interpreter.install()


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'kernels' has no attribute {name!r}")
