"""Sparse MLA decode kernel for DeepSeek FP8 KV caches (Triton), its torch reference and formats.

File roles (fla style): ``decode.py`` kernels + launcher + public function + ``compile_spec``;
``reference.py`` the pure-torch ground truth with the same signature; ``kv_format.py`` byte layouts;
``config.py`` the declaration of the tunable parameters; ``table.py`` the exported autotune table;
``workload.py`` realistic random batches; ``bench.py`` the GPU benchmark.
"""

from kernels.config import DEFAULT_CONFIG
from kernels.config import KernelConfig
from kernels.config import kernel_source_hash
from kernels.decode import sparse_mla_decode
from kernels.kv_format import FORMATS
from kernels.workload import Workload
from kernels.workload import make_batch

__all__ = [
    "DEFAULT_CONFIG",
    "FORMATS",
    "KernelConfig",
    "Workload",
    "kernel_source_hash",
    "make_batch",
    "sparse_mla_decode",
]
