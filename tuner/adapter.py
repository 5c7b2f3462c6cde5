"""The kernel adapter: everything the tuner needs to know about one kernel, behind one interface.

The tuner's search, statistics and records speak of configs, workloads and launches; an adapter says
what they are for one kernel. A space file names its adapter with ``kernel:``: a built-in name
(:data:`BUILTIN`, ``sparse_mla`` when the key is left out) or ``module:Class`` for a kernel of one's own
(``docs/adapters.md``). :func:`load_adapter` resolves the name and refuses a bad one in one sentence.

What an adapter gives (units in the method docs):

- the parameters (:attr:`KernelAdapter.params`: :class:`Tunable` values with their rule), the config type
  built from them, and their neighbours and encoding for the strategies;
- the workload levels' inputs (:meth:`KernelAdapter.parse_workload`, :meth:`KernelAdapter.inputs`);
- the launch (:meth:`KernelAdapter.launch`) and its identity (:meth:`KernelAdapter.launch_identity`: the
  compiled binary and the grid, so that two configs that run the same thing are measured once);
- the reference for the correctness gate (:meth:`KernelAdapter.reference`, :meth:`KernelAdapter.check`);
- the bytes a launch moves (:meth:`KernelAdapter.bytes_moved`), for the % of copy bandwidth;
- the feasibility compile for a target (:meth:`KernelAdapter.compile_specs`);
- the table to export (:meth:`KernelAdapter.export_table`).

This module names no kernel; it imports nothing of the kernels' layer.
"""

from __future__ import annotations

import abc
import functools
import importlib
import json
import math
import re
from collections.abc import Callable
from collections.abc import Hashable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sparse_mla_tuner.tuner.errors import SpaceError

# Built-in adapters by the name a space file gives (``kernel: sparse_mla``): "module:Class".
BUILTIN: dict[str, str] = {"sparse_mla": "sparse_mla_tuner.tuner.adapters.sparse_mla:SparseMlaAdapter"}
DEFAULT = "sparse_mla"
_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


