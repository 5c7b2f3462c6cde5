"""The sparse-MLA decode kernel (``kernels/``) as the tuner's first adapter (``kernel: sparse_mla``).

The wing's door: the tuner's core reaches the kernel through this class alone (:class:`tuner.adapter.KernelAdapter`),
and the wing's other modules (export, replay, report, records, presets) through its hooks.
"""

from __future__ import annotations

import json
import math
from collections.abc import Hashable
from dataclasses import dataclass

from ....kernels.config import BY_NAME
from ....kernels.config import PARAM_NAMES
from ....kernels.config import PARAMS
from ....kernels.config import KernelConfig
from ....kernels.config import Role
from ....kernels.config import block_h_for
from ....kernels.config import head_blocks_for
from ....kernels.config import kernel_source_hash
from ....kernels.config import launch_identity
from ....kernels.config import split_grid
from ....kernels.kv_format import FORMATS
from ....kernels.kv_format import check_pair
from ....kernels.kv_format import get_format
from ....kernels.workload import Workload
from ....kernels.workload import make_batch
from ...adapter import KernelAdapter
from ...adapter import Tunable
from ...space import _check_keys
from ...space import _choice
from ...space import _err
from ...space import _name
from ...space import _pos_int
from ...space import _show

WORKLOAD_KEYS = ("name", "kv_format", "heads", "tp", "topk", "page_size", "context", "extra", "attn_sink", "q_tokens")
EXTRA_KEYS = ("kv_format", "topk", "page_size", "context")  # the second cache of a whole V4 call
MAX_Q_TOKENS = 16
MODES = ("PREFETCH",)  # parameters whose values are modes, not a scale: any value is one step from any other
MAX_POOL_REQUESTS = 512  # the most requests of one timing's input sets (cold L2 on a GPU)
INVALID_FRACTION = 0.05  # the gate's share of invalid indices


@dataclass(frozen=True)
class WorkloadSpec:
    """A model's attention shape at one TP degree; ``local_heads = heads // tp`` run on one GPU."""

    name: str
    kv_format: str
    heads: int
    tp: int
    topk: int
    page_size: int
    context: int
    extra: tuple | None = None  # (kv_format, topk, page_size, context) of the extra cache
    attn_sink: bool = False
    q_tokens: int = 1

    @property
    def local_heads(self) -> int:
        return self.heads // self.tp

    def workload(self) -> Workload:
        heads = self.local_heads
        extra = None if self.extra is None else Workload(self.extra[0], heads, *self.extra[1:])
        return Workload(
            self.kv_format, heads, self.topk, self.page_size, self.context, extra, self.attn_sink, self.q_tokens
        )

    def fields(self) -> dict:
        """The database row of this workload (:func:`db.queries.ensure_workload`)."""
        fmt = get_format(self.kv_format)
        return {
            "name": self.name,
            "kv_format": self.kv_format,
            "heads": self.local_heads,
            "tp": self.tp,
            "topk": self.topk,
            "page_size": self.page_size,
            "context": self.context,
            "d_qk": fmt.d_qk,
            "d_v": fmt.d_v,
            "call": None if (call := self.workload().call()) is None else json.dumps(call, sort_keys=True),
        }


def _call(path, key, w, kv_format) -> dict:
    """A workload's whole-call keys: ``extra: {kv_format, topk, page_size, context}``, ``attn_sink``, ``q_tokens``."""
    out: dict = {}
    if "extra" in w:
        e = w["extra"]
        _check_keys(path, f"{key}.extra", e, EXTRA_KEYS)
        for req in ("kv_format", "topk"):
            if req not in e:
                raise _err(path, f"{key}.extra.{req}", "is required")
        fmt = _choice(path, f"{key}.extra.kv_format", e["kv_format"], FORMATS)
        if FORMATS[fmt].d_qk != FORMATS[kv_format].d_qk:
            raise _err(
                path,
                f"{key}.extra.kv_format",
                f"must have the main cache's head dim ({kv_format}: "
                f"{FORMATS[kv_format].d_qk}); {fmt} has {FORMATS[fmt].d_qk}",
            )
        nums = [
            _pos_int(path, f"{key}.extra.{k}", e.get(k, d))
            for k, d in (("topk", None), ("page_size", 64), ("context", 8192))
        ]
        out["extra"] = (fmt, *nums)
    if "attn_sink" in w:
        if not isinstance(w["attn_sink"], bool):
            raise _err(path, f"{key}.attn_sink", f"must be true or false, got {_show(w['attn_sink'])}")
        out["attn_sink"] = w["attn_sink"]
    if "q_tokens" in w:
        out["q_tokens"] = _pos_int(path, f"{key}.q_tokens", w["q_tokens"], maximum=MAX_Q_TOKENS)
    return out


