"""The row softmax (:mod:`examples.row_softmax.kernel`) as a tuner adapter: a kernel the tuner was not written for.

A space file names it with ``kernel: examples.row_softmax.adapter:RowSoftmaxAdapter`` (``space.yaml`` beside
this file). Its parameters are ``BLOCK_N`` (columns per step, a ``tl.constexpr``) and ``num_warps`` (a compile
option); a workload is a row length and a dtype, and a level's concurrency is the number of rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from examples.row_softmax.kernel import _row_softmax_kernel
from examples.row_softmax.kernel import block_for
from examples.row_softmax.kernel import row_softmax
from examples.row_softmax.kernel import row_softmax_ref
from sparse_mla_tuner.tuner.adapter import CompileSpec
from sparse_mla_tuner.tuner.adapter import KernelAdapter
from sparse_mla_tuner.tuner.adapter import Tunable
from sparse_mla_tuner.tuner.adapter import source_files_hash

HERE = Path(__file__).resolve().parent

DTYPES = {"fp16": torch.float16, "fp32": torch.float32}
TOLERANCE = {"fp16": 2e-3, "fp32": 1e-5}  # the largest |kernel - reference| of one probability
MAX_COLS = 1 << 20


def _pow2(lo: int, hi: int):
    return lambda v: lo <= v <= hi and v & (v - 1) == 0


@dataclass(frozen=True)
class SoftmaxConfig:
    """A point of the search: ``BLOCK_N`` columns per step, ``num_warps`` warps per program."""

    BLOCK_N: int = 256
    num_warps: int = 4

    def __post_init__(self) -> None:
        for p in PARAMS:
            if not p.valid(getattr(self, p.name)):
                raise ValueError(f"{p.name} must be {p.rule}, got {getattr(self, p.name)!r}")

    @classmethod
    def from_dict(cls, d: dict) -> SoftmaxConfig:
        unknown = sorted(str(k) for k in d if k not in ("BLOCK_N", "num_warps"))
        if unknown:
            raise ValueError(f"unknown config keys {unknown}; allowed: ['BLOCK_N', 'num_warps']")
        return cls(**d)

    @classmethod
    def parse(cls, text: str) -> SoftmaxConfig:
        """The inverse of ``str()``: ``N256-w4``."""
        try:
            n, w = str(text).split("-")
            assert n[0] == "N" and w[0] == "w"
            return cls(int(n[1:]), int(w[1:]))
        except (AssertionError, ValueError, IndexError):
            raise ValueError(f"config {text!r} is not of the form N256-w4") from None

    def as_dict(self) -> dict[str, int]:
        return {"BLOCK_N": self.BLOCK_N, "num_warps": self.num_warps}

    def replace(self, **changes) -> SoftmaxConfig:
        return SoftmaxConfig(**{**self.as_dict(), **changes})

    def __str__(self) -> str:
        return f"N{self.BLOCK_N}-w{self.num_warps}"


PARAMS = (
    Tunable("BLOCK_N", 256, "a power of two in 16..65536", _pow2(16, 65536), doc="columns per step"),
    Tunable("num_warps", 4, "a power of two in 1..32", _pow2(1, 32), doc="warps per program"),
)


@dataclass(frozen=True)
class Rows:
    """A workload: rows of ``cols`` values of ``dtype``; a level's concurrency is the number of rows."""

    name: str
    cols: int
    dtype: str = "fp16"

    def workload(self) -> Rows:
        return self

    def fields(self) -> dict:
        return {"name": self.name, "cols": self.cols, "dtype": self.dtype}


class RowSoftmaxAdapter(KernelAdapter):
    name = "row_softmax"
    config_type = SoftmaxConfig

    @property
    def params(self) -> tuple[Tunable, ...]:
        return PARAMS

    def parse_workload(self, path: str, key: str, spec) -> Rows:
        if not isinstance(spec, dict) or set(spec) - {"name", "cols", "dtype"} or not {"name", "cols"} <= set(spec):
            raise ValueError("must be a mapping with `name`, `cols` and optionally `dtype`")
        cols, dtype = spec["cols"], spec.get("dtype", "fp16")
        if not isinstance(cols, int) or isinstance(cols, bool) or not 1 <= cols <= MAX_COLS:
            raise ValueError(f"`cols` must be an integer in 1..{MAX_COLS}, got {cols!r}")
        if dtype not in DTYPES:
            raise ValueError(f"`dtype` must be one of {sorted(DTYPES)}, got {dtype!r}")
        if not isinstance(spec["name"], str) or not spec["name"]:
            raise ValueError(f"`name` must be a non-empty string, got {spec['name']!r}")
        return Rows(spec["name"], cols, dtype)

    def inputs(self, workload: Rows, batch: int, device: str, seed: int = 0) -> torch.Tensor:
        g = torch.Generator(device="cpu").manual_seed(seed)
        x = 4 * torch.randn(batch, workload.cols, generator=g)
        return x.to(device=device, dtype=DTYPES[workload.dtype])

    def launch(self, config: SoftmaxConfig, inputs: torch.Tensor) -> torch.Tensor:
        return row_softmax(inputs, config.BLOCK_N, config.num_warps)

    def reference(self, inputs: torch.Tensor) -> torch.Tensor:
        return row_softmax_ref(inputs)

    def check(self, outputs: torch.Tensor, expected: torch.Tensor) -> str:
        dtype = next(k for k, v in DTYPES.items() if v == expected.dtype)
        err = (outputs.float() - expected.float()).abs().nan_to_num(float("inf")).max().item()
        return "" if err <= TOLERANCE[dtype] else f"max |error| {err:.3g} > {TOLERANCE[dtype]:g} ({dtype})"

    def launch_identity(self, config: SoftmaxConfig, workload: Rows, batch: int):
        # one program per row: the grid is the batch; the binary is the clamped block and the warps
        return (block_for(config.BLOCK_N, workload.cols), config.num_warps)

    def source_hash(self) -> str:
        """The kernel and this adapter: a change to either makes its results another kernel's."""
        return source_files_hash(HERE / "kernel.py", HERE / "adapter.py")

    def bytes_moved(self, workload: Rows, batch: int) -> int:
        return 2 * batch * workload.cols * DTYPES[workload.dtype].itemsize  # read once, written once

    def compile_specs(self, config: SoftmaxConfig, workload: Rows, cc: int, batch: int | None = None) -> list:
        ptr = "*fp16" if workload.dtype == "fp16" else "*fp32"
        signature = {"x_ptr": ptr, "y_ptr": ptr, "n_cols": "i32", "stride": "i32", "BLOCK_N": "constexpr"}
        block = block_for(config.BLOCK_N, workload.cols)
        return [
            CompileSpec(
                "row_softmax",
                _row_softmax_kernel,
                signature,
                {"BLOCK_N": block},
                {},
                {"num_warps": config.num_warps},
            )
        ]
