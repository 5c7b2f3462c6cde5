"""The kernel's tunable parameters, declared once.

Everything else derives from :data:`PARAMS`: the search-space validation, the results database's
columns, the check table, the printed key (``T32-w4-s1-c512``) and its parser, the compile key,
the launch identity, export to ``triton.Config`` and the report. Adding a parameter means adding
a :class:`Param` here, using it in :mod:`kernels.decode`, a database migration and tests.

A parameter's :class:`Role` says what it changes:

- ``META``: a ``tl.constexpr`` of the split kernel; part of the compiled binary.
- ``OPTION``: a Triton compile option (``num_warps``, ``num_stages``, ``maxnreg``); part of the binary.
- ``LAUNCH``: host side only; ``TARGET_CTAS`` changes the grid (the split count), not the code.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


class Role(enum.Enum):
    META = "meta"
    OPTION = "option"
    LAUNCH = "launch"


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_pow2(x) -> bool:
    return _is_int(x) and x > 0 and (x & (x - 1)) == 0


def _quote(value, limit: int = 200) -> str:
    """``repr(value)`` cut to about ``limit`` characters (a message never echoes a huge input whole)."""
    if isinstance(value, int) and value.bit_length() > 600:  # repr would be long, or refused past 4300 digits
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


@dataclass(frozen=True)
class Param:
    """One tunable: its name, the letter that prefixes it in a config key, default, role, bounds and rule.

    Every value is an integer in ``low..high`` (both inclusive) that also passes ``check``; ``rule`` says
    so in words. The bounds hold wherever a config enters (spaces, tables, ``--first``, the database):
    :class:`KernelConfig` refuses anything else, so no value can overflow the kernel's int32 arithmetic.
    """

    name: str
    short: str
    default: int
    role: Role
    low: int
    high: int
    rule: str  # what is allowed, for messages
    check: Callable[[int], bool]  # beyond the bounds (a power of two, a set of values)
    doc: str
    always_in_key: bool = True  # False: printed only when it differs from the default

    def valid(self, v) -> bool:
        return _is_int(v) and self.low <= v <= self.high and self.check(v)

    @property
    def compiled(self) -> bool:
        """Whether the value is part of the compiled binary (else it only shapes the launch)."""
        return self.role is not Role.LAUNCH


def _any(v) -> bool:
    return True


# Triton's largest block holds 2**20 elements (TRITON_MAX_TENSOR_NUMEL); a tile is [BLOCK_T, 512].
MAX_BLOCK_T = 2**20 // 512
# Far beyond any GPU's resident CTAs, and the split count is clamped to the tiles anyway; an int32 grid.
MAX_TARGET_CTAS = 2**20

PARAMS: tuple[Param, ...] = (
    Param(
        "BLOCK_T",
        "T",
        16,
        Role.META,
        16,
        MAX_BLOCK_T,
        f"a power of two >= 16, at most {MAX_BLOCK_T}",
        _is_pow2,
        "tokens per tile (tl.dot needs at least 16; Triton's largest block bounds it above)",
    ),
    Param(
        "num_warps",
        "w",
        4,
        Role.OPTION,
        1,
        32,
        "a power of two in 1..32",
        _is_pow2,
        "warps per program (Triton launch option)",
    ),
    Param(
        "num_stages",
        "s",
        2,
        Role.OPTION,
        1,
        8,
        "an integer in 1..8",
        _any,
        "software-pipelining depth of the tile loop",
    ),
    Param(
        "TARGET_CTAS",
        "c",
        256,
        Role.LAUNCH,
        1,
        MAX_TARGET_CTAS,
        f"a positive integer, at most {MAX_TARGET_CTAS}",
        _any,
        "the grid the split count aims for: "
        "num_splits = clamp(ceil(TARGET_CTAS / (B * head_blocks)), 1, ceil(topk / BLOCK_T))",
    ),
    Param(
        "maxnreg",
        "r",
        0,
        Role.OPTION,
        0,
        255,
        "0 (no cap) or an integer in 16..255",
        lambda v: v == 0 or v >= 16,
        "register cap per thread of the split kernel (Triton's maxnreg); 0 lets ptxas take up to 255",
        always_in_key=False,
    ),
    Param(
        "PREFETCH",
        "p",
        0,
        Role.META,
        0,
        3,
        "0, 1, 2 or 3",
        _any,
        "1: the tile loop loads tile i+1's indices and KV bytes into registers before tile i's math "
        "(Triton's pipeliner then leaves the loop alone, so num_stages changes nothing); "
        "2: only tile i+1's indices (one register per token); 3: as 1, and tile i+2's indices too, "
        "so no gather waits for its addresses; 0: none",
        always_in_key=False,
    ),
    Param(
        "BALANCED",
        "b",
        0,
        Role.META,
        0,
        1,
        "0 or 1",
        _any,
        "1: the batch's tiles, row after row, are dealt to ceil(TARGET_CTAS / head_blocks) programs in equal "
        "contiguous runs that may cross rows (no partial wave of whole rows' splits); 0: every row is split "
        "alike. A target of no more programs than rows runs the 0 kernel",
        always_in_key=False,
    ),
    Param(
        "MERGE",
        "m",
        0,
        Role.META,
        0,
        1,
        "0 or 1",
        _any,
        "1: the split launch merges a row's partials itself (the last of the row's programs to finish, by an "
        "atomic counter per row) and there is no combine launch; 0: a separate combine launch merges them. "
        "One split per row runs the 0 kernel (no merge at all)",
        always_in_key=False,
    ),
)
PARAM_NAMES: tuple[str, ...] = tuple(p.name for p in PARAMS)
BY_NAME: dict[str, Param] = {p.name: p for p in PARAMS}
BY_SHORT: dict[str, Param] = {p.short: p for p in PARAMS}
KEY_EXAMPLE = "T16-w4-s2-c256"


class _ConfigMethods:
    """Behaviour of :class:`KernelConfig`; its fields are generated from :data:`PARAMS`."""

    def __post_init__(self) -> None:
        for p in PARAMS:
            v = getattr(self, p.name)
            if not p.valid(v):
                raise ValueError(f"{p.name} must be {p.rule}, got {_quote(v)}")

    def as_dict(self) -> dict[str, int]:
        return {p.name: getattr(self, p.name) for p in PARAMS}

    @classmethod
    def from_dict(cls, d: dict) -> KernelConfig:
        """Parameters by name; a missing one takes its default, an unknown one is an error."""
        if not isinstance(d, dict):
            raise ValueError(f"a config must be a mapping of {list(PARAM_NAMES)}, got {type(d).__name__}")
        unknown = [k for k in d if k not in BY_NAME]
        if unknown:
            raise ValueError(f"unknown config keys {sorted(map(str, unknown))}; allowed: {list(PARAM_NAMES)}")
        return cls(**d)

    def replace(self, **changes) -> KernelConfig:
        return dataclasses.replace(self, **changes)

    def __str__(self) -> str:
        return self._label(PARAMS)

    def compile_label(self) -> str:
        """The key without the launch-only parameters (``T32-w4-s2``): names the compiled binary."""
        return self._label([p for p in PARAMS if p.compiled])

    def _label(self, params) -> str:
        return "-".join(
            f"{p.short}{getattr(self, p.name)}" for p in params if p.always_in_key or getattr(self, p.name) != p.default
        )

    @classmethod
    def parse(cls, text: str) -> KernelConfig:
        """The inverse of ``str()``: ``T16-w4-s2-c256`` (a parameter printed only when set may be left out)."""
        values: dict[str, int] = {}
        for token in str(text).split("-"):
            p = BY_SHORT.get(token[:1])
            if p is None or not token[1:].isascii() or not token[1:].isdigit() or p.name in values:
                raise ValueError(f"config {_quote(text)} is not of the form {KEY_EXAMPLE}")
            if len(token) > 12:  # no bound has more digits; int() of a long string is slow or refused
                raise ValueError(f"config {_quote(text)}: {p.name} must be {p.rule}, got {token[1:13]}...")
            values[p.name] = int(token[1:])
        missing = [p.name for p in PARAMS if p.always_in_key and p.name not in values]
        if missing:
            raise ValueError(f"config {_quote(text)} is not of the form {KEY_EXAMPLE} (no {missing[0]})")
        return cls(**values)

    def compile_key(self) -> tuple[tuple[str, int], ...]:
        """The parameters that decide the compiled binary (TARGET_CTAS does not)."""
        return tuple((p.name, getattr(self, p.name)) for p in PARAMS if p.compiled)

    def meta(self) -> dict[str, int]:
        """The kernel's constexpr meta-parameters."""
        return {p.name: getattr(self, p.name) for p in PARAMS if p.role is Role.META}

    def options(self) -> dict[str, int]:
        """Triton compile options; a parameter at a 'no setting' default (maxnreg 0) is left out."""
        out = {p.name: getattr(self, p.name) for p in PARAMS if p.role is Role.OPTION}
        if not out.get("maxnreg"):
            out.pop("maxnreg", None)
        return out

    def triton_config_kwargs(self) -> dict:
        """Keyword arguments of ``triton.Config``: ``kwargs`` (meta-parameters) plus its options."""
        return {"kwargs": self.meta(), **self.options()}