@dataclass(frozen=True)
class Tunable:
    """One tunable parameter as the search sees it: an integer with a default and a rule.

    ``compiled``: whether the value is part of the compiled binary (else it only shapes the launch).
    ``check`` says whether a value is allowed; ``rule`` says so in words, for messages.
    """

    name: str
    default: int
    rule: str
    check: Callable[[int], bool]
    compiled: bool = True
    required: bool = True  # False: a space may leave it out (it keeps its default)
    doc: str = ""

    def valid(self, v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and self.check(v)


@dataclass(frozen=True)
class CompileSpec:
    """One kernel a launch compiles: what ``triton.compile(ASTSource(kernel, signature, constexprs, attrs),
    target=..., options=options)`` takes (see :meth:`KernelAdapter.compile_specs`)."""

    name: str
    kernel: object  # the @triton.jit function, as imported without TRITON_INTERPRET
    signature: dict[str, str]
    constexprs: dict
    attrs: dict
    options: dict


class KernelAdapter(abc.ABC):
    """One kernel, as the tuner sees it. Subclass it and implement the abstract methods.

    ``config_type`` is a frozen type whose fields are the parameters' names; it must offer ``from_dict``
    (a mapping of parameter names; a missing one takes its default; raises ``ValueError`` in one sentence),
    ``parse(text)`` (the inverse of ``str()``, the printed key, for display and storage), ``as_dict()`` and
    ``replace(**changes)``.
    """

    name: str = ""  # shown in messages and stored with results
    config_type: type
    # Neighbours: a config's neighbours move one parameter one step along the space's choices; a launch-only
    # parameter, or one named here (its values are modes, not a scale), moves to any of its values.
    modes: tuple[str, ...] = ()

    @property
    @abc.abstractmethod
    def params(self) -> Sequence[Tunable]:
        """The tunables, in the order configs are printed and expanded."""

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def config(self, values: Mapping[str, int]) -> Any:
        """A config from parameter values (``ValueError`` in one sentence for a bad one)."""
        return self.config_type.from_dict(dict(values))

    @property
    def family(self) -> tuple[str, ...]:
        """The parameters that make a shape (a family of launches the surrogate tries at every launch-only
        value): the compiled ones by default."""
        return tuple(p.name for p in self.params if p.compiled)

    def encode(self, config, workload, batch: int) -> list[float]:
        """A config's features for a model of run time: ``log2(1 + value)`` per parameter by default."""
        return [math.log2(1 + v) for v in config.as_dict().values()]

    @abc.abstractmethod
    def parse_workload(self, path: str, key: str, spec) -> Any:
        """A space file's workload entry -> the workload: an object with a unique ``name``, ``workload()`` (what
        :meth:`inputs` and the others take) and ``fields()`` (its stored description). A bad entry raises
        ``ValueError`` with one sentence; the space file ``path`` and the entry's ``key`` are put before it."""

    @abc.abstractmethod
    def inputs(self, workload, batch: int, device: str, seed: int = 0) -> Any:
        """The random inputs of one launch at a level (``batch``: the level's concurrency)."""

    @abc.abstractmethod
    def launch(self, config, inputs) -> Any:
        """Run the kernel on ``inputs`` with ``config``; returns its outputs."""

    @abc.abstractmethod
    def reference(self, inputs) -> Any:
        """The ground truth of the same call, in plain torch."""

    @abc.abstractmethod
    def check(self, outputs, expected) -> str:
        """Why ``outputs`` fail the correctness gate against ``expected`` ("" when they pass)."""

    @abc.abstractmethod
    def launch_identity(self, config, workload, batch: int) -> Hashable:
        """What a launch at ``batch`` runs: the compiled binary and the grid. Configs with the same identity
        run the same kernels on the same grid, so one measurement serves them all."""

    @abc.abstractmethod
    def bytes_moved(self, workload, batch: int) -> int:
        """The bytes one launch must read and write at least (for % of copy bandwidth)."""

    def compile_specs(self, config, workload, cc: int, batch: int | None = None) -> list:
        """What a launch compiles for the compute capability ``cc`` (objects with ``kernel``, ``signature``,
        ``constexprs``, ``attrs`` and ``options``, as ``triton.compile(ASTSource(...))`` takes them), for the
        feasibility check. Empty: nothing to check before launch."""
        return []

    def source_hash(self) -> str:
        """A short hash of the kernel's sources: results of another hash are another kernel's."""
        return ""

    def export_table(self, picks: Mapping[int, Any]) -> dict:
        """The table an engine reads: the picked config per level (batch size -> config)."""
        return {str(batch): cfg.as_dict() for batch, cfg in sorted(picks.items())}


def stored_launch(identity: Hashable) -> str:
    """A launch identity (:meth:`KernelAdapter.launch_identity`) as the database stores and indexes it."""
    return json.dumps(identity)


@functools.cache
def default_adapter() -> KernelAdapter:
    """The adapter of a space that names none (``sparse_mla``), made once."""
    return load_adapter(DEFAULT)


def load_adapter(spec, where: str = "`kernel`") -> KernelAdapter:
    """The adapter a space names: a built-in name or ``module:Class``. A bad name, a module that does not
    import or a class that is no :class:`KernelAdapter` is a :class:`SpaceError` of one sentence."""
    allowed = f"one of {sorted(BUILTIN)} or `module:Class` naming a KernelAdapter subclass"
    if not isinstance(spec, str) or not spec or len(spec) > 200:
        raise SpaceError(f"{where}: must be {allowed}, got {_show(spec)}")
    target = BUILTIN.get(spec, spec)
    if not _SPEC.match(target):
        raise SpaceError(f"{where}: unknown adapter {_show(spec)}; allowed: {allowed}")
    module_name, class_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - any failure to import is the user's module's, told in one sentence
        raise SpaceError(
            f"{where}: module {module_name!r} does not import ({type(e).__name__}: {_one_line(e)})"
        ) from None
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, KernelAdapter)):
        raise SpaceError(f"{where}: {target!r} is not a KernelAdapter subclass; allowed: {allowed}")
    try:
        adapter = cls()
    except Exception as e:  # noqa: BLE001 - an abstract method left out, or the class's own failure
        raise SpaceError(f"{where}: {target!r} cannot be made ({type(e).__name__}: {_one_line(e)})") from None
    if not adapter.name:
        adapter.name = spec
    return adapter


def _one_line(e: BaseException, limit: int = 200) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _show(v, limit: int = 80) -> str:
    text = " ".join(repr(v).split()) if not isinstance(v, str) else repr(v)
    return text if len(text) <= limit else text[: limit - 3] + "..."
