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

What the measurement process does with it has defaults built from the above, which an adapter may replace:
the input sets a timing rotates through (:meth:`KernelAdapter.measure_inputs`), a launch made ready before it is
timed (:meth:`KernelAdapter.prepare`), the gate (:meth:`KernelAdapter.gate`). A workload crosses to the
measurement and compile processes as :meth:`KernelAdapter.workload_dict`, and an adapter is named there by
:attr:`KernelAdapter.spec`.

This module names no kernel; it imports nothing of the kernels' layer.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import hashlib
import importlib
import inspect
import json
import math
import os
import re
import sys
from collections.abc import Callable
from collections.abc import Hashable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import SpaceError
from .errors import TunerError

# Built-in adapters by the name a space file gives (``kernel: sparse_mla``): "module:Class".
BUILTIN: dict[str, str] = {"sparse_mla": "sparse_mla_tuner.tuner.adapters.sparse_mla.adapter:SparseMlaAdapter"}
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


def binary_key(spec) -> tuple:
    """Identifies the binary a compile spec makes (two launches with one key run the same code: compiled once), of
    any object with :class:`CompileSpec`'s fields (the built-in kernel's ``decode.CompileSpec`` has them too)."""
    signature, constexprs = sorted(spec.signature.items()), sorted(spec.constexprs.items())
    attrs = sorted((k, str(v)) for k, v in spec.attrs.items())
    return (spec.name, tuple(signature), tuple(constexprs), tuple(attrs), tuple(sorted(spec.options.items())))


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

    key = binary_key  # spec.key(), as the built-in kernel's specs have it


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
    # Compiled parameters that change how a launch's work is split or dealt (with the launch-only ones, its split
    # geometry): the surrogate tries a good launch at every split target of each of their values too.
    geometry: tuple[str, ...] = ()
    # the kernels of a launch (CompileSpec names) whose registers and stack frame a feasibility check reports
    # and ``max_spill_bytes`` judges; None: every kernel
    resource_kernels: tuple[str, ...] | None = None

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
        """A short hash of the kernel's sources: results of another hash are another kernel's. By default the
        adapter's own module file; an adapter whose kernel lives in other files should hash them too."""
        return source_files_hash(inspect.getsourcefile(type(self)))

    def export_table(self, picks: Mapping[int, Any]) -> dict:
        """The table an engine reads: the picked config per level (batch size -> config)."""
        return {str(batch): cfg.as_dict() for batch, cfg in sorted(picks.items())}

    # --- how the tuner's processes and records reach it (defaults from the members above) -------------------

    @property
    def spec(self) -> str:
        """The adapter as a space, a process and the results database name it: its built-in name (``sparse_mla``)
        or ``module:Class``."""
        target = f"{type(self).__module__}:{type(self).__qualname__}"
        return next((name for name, t in BUILTIN.items() if t == target), target)

    def workload_dict(self, workload) -> dict:
        """A workload as JSON-able values, which :meth:`workload_from_dict` turns back into it (what the
        measurement and compile processes receive): the dataclass's fields by default."""
        return dataclasses.asdict(workload)

    def workload_from_dict(self, d: Mapping) -> Any:
        """The inverse of :meth:`workload_dict`; by default the dict read as a space's workload entry (a workload
        that is its own entry, as the example's)."""
        return self.parse_workload("<message>", "workload", dict(d)).workload()

    def compile_identity(self, config, workload) -> list:
        """What the feasibility cache keys a compile by (with the source hash, Triton's version and the target):
        the adapter, the compiled parameters and the workload by default."""
        compiled = [[p.name, getattr(config, p.name)] for p in self.params if p.compiled]
        return [self.spec, compiled, self.workload_dict(workload)]

    def estimate_shared(self, config, workload) -> int:
        """An analytic estimate of a launch's shared memory in bytes, shown beside the compiled number (0: none)."""
        return 0

    def measure_inputs(self, workload, batch: int, device: str, l2_bytes: int, seed: int) -> list:
        """The input sets a timing rotates through, one call each: on a GPU enough independent sets that together
        they move four times the L2 cache (so every call starts cold), on the CPU one."""
        sets = 1
        if device == "cuda" and l2_bytes:
            sets = max(2, min(64, -(-4 * l2_bytes // max(1, self.bytes_moved(workload, batch)))))
        return [self.inputs(workload, batch, device, seed + i) for i in range(sets)]

    def prepare(self, config, input_sets: list) -> list[Callable[[], Any]]:
        """One call per input set, ready to run (a CUDA graph captures them): :meth:`launch` by default; an adapter
        whose launch plans on the host can plan once here."""
        return [functools.partial(self.launch, config, x) for x in input_sets]

    def gate(self, config, workload, batch: int, device: str, seed: int) -> tuple[str, dict]:
        """The correctness gate of one config: ``("", numbers)`` when it passes, ``(why not, numbers)`` else;
        the numbers are recorded with the trial (``out_rel_err``, ``lse_abs_err``: none by default). By default
        fresh inputs, :meth:`launch` against :meth:`reference`, judged by :meth:`check`."""
        x = self.inputs(workload, batch, device, seed)
        return self.check(self.launch(config, x), self.reference(x)), {}

    def launch_size(self, config, workload, batch: int) -> int:
        """A number recorded with each trial to describe its grid (the sparse-MLA adapter: the split's partials
        per row; 0 by default)."""
        return 0

    # --- what the results database holds of it (export, replay and report read rows through these) --------------

    def parse_config(self, text: str) -> Any:
        """A config from its printed key, as ``tuner_trials.config_key`` stores it (``ValueError`` in one sentence)."""
        return self.config_type.parse(text)

    def recorded_config(self, trial) -> Any:
        """The config of a ``tuner_trials`` row (:class:`db.models.TrialModel`): its parameters read back."""
        return self.config(trial.param_values())

    def recorded_workload(self, row) -> Any:
        """The workload a ``tuner_workloads`` row stands for (:class:`db.models.WorkloadModel`, or any object with
        its columns): its stored description (``fields()``) read back by :meth:`workload_from_dict`."""
        return self.workload_from_dict(row.description())

    def compiled_label(self, config) -> str:
        """A config's compiled parameters alone, naming its binary (the report's infeasible list)."""
        return " ".join(f"{p.name}={getattr(config, p.name)}" for p in self.params if p.compiled)

    # --- the drivers of export, replay and report (tuner/export.py, replay.py, report.py) ------------------------

    def exporters(self) -> Mapping[str, Callable]:
        """The formats of ``tuner export --format``, by name, the first the default: each a function
        ``(store, adapter, out_dir, *, backend, record, shapes, progress)`` that writes the tables and returns the
        paths written (or, with ``out_dir`` None where the format allows it, the text). Empty: the tuner's own
        JSON tables of :meth:`export_table` (:func:`tuner.export.json_tables`)."""
        return {}

    def export_dir(self):
        """Where ``tuner export --engine`` puts the tables an engine of this kernel reads (a path), or None: the
        kernel has no such place."""
        return None

    def replay_key(self, workload) -> Hashable:
        """What the replay backend matches a recorded workload by (with the level and the config): the workload's
        :meth:`workload_dict` by default, so a recording replays for exactly the workload it measured."""
        return json.dumps(self.workload_dict(workload), sort_keys=True, default=str)

    def report_sections(self):
        """The kernel's parts of ``tuner report`` (:class:`tuner.report.ReportSections`): None, the generic ones."""
        return None

    def model_space(self, model: str, tp: int, **options):
        """``tuner search --model NAME --tp N``: the search space of a model's calls, and lines to say (a
        :class:`tuner.space.SearchSpace` and a list of str); a kernel without model presets refuses."""
        raise TunerError(f"the {self.name} kernel has no model presets; give a SPACE_FILE")

    def served_shapes(self, device: str, **filters) -> list[dict]:
        """``tuner shapes``: one row per shape the kernel serves on ``device`` and whose table configures it
        (``filters``: the command's options); a kernel without engine tables refuses."""
        raise TunerError(f"the {self.name} kernel serves no engine shapes")


@functools.cache
def source_files_hash(*paths) -> str:
    """A short hash (12 hex digits) of the bytes of these files."""
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:12]


@functools.cache
def adapter_named(spec: str) -> KernelAdapter:
    """The adapter a process is told of by :attr:`KernelAdapter.spec`, made once per process."""
    return load_adapter(spec)


def stored_launch(identity: Hashable) -> str:
    """A launch identity (:meth:`KernelAdapter.launch_identity`) as the database stores and indexes it."""
    return json.dumps(identity)


@functools.cache
def default_adapter() -> KernelAdapter:
    """The adapter of a space that names none (``sparse_mla``), made once."""
    return load_adapter(DEFAULT)


ENTRY_POINT_GROUP = "sparse_mla_tuner.adapters"  # an installed package's adapters: `name = "module:Class"`
ALLOW_ENV = "TUNER_ADAPTERS"  # more adapters one trusts: `module:Class` or `module`, comma-separated
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_OWN = "sparse_mla_tuner"  # this package's own modules (its adapters in tuner/adapters/)
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # a checkout; in a wheel, the package


def entry_point_adapters() -> dict[str, str]:
    """The adapters installed packages register, by name: ``{name: "module:Class"}`` of the entry points in
    :data:`ENTRY_POINT_GROUP` (read from their metadata; nothing is imported)."""
    from importlib.metadata import entry_points

    try:
        found = entry_points(group=ENTRY_POINT_GROUP)
    except Exception:  # noqa: BLE001 - a broken distribution's metadata registers nothing
        return {}
    return {ep.name: ep.value.replace(" ", "") for ep in found if _SPEC.match(ep.value.replace(" ", ""))}


def allowed_adapters() -> tuple[str, ...]:
    """The entries of ``$TUNER_ADAPTERS`` (``module:Class`` or a whole ``module``); TunerError naming the
    variable when one is neither."""
    text = os.environ.get(ALLOW_ENV, "")
    entries = tuple(e for e in re.split(r"[,\s]+", text) if e)
    for e in entries:
        if len(e) > 200 or not (_SPEC.match(e) or _MODULE.match(e)):
            raise TunerError(
                f"${ALLOW_ENV} holds {_show(e)}; allowed: a comma-separated list of `module:Class` or `module` "
                "names of trusted kernel adapters (docs/adapters.md)"
            )
    return entries


def _shipped_example(module_name: str) -> bool:
    """Whether ``module_name`` is a module of this checkout's ``examples/`` (not part of the wheel), and the
    ``examples`` that an import would find is that folder: known without importing anything."""
    parts = module_name.split(".")
    if parts[0] != "examples" or len(parts) < 2:
        return False
    folder = os.path.join(_CHECKOUT, "examples")
    if not os.path.isfile(os.path.join(folder, *parts[1:]) + ".py"):
        return False
    loaded = sys.modules.get("examples")
    if loaded is not None:
        where = list(getattr(loaded, "__path__", []) or [])
    else:
        from importlib.machinery import PathFinder

        found = PathFinder.find_spec("examples")
        where = list(found.submodule_search_locations or []) if found is not None else []
    return any(os.path.realpath(w) == os.path.realpath(folder) for w in where)


def _registered(target: str) -> bool:
    """Whether ``module:Class`` may be imported: this package's own modules, an installed entry point, one of
    the repository's examples, or an entry of ``$TUNER_ADAPTERS``; never a ``__main__`` module (a program)."""
    module_name = target.split(":")[0]
    if "__main__" in module_name.split("."):
        return False  # a program (`python -m`'s entry), whose import runs it: never an adapter's module
    if module_name == _OWN or module_name.startswith(_OWN + "."):
        return True
    if target in entry_point_adapters().values():
        return True
    allowed = allowed_adapters()
    return target in allowed or module_name in allowed or _shipped_example(module_name)


def _findable(module_name: str) -> bool:
    """Whether the top-level package of ``module_name`` is anywhere an import would look (found by the import
    system's finders, without running any module's code)."""
    import importlib.util

    top = module_name.split(".")[0]
    if top in sys.modules:
        return True
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False


def load_adapter(spec, where: str = "`kernel`") -> KernelAdapter:
    """The adapter a space names: a built-in name, an installed entry point's name (group
    :data:`ENTRY_POINT_GROUP`) or ``module:Class``. A module is imported only when it is registered (see
    :func:`_registered`, ``docs/adapters.md``): a space file cannot make any importable module's code run. A
    bad name, an unregistered module, a module that does not import or a class that is no
    :class:`KernelAdapter` is a :class:`SpaceError` of one sentence."""
    allowed = f"one of {sorted(BUILTIN)} or `module:Class` naming a KernelAdapter subclass"
    if not isinstance(spec, str) or not spec or len(spec) > 200:
        raise SpaceError(f"{where}: must be {allowed}, got {_show(spec)}")
    target = BUILTIN.get(spec) or entry_point_adapters().get(spec) or spec
    if not _SPEC.match(target):
        raise SpaceError(f"{where}: unknown adapter {_show(spec)}; allowed: {allowed}")
    module_name, class_name = target.split(":")
    if not _findable(module_name):  # nothing to import, nothing runs: said as the import would say it
        top = module_name.split(".")[0]
        raise SpaceError(
            f"{where}: module {module_name!r} does not import (ModuleNotFoundError: No module named {top!r})"
        )
    if "__main__" in module_name.split("."):
        raise SpaceError(
            f"{where}: {_show(target)} is a program (a `__main__` module runs when imported), not an adapter's module"
        )
    if not _registered(target):
        raise SpaceError(
            f"{where}: {_show(target)} is not a registered kernel adapter, so its module is not imported; "
            f"register it as an entry point of group {ENTRY_POINT_GROUP!r}, or trust it with "
            f"{ALLOW_ENV}={module_name} (docs/adapters.md)"
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - any failure to import is the user's module's, told in one sentence
        from . import interrupted

        if interrupted(e):  # a Ctrl-C inside an extension's import (Triton: "initialization failed")
            raise
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