def estimate_shared(config: KernelConfig, workload: Workload) -> int:
    """Shared bytes of the split kernel from the tiles it stages; explains the compiled number.

    Fitted term by term to Triton 3.6's allocation for this kernel (sm_90/sm_120 cubins; the worst
    error over the default space is asserted in tests/test_feasibility.py):

    - ``q`` staged as an mma operand: ``BLOCK_H x D_qk`` bf16;
    - the key tile's layout change before the dots: fp8_model1 reshapes the fp32
      ``[BLOCK_T, 8, 64]`` tile (4 B per element, ``2048 * BLOCK_T``), fp8_v32 the byte tile
      (``512 * BLOCK_T``);
    - ``num_stages >= 2``: one more copy of the gathered bytes in flight (Triton 3.6 gives the
      dependent gather a pipeline distance of 1 whatever ``num_stages`` > 2 says, so stages 3 and 4
      cost next to nothing more): 512 e4m3 + 128 rope + 4 index bytes per token (fp8_model1), the
      rope, scales and index only (180 B, fp8_v32: the e4m3 bytes land in the byte tile above);
    - ``PREFETCH=1`` (or 3) instead: the pipeliner leaves the loop alone, and the dequantized fp16 key tile
      is what changes layout: ``1024 * BLOCK_T`` plus the scales as fp32 (32 B per token,
      fp8_model1) or the fp16 rope part (128 B per token, fp8_v32), whatever ``num_stages`` says;
    - the formats without a bf16 rope part (``fp8_v32_nope``, ``fp8_v41``) stage as ``fp8_v32`` does, less the
      rope: 52 B per token for the second stage, 32 B per token with ``PREFETCH=1``; an ``fp4_v41`` compressed cache
      makes the key tile's layout change fp32, as ``fp8_model1``'s (``2048 * BLOCK_T``), and its second stage
      292 B per token (256 e2m1 + 32 scale + 4 index bytes). Fitted on sm_120 cubins of ``glm53_nope_tp4`` and
      ``v41_flash_layer_tp4`` (exact at 16 heads, BLOCK_T 16 to 64, but 16 B per token over for a lone ``fp8_v41``
      cache at BLOCK_T 16 and two stages);
    - ``PREFETCH=2`` (the indices only, in registers) stages what ``PREFETCH=0`` stages;
    - the epilogue converts the ``[BLOCK_H, 512]`` output through the same memory after the loop, in
      bf16 since kernel v3 (both the final output and the partials are bf16), so the kernel needs the
      larger of loop and epilogue.
    """
    fmt = get_format(workload.kv_format)
    T, block_h = config.BLOCK_T, block_h_for(workload.heads)
    q_tile = block_h * fmt.d_qk * 2
    staged = config.num_stages >= 2
    fp4 = workload.extra is not None and get_format(workload.extra.kv_format).element == "e2m1"
    if config.PREFETCH in (1, 3):
        loop = q_tile + T * (1024 + (128 if fmt.name == "fp8_v32" else 32))
    elif fmt.name == "fp8_model1":
        loop = q_tile + T * 512 * 4 + (T * (512 + 128 + 4) if staged else 0)
    elif fp4:
        loop = q_tile + T * 512 * 4 + (T * (256 + 32 + 4) if staged else 0)
    else:
        loop = q_tile + T * 512 + (T * (52 + 2 * fmt.d_rope) if staged else 0)
    epilogue = block_h * 512 * 2
    return max(loop, epilogue)