KernelConfig = dataclasses.make_dataclass(
    "KernelConfig",
    [(p.name, int, dataclasses.field(default=p.default, metadata={"param": p})) for p in PARAMS],
    bases=(_ConfigMethods,),
    frozen=True,
    namespace={"__doc__": "A point of the search: " + "; ".join(f"{p.name}: {p.doc}" for p in PARAMS) + "."},
)
KernelConfig.__module__ = __name__

# The production starting point: the SGLang sm_120 kernel's defaults (BLOCK_T 16, 4 warps, 2 stages,
# 256 CTAs), which its authors' hand-tuning notes started from.
DEFAULT_CONFIG = KernelConfig()


# --- from parameters to a launch -----------------------------------------------------------------

MAX_BLOCK_H = 32


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def block_h_for(heads: int) -> int:
    """Heads per program: next power of two >= heads, at least 16 (tl.dot), at most 32."""
    return min(MAX_BLOCK_H, max(16, _next_pow2(heads)))


def head_blocks_for(heads: int) -> int:
    return -(-heads // block_h_for(heads))


def row_tiles_for(config: KernelConfig, topk: int, extra_topk: int = 0) -> int:
    """Tiles of one row: ``ceil(topk / BLOCK_T)``, plus ``ceil(extra_topk / BLOCK_T)`` for an extra cache
    walked by the same launch (its tiles come after the main cache's; no tile holds tokens of both)."""
    tiles = max(1, -(-topk // config.BLOCK_T))
    return tiles + (-(-extra_topk // config.BLOCK_T) if extra_topk else 0)


def num_splits_for(config: KernelConfig, batch: int, heads: int, topk: int, extra_topk: int = 0) -> tuple[int, int]:
    """(num_splits, tiles_per_split) for a batch.

    The requested count is ``clamp(ceil(TARGET_CTAS / (B * head_blocks)), 1, row_tiles)`` (``row_tiles``:
    ``ceil(topk / BLOCK_T)``, plus the extra cache's tiles, see :func:`row_tiles_for`); tiles are then dealt
    evenly and a split that would get no tile is dropped, so the launched count can be lower than requested
    (e.g. 4 tiles over 3 splits -> 2 splits of 2 tiles).
    """
    n_tiles = row_tiles_for(config, topk, extra_topk)
    want = min(max(-(-config.TARGET_CTAS // (batch * head_blocks_for(heads))), 1), n_tiles)
    per_split = -(-n_tiles // want)
    return -(-n_tiles // per_split), per_split


@dataclass(frozen=True)
class SplitGrid:
    """How one cache's top-k lists are dealt to the split kernel's programs (per head block).

    ``programs``: the split programs per head block. ``slots``: partial outputs per row, the number the
    combine merges (1 with one program per row: the split kernel writes the output itself).
    ``tiles_per_split``: tiles per program of the per-row deal; 0 for the balanced deal, whose programs
    take ``floor`` or ``ceil`` of ``rows * row_tiles / programs`` tiles each, across row ends.
    """

    programs: int
    slots: int
    tiles_per_split: int

    @property
    def balanced(self) -> bool:
        return self.tiles_per_split == 0

    def binary(self, config: KernelConfig) -> KernelConfig:
        """The config whose kernel runs on this grid: ``BALANCED=1`` that fell back to the per-row deal
        (a target of no more programs than rows) runs the ``BALANCED=0`` binary, and ``MERGE=1`` with one
        slot per row (nothing to merge: the split kernel writes the output) the ``MERGE=0`` one."""
        if config.BALANCED and not self.balanced:
            config = config.replace(BALANCED=0)
        if config.MERGE and self.slots == 1:
            config = config.replace(MERGE=0)
        return config


def split_grid(config: KernelConfig, batch: int, heads: int, topk: int, extra_topk: int = 0) -> SplitGrid:
    """The split geometry a call launches for ``batch`` rows (requests times query tokens).

    A row's tiles are the main cache's, then (``extra_topk`` > 0) the extra cache's: one launch walks both
    caches, a split's run of tiles may cover the end of one and the start of the other.
    ``BALANCED=1`` with a target of more programs than rows: ``min(ceil(TARGET_CTAS / head_blocks),
    rows * row_tiles)`` programs share the rows' tiles equally. A row spans at most
    ``1 + ceil((row_tiles - 1) / floor(units / programs))`` of them, which bounds its slots. Otherwise
    (and always with ``BALANCED=0``) the per-row deal of :func:`num_splits_for`.
    """
    row_tiles = row_tiles_for(config, topk, extra_topk)
    programs = min(-(-config.TARGET_CTAS // head_blocks_for(heads)), batch * row_tiles)
    if config.BALANCED and programs > batch:
        least = batch * row_tiles // programs  # >= 1 tile per program
        return SplitGrid(programs, min(programs, 1 + -(-(row_tiles - 1) // least)), 0)
    splits, per_split = num_splits_for(config, batch, heads, topk, extra_topk)
    return SplitGrid(batch * splits, splits, per_split)


def effective_config(config: KernelConfig, batch: int, heads: int, topk: int, extra_topk: int = 0) -> KernelConfig:
    """The config whose kernel a call at ``batch`` runs (see :meth:`SplitGrid.binary`)."""
    return split_grid(config, batch, heads, topk, extra_topk).binary(config)


def launch_identity(config: KernelConfig, heads: int, topk: int, batch: int, extra_topk: int = 0) -> tuple:
    """What a call actually launches: the compiled binary and the split geometry.

    Two configs with the same identity run exactly the same kernels on the same grid (TARGET_CTAS is
    clamped, so many values give one split count), so one measurement serves both. ``extra_topk``: the
    extra cache's top-k of a whole call (one launch walks both caches).
    """
    grid = split_grid(config, batch, heads, topk, extra_topk)
    key = grid.binary(config).compile_key()
    if grid.balanced:
        return (key, "balanced", grid.programs, grid.slots)
    return (key, grid.slots, grid.tiles_per_split)


# --- which kernel produced a number --------------------------------------------------------------

# Every source file a launch depends on: a change to any of them marks old results and tables stale.
KERNEL_FILES = ("decode.py", "kv_format.py", "config.py")
# The identity's scheme: bumped when what is hashed changes, so that two schemes never give one hash.
_IDENTITY_SCHEME = b"ast-1"
_PACKAGE = "sparse_mla_tuner"  # the installed namespace of kernels/, db/ and tuner/


def kernel_source_hash() -> str:
    """Short hash of the kernel's sources (the kernel, the KV formats and this declaration), as the compiler
    sees them: the parsed code without comments, docstrings and formatting (:func:`source_identity`). A
    comment, a docstring or a re-wrapped line keeps tables, calibrations and priors valid; a code change does not."""
    return _SOURCE_HASH


def source_identity(text: str) -> str:
    """What of one Python source a launch depends on, as text: its syntax tree with docstrings removed,
    written field by field (no line numbers, no expression contexts, no empty fields), so that it stays
    the same across formatting, comments and the Python versions' ways of printing a tree. Imports are
    written without the project's namespace (``sparse_mla_tuner.``), so the same code keeps its identity
    whether it is imported from a checkout or from the installed package."""
    import ast

    tree = ast.parse(text)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
        # the project's import prefix is left out: where the package lives is not what the compiler sees
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(_PACKAGE + "."):
            node.module = node.module.removeprefix(_PACKAGE + ".")
        elif isinstance(node, ast.alias) and node.name.startswith(_PACKAGE + "."):
            node.name = node.name.removeprefix(_PACKAGE + ".")
    out: list[str] = []

    def put(x) -> None:
        if isinstance(x, ast.AST):
            out.append(type(x).__name__ + "(")
            for name in x._fields:
                value = getattr(x, name, None)
                if name in ("ctx", "type_comment", "kind") or value is None or value == []:
                    continue
                out.append(name + "=")
                put(value)
                out.append(",")
            out.append(")")
        elif isinstance(x, list):
            out.append("[")
            for item in x:
                put(item)
                out.append(",")
            out.append("]")
        else:
            out.append(type(x).__name__ + ":" + repr(x))

    put(tree)
    return "".join(out)


def sources_hash(texts: dict[str, str]) -> str:
    """Short hash of named sources' :func:`source_identity` (name -> source text)."""
    h = hashlib.sha256(_IDENTITY_SCHEME)
    for name, text in texts.items():
        h.update(b"\0" + name.encode() + b"\0" + source_identity(text).encode())
    return h.hexdigest()[:12]


def _hash_sources() -> str:
    here = Path(__file__).parent
    return sources_hash({name: (here / name).read_text(encoding="utf-8") for name in KERNEL_FILES})


_SOURCE_HASH = _hash_sources()