class SparseMlaAdapter(KernelAdapter):
    """The sparse-MLA decode call: one split launch over the caches, then one combine (``kernels/decode.py``)."""

    name = "sparse_mla"
    config_type = KernelConfig
    modes = MODES
    family = ("BLOCK_T", "num_warps")  # a tile shape
    geometry = ("BALANCED",)  # the balanced deal of tiles to programs
    resource_kernels = ("split",)  # the combine kernel's registers never decide

    @property
    def params(self) -> tuple[Tunable, ...]:
        return _TUNABLES

    def parse_workload(self, path: str, key: str, w) -> WorkloadSpec:
        _check_keys(path, key, w, WORKLOAD_KEYS)
        missing = [k for k in ("name", "kv_format", "heads", "topk") if k not in w]  # the rest have defaults
        if missing:
            raise _err(path, f"{key}.{missing[0]}", "is required")
        wname = _name(path, f"{key}.name", w["name"], strict=False)
        kv_format = _choice(path, f"{key}.kv_format", w["kv_format"], FORMATS)
        vals = {
            k: _pos_int(path, f"{key}.{k}", w.get(k, d))
            for k, d in (("heads", None), ("tp", 1), ("topk", None), ("page_size", 64), ("context", 8192))
        }
        if vals["heads"] % vals["tp"]:
            raise _err(path, f"{key}.tp", f"must divide heads ({vals['heads']}), got {vals['tp']}")
        call = _call(path, key, w, kv_format)
        try:  # an extra-only format (fp4_v41) as the main cache, or a pair FlashMLA does not have
            check_pair(kv_format, call["extra"][0] if "extra" in call else None)
        except ValueError as e:
            raise _err(path, f"{key}.extra.kv_format" if "extra" in call else f"{key}.kv_format", str(e)) from None
        return WorkloadSpec(wname, kv_format, **vals, **call)

    def encode(self, cfg: KernelConfig, wl: Workload, concurrency: int) -> list[float]:
        """log2 C, the parameters (log2), PREFETCH one-hot, the split geometry of every cache at this batch."""
        out = [math.log2(concurrency)]
        for name in PARAM_NAMES:
            out.append(math.log2(getattr(cfg, name) + 1))
        out += [float(cfg.PREFETCH == k) for k in range(BY_NAME["PREFETCH"].low, BY_NAME["PREFETCH"].high + 1)]
        rows = concurrency * wl.q_tokens
        for cache in wl.caches():
            g = split_grid(cfg, rows, wl.heads, cache.topk)
            row_tiles = max(1, -(-cache.topk // cfg.BLOCK_T))
            programs = g.programs * head_blocks_for(wl.heads)
            out += [
                math.log2(programs),
                math.log2(g.slots),
                math.log2(rows * row_tiles / g.programs),
                float(g.balanced),
            ]
        return out

    def inputs(self, workload: Workload, batch: int, device: str, seed: int = 0):
        return make_batch(workload, batch, device=device, seed=seed)

    def launch(self, config: KernelConfig, inputs):
        from ....kernels import decode

        return decode.sparse_mla_decode(*inputs.args(), **inputs.kwargs(), config=config)

    def reference(self, inputs):
        from ....kernels.reference import sparse_mla_decode_ref

        return sparse_mla_decode_ref(*inputs.args(), **inputs.kwargs())

    def check(self, outputs, expected) -> str:
        from ....kernels.reference import compare

        ok, _, _, reason = compare(*outputs, *expected)
        return "" if ok else reason

    def launch_identity(self, config: KernelConfig, workload: Workload, batch: int) -> Hashable:
        rows = batch * workload.q_tokens  # every query token is a row of the grid
        extra_topk = workload.extra.topk if workload.extra is not None else 0  # one launch walks both caches
        return launch_identity(config, workload.heads, workload.topk, rows, extra_topk)

    def bytes_moved(self, workload: Workload, batch: int) -> int:
        return workload.min_bytes(batch)

    def compile_specs(self, config: KernelConfig, workload: Workload, cc: int, batch: int | None = None) -> list:
        from ....kernels import decode

        return decode.compile_spec(
            config, workload, cc, batch, extra=workload.extra, attn_sink=workload.attn_sink, q_tokens=workload.q_tokens
        )

    def source_hash(self) -> str:
        return kernel_source_hash()

    # --- the measurement and compile processes ----------------------------------------------------------------

    def workload_from_dict(self, d) -> Workload:
        return Workload(**d)

    def compile_identity(self, config: KernelConfig, workload: Workload) -> list:
        """The binary's compile key and the shape: TARGET_CTAS only sets the grid, so it is not part of it."""
        shape = (workload.kv_format, workload.heads, workload.topk, workload.page_size)
        if workload.call() is not None:  # the whole call compiles more variants (extra cache, sink)
            shape = (*shape, json.dumps(workload.call(), sort_keys=True))
        return [config.compile_key(), shape]

    def estimate_shared(self, config: KernelConfig, workload: Workload) -> int:
        return estimate_shared(config, workload)

    def measure_inputs(self, workload: Workload, batch: int, device: str, l2_bytes: int, seed: int) -> list:
        """Disjoint request sets of one shared cache: on a GPU the touched rows are at least 4x L2 and at least
        2 sets (at most :data:`MAX_POOL_REQUESTS` requests), on the CPU one set."""
        if device == "cuda":
            want = max(2 * batch, -(-4 * l2_bytes // workload.kv_bytes_per_request()))
            pool = min(max(want, batch), max(MAX_POOL_REQUESTS, batch))
        else:
            pool = batch
        sets = max(1, pool // batch)
        whole = make_batch(workload, sets * batch, device=device, seed=seed)
        return [whole.rows(i * batch, (i + 1) * batch) for i in range(sets)]  # the whole call each

    def prepare(self, config: KernelConfig, input_sets: list) -> list:
        """``decode.prepare_decode`` of each set, planned once (one output and workspace for all of them)."""
        from ....kernels import decode

        first = decode.prepare_decode(*input_sets[0].args(), **input_sets[0].kwargs(), config=config)
        return [first] + [
            decode.prepare_decode(*p.args(), **p.kwargs(), config=config, buffers=first) for p in input_sets[1:]
        ]

    def gate(self, config: KernelConfig, workload: Workload, batch: int, device: str, seed: int) -> tuple[str, dict]:
        """Fresh random inputs (invalid indices, no topk_length), NaN-poisoned outputs, vs the reference."""
        # no topk_length here: the timed call runs without it, and one compiled variant serves both
        # (the test suite covers topk_length on every format)
        from ....kernels import decode
        from ....kernels.reference import compare
        from ....kernels.reference import sparse_mla_decode_ref

        bt = make_batch(workload, batch, device=device, seed=seed, invalid_fraction=INVALID_FRACTION)
        decode.POISON_OUTPUTS = True
        try:
            out, lse = decode.sparse_mla_decode(*bt.args(), **bt.kwargs(), config=config)
        finally:
            decode.POISON_OUTPUTS = False
        ok, rel, lse_err, reason = compare(out, lse, *sparse_mla_decode_ref(*bt.args(), **bt.kwargs()))
        return ("" if ok else reason or "wrong output"), {"out_rel_err": rel, "lse_abs_err": lse_err}

    def launch_size(self, config: KernelConfig, workload: Workload, batch: int) -> int:
        """The partials per row of the call's one split launch (both caches of a whole call): the grid's rows are
        ``batch`` requests times ``q_tokens`` query tokens (as :meth:`launch_identity` counts them)."""
        extra_topk = workload.extra.topk if workload.extra is not None else 0
        return split_grid(config, batch * workload.q_tokens, workload.heads, workload.topk, extra_topk).slots

    # --- the database's columns, export, replay, report, presets (the wing's other modules) ---------------------

    def recorded_config(self, trial) -> KernelConfig:
        from . import records

        return records.config_of(trial)

    def recorded_workload(self, row) -> Workload:
        from . import records

        return records.workload_of(row)

    def compiled_label(self, config: KernelConfig) -> str:
        return config.compile_label()

    def exporters(self) -> dict:
        from . import export

        return {
            "engine": export.exporter("engine"),
            "sglang": export.exporter("sglang"),
            "triton": export.triton_exporter,
        }

    def export_dir(self):
        from ....kernels.table import tables_dir

        return tables_dir()

    def replay_key(self, workload: Workload) -> Hashable:
        from . import records

        return records.shape(workload)

    def report_sections(self):
        from .report import SparseMlaSections

        return SparseMlaSections(self)

    def model_space(self, model: str, tp: int, **options):
        from . import presets

        return presets.model_space(model, tp, **options)

    def served_shapes(self, device: str, **filters) -> list[dict]:
        from . import presets

        return presets.served_shapes(device, **filters)


_TUNABLES = tuple(
    Tunable(
        p.name,
        p.default,
        p.rule,
        p.valid,
        compiled=p.role is not Role.LAUNCH,
        required=p.always_in_key,
        doc=p.doc,
    )
    for p in PARAMS
)
