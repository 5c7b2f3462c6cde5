"""Search-space files (``search_spaces/*.yaml``): parse, validate, expand.

Every error is a :class:`SpaceError` whose message names the file, the key path and what is
allowed; the CLI prints it as one sentence and exits with status 2. Unknown keys, duplicate keys,
values of the wrong type and constraints that cannot be evaluated are errors; nothing else is
raised. A space may have at most :data:`MAX_CONFIGS` configs (the product of the parameters'
choice counts, computed before anything is expanded): every config is checked for feasibility.
"""

from __future__ import annotations

import ast
import hashlib
import itertools
import json
import math
import os
import re
import reprlib
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

import yaml

from ..db.paths import STDIN
from ..db.paths import PathError
from ..db.paths import read_input
from . import strategies
from .adapter import BUILTIN
from .adapter import DEFAULT as DEFAULT_KERNEL
from .adapter import KernelAdapter
from .adapter import load_adapter
from .errors import SpaceError

MAX_CONFIGS = 100_000  # the grid is expanded and every config is compile-checked
MAX_FILE_BYTES = 1_000_000
MAX_INT = 2**31 - 1  # every integer of a space must fit the kernel launch's and the database's int32
# a level's batch size must be a key an exported table can hold: nine digits (kernels/table.py's MAX_BATCH, tested)
MAX_CONCURRENCY = 999_999_999
MAX_NODES = 100_000  # values a space file may expand to, YAML aliases counted as often as they are used
MAX_NAME = 64
MAX_CONSTRAINT = 500  # characters of one constraint expression
MAX_POWER = 16  # the largest exponent a constraint's `**` may use (a constant)

TARGETS: dict[str, int] = {
    "sm_120": 101_376,
    "sm_100": 232_448,
    "sm_90": 232_448,
    "sm_89": 101_376,
    "sm_86": 101_376,
    "sm_80": 166_912,
}

TOP_KEYS = {
    "name": "a name for the space (letters, digits, '_', '-')",
    "kernel": f"the kernel's adapter: one of {sorted(BUILTIN)} (default {DEFAULT_KERNEL}) or a registered "
    "`module:Class` (docs/adapters.md)",
    "target": f"the arch whose limits feasibility enforces: one of {sorted(TARGETS)}",
    "workloads": "a list of workloads",
    "concurrency": "a list of positive batch sizes",
    "parameters": "a mapping of the kernel's parameters to distributions",
    "constraints": "a list of expressions over the parameters",
    "baseline": "a config inside the space",
    "measurement": "rounds, screen_rounds, finalists, finalist_rounds, trial_timeout_s, min_effect",
    "sampler": "name (grid | tpe | surrogate), seed, n_trials, and the strategy's options (`tuner search --help`)",
    "max_spill_bytes": "a non-negative integer; configs that spill more are infeasible",
}
MEASUREMENT_DEFAULTS = {"rounds": 10, "finalists": 3, "finalist_rounds": 30, "trial_timeout_s": 60}
MEASUREMENT_MAX = {"rounds": 10_000, "finalists": 1_000, "finalist_rounds": 10_000, "trial_timeout_s": 86_400}
SAMPLER_KEYS = ("name", "seed", "n_trials")
SAMPLERS = strategies.NAMES


@dataclass
class SearchSpace:
    name: str
    path: str
    text: str
    target: str
    workloads: list  # the adapter's parsed workload entries
    concurrency: list[int]
    parameters: dict[str, list[int]]  # expanded choices per parameter (one value when the file omits it)
    constraints: list[str]
    baseline: object  # the adapter's config type
    measurement: dict[str, int | float]
    sampler: dict
    max_spill_bytes: int | None = None
    _compiled: list = field(default_factory=list, repr=False)
    _configs: list | None = field(default=None, repr=False)
    adapter: KernelAdapter = field(default=None, repr=False)  # type: ignore[assignment] - set by load_space
    kernel: str = DEFAULT_KERNEL  # the space's `kernel:`, as written

    @property
    def text_hash(self) -> str:
        """The space's identity: a hash of what the file parses to, so a comment or a re-wrapped line keeps
        it (and the studies it names); any changed value changes it (:func:`identity`)."""
        return identity(self.text)

    def resume_problem(
        self, stored_text: str, study: str, stored_workload: dict | None = None, workload=None
    ) -> str | None:
        """Why an existing study made from the space ``stored_text`` cannot go on with this space, or None.

        Its values are ratios to the baseline's median, so a changed baseline would mix two references in one
        study, and a workload's changed shape (``stored_workload``: its row's fields, against ``workload``)
        would mix two problems; any other change (comments, choices, measurement) leaves what was measured valid."""
        if stored_workload is not None and workload is not None:
            now = workload.fields()
            changed = [k for k in now if k in stored_workload and stored_workload[k] != now[k]]
            if changed:
                k = changed[0]
                return (
                    f"{self.path}: workload {_show(workload.name, 80)}: its {k} is {_show(now[k], 80)}, but the study "
                    f"{_show(study, 120)} in this database measured it with {k} {_show(stored_workload[k], 80)}; "
                    "give the changed workload a new `name`"
                )
        try:
            before = _stored_baseline(stored_text, self.adapter)
        except Exception:  # noqa: BLE001 - a stored text this version cannot read says nothing against going on
            return None
        if before is not None and before != self.baseline:
            return (
                f"{self.path}: `baseline`: is {self.baseline}, but the study {_show(study, 120)} in this database "
                f"was measured against the baseline {before}; put the baseline back, or give the space a new `name` "
                "to start new studies"
            )
        return None

    @property
    def limit_bytes(self) -> int:
        return TARGETS[self.target]

    def satisfies(self, cfg) -> bool:
        env = cfg.as_dict()
        for text, code in zip(self.constraints, self._compiled, strict=True):
            try:
                if not eval(code, {"__builtins__": {}}, env):  # noqa: S307 (AST-checked, bounded)
                    return False
            except ArithmeticError as e:  # division by zero, float overflow
                raise SpaceError(
                    f"{self.path}: constraint {_show(text)} fails for {cfg}: {type(e).__name__}: {e}"
                ) from None
        return True

    def configs(self) -> list:
        """Every config of the grid that satisfies the constraints, in a stable order."""
        if self._configs is None:
            out = []
            names, make = self.adapter.param_names, self.adapter.config_type
            for values in itertools.product(*(self.parameters[p] for p in names)):
                cfg = make(**dict(zip(names, values, strict=True)))
                if self.satisfies(cfg):
                    out.append(cfg)
            self._configs = out
        return list(self._configs)


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, 200, 200
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 8
_REPR.maxlong = 60


def _show(v, limit: int = 60) -> str:
    """``repr(v)`` on one line, shortened: messages stay one readable sentence. Only a bounded prefix is ever
    rendered (a few levels, a few items each), so a huge or deeply shared value costs no time or memory."""
    try:
        text = _REPR.repr(v)
    except Exception:  # noqa: BLE001 - a value that cannot be shown is still named by its type
        text = f"<{type(v).__name__}>"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def identity(text: str) -> str:
    """A space file's identity: the hash of its parsed YAML (comments, key order and formatting ignored)."""
    doc = yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    canonical = json.dumps(doc, sort_keys=True, default=repr, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def _stored_baseline(text: str, adapter: KernelAdapter):
    doc = yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    given = doc.get("baseline") if isinstance(doc, dict) else None
    return adapter.config(given) if isinstance(given, dict) else None


def _key(k) -> str:
    return k if isinstance(k, str) and k.isprintable() and len(k) <= MAX_NAME else _show(k)


def _err(path: str, key: str, msg: str) -> SpaceError:
    return SpaceError(f"{path}: `{key}`: {msg}")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _pos_int(path, key, v, minimum=1, maximum=MAX_INT) -> int:
    if not _is_int(v) or not minimum <= v <= maximum:
        raise _err(path, key, f"must be an integer >= {minimum} and <= {maximum}, got {_show(v)}")
    return v


def _name(path, key, v, strict: bool) -> str:
    ok = isinstance(v, str) and 0 < len(v) <= MAX_NAME and v.isprintable()
    if ok and strict:
        ok = all(c.isalnum() or c in "_-" for c in v)
    if not ok:
        what = "letters, digits, '_' or '-'" if strict else "a non-empty printable string"
        raise _err(path, key, f"must be {what} of at most {MAX_NAME} characters, got {_show(v)}")
    return v


def _choice(path, key, v, allowed) -> str:
    if not isinstance(v, str) or v not in allowed:
        raise _err(path, key, f"must be one of {sorted(allowed)}, got {_show(v)}")
    return v


def _check_keys(path, where, d, allowed) -> None:
    if not isinstance(d, dict):
        raise _err(path, where, f"must be a mapping with keys {list(allowed)}, got {type(d).__name__}")
    unknown = [k for k in d if not isinstance(k, str) or k not in allowed]
    if unknown:
        k = _key(unknown[0])
        raise _err(path, f"{where}.{k}" if where else k, f"unknown key; allowed: {list(allowed)}")


def _distribution(path, key, spec) -> range | list[int]:
    """Optuna's abbreviated form -> the values (an int range stays a lazy ``range``); a plain list is categorical."""
    if isinstance(spec, list):
        spec = {"type": "categorical", "choices": spec}
    if not isinstance(spec, dict) or "type" not in spec:
        raise _err(path, key, "must be a list of values or {type: categorical, choices: [...]} or {type: int, ...}")
    kind = spec["type"]
    if kind == "categorical":
        _check_keys(path, key, spec, ("type", "choices"))
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise _err(path, f"{key}.choices", f"must be a non-empty list, got {_show(choices)}")
        for i, c in enumerate(choices):
            _pos_int(path, f"{key}.choices[{i}]", c, minimum=0)
        if len(set(choices)) != len(choices):
            raise _err(path, f"{key}.choices", f"has duplicates: {_show(choices)}")
        return list(choices)
    if kind == "int":
        _check_keys(path, key, spec, ("type", "low", "high", "step"))
        low, high, step = spec.get("low"), spec.get("high"), spec.get("step", 1)
        for name, v in (("low", low), ("high", high), ("step", step)):
            _pos_int(path, f"{key}.{name}", v, minimum=0 if name != "step" else 1)
        if low > high:
            raise _err(path, key, f"`low <= high` must hold, but got (low={low}, high={high})")
        return range(low, high + 1, step)
    raise _err(path, f"{key}.type", f"must be `categorical` or `int`, got {_show(kind)}")


_ALLOWED_NODES = (
    ast.Expression,
    ast.BoolOp,
    ast.And,
    ast.Or,
    ast.UnaryOp,
    ast.Not,
    ast.USub,
    ast.UAdd,
    ast.BinOp,
    ast.Add,
    ast.Sub,
    ast.Mult,
    ast.Div,
    ast.FloorDiv,
    ast.Mod,
    ast.Pow,
    ast.Compare,
    ast.Eq,
    ast.NotEq,
    ast.Lt,
    ast.LtE,
    ast.Gt,
    ast.GtE,
    ast.Name,
    ast.Load,
    ast.Constant,
)


def _constraint(path, key, expr, PARAM_NAMES: tuple[str, ...]):  # noqa: N803 - named as in the messages
    """Compile one constraint; only parameters, numbers, arithmetic and comparisons, and ``**`` only with
    a small constant exponent, so that no expression can take long or grow without bound."""
    if not isinstance(expr, str):
        raise _err(path, key, f"must be an expression string such as 'BLOCK_T * num_stages <= 128', got {_show(expr)}")
    if len(expr) > MAX_CONSTRAINT:
        raise _err(path, key, f"is {len(expr)} characters long; at most {MAX_CONSTRAINT} are allowed")
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as e:
        raise _err(path, key, f"is not a valid expression ({e.msg}): {_show(expr)}") from None
    except (ValueError, RecursionError, MemoryError):  # null bytes, nesting too deep
        raise _err(path, key, f"is not a valid expression: {_show(expr)}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED_NODES):
            raise _err(
                path, key, f"may use only {list(PARAM_NAMES)}, numbers, arithmetic and comparisons: {_show(expr)}"
            )
        if isinstance(node, ast.Name) and node.id not in PARAM_NAMES:
            raise _err(path, key, f"unknown name {_show(node.id)}; allowed: {list(PARAM_NAMES)}")
        if isinstance(node, ast.Constant) and (not isinstance(node.value, int | float) or isinstance(node.value, bool)):
            raise _err(path, key, f"only numeric constants are allowed: {_show(expr)}")
        if isinstance(node, ast.Constant) and not abs(node.value) <= 10**18:
            raise _err(path, key, f"constants must be at most 1e18 in magnitude: {_show(expr)}")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            e = node.right
            if not (isinstance(e, ast.Constant) and _is_int(e.value) and 0 <= e.value <= MAX_POWER):
                raise _err(path, key, f"`**` needs a constant integer exponent in 0..{MAX_POWER}: {_show(expr)}")
            if any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow) for n in ast.walk(node.left)):
                raise _err(path, key, f"`**` may not be nested: {_show(expr)}")
    return compile(tree, f"<{key}>", "eval")


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping key that appears twice (PyYAML keeps the last silently) and a
    document that expands to more than :data:`MAX_NODES` values (aliases counted at every use: an "alias bomb"
    of a few lines stands for billions of values, which no message or check may walk)."""

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None:
            _check_expansion(node)
        return node


def _check_expansion(root) -> None:
    """Count the values ``root`` expands to, each node once (memoized), refusing more than MAX_NODES or a cycle."""
    size: dict[int, int] = {}
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in size and not done:
            if size[id(node)] < 0:
                raise SpaceError(f"line {node.start_mark.line + 1}: a YAML alias refers to itself")
            continue
        children = node.value if isinstance(node, yaml.SequenceNode) else []
        if isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        if not done:
            size[id(node)] = -1  # in progress
            stack.append((node, True))
            stack += [(c, False) for c in children]
            continue
        size[id(node)] = min(1 + sum(size[id(c)] for c in children), MAX_NODES + 1)
        if size[id(node)] > MAX_NODES:
            raise SpaceError(
                f"line {node.start_mark.line + 1}: the file expands to more than {MAX_NODES} values "
                "(YAML anchors and aliases repeat what they refer to); write the space out plainly"
            )


def _construct_mapping(loader, node, deep=False):
    loader.flatten_mapping(node)
    seen = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            first = seen.get(key)
        except TypeError:
            raise SpaceError(
                f"line {key_node.start_mark.line + 1}: a mapping key must be a plain value, got {_show(key)}"
            ) from None
        if first is not None:
            raise SpaceError(
                f"line {key_node.start_mark.line + 1}: duplicate key `{_key(key)}` (first at line {first}); "
                "each key may appear once"
            )
        seen[key] = key_node.start_mark.line + 1
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


STDIN_NAME = "<stdin>"  # the space's path in messages and records when it is read from `-`


def _read(path: str):
    # an input read once, bounded: a regular file, a FIFO or pipe (`tuner check <(cat space.yaml)`) or `-` (the
    # standard input); a directory or a device is one sentence
    shown = STDIN_NAME if path == STDIN else path
    try:
        if path != STDIN and not os.path.lexists(path):
            raise SpaceError(f"{path}: cannot read the search space (no such file)")
        data = read_input(path, MAX_FILE_BYTES, "search space")
    except PathError as e:
        raise SpaceError(f"{shown}: cannot read the search space: {e}") from None
    path = shown
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpaceError(f"{path}: is not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start})") from None
    try:
        doc = yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except SpaceError as e:
        raise SpaceError(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SpaceError(f"{path}: not valid YAML{where}: {problem}") from None
    except (RecursionError, MemoryError):
        raise SpaceError(f"{path}: not valid YAML: nested too deeply") from None
    return text, doc


# The shipped spaces: installed as tuner/search_spaces/ (the wheel), or search_spaces/ beside tuner/ (a checkout).
SHIPPED_DIRS = (Path(__file__).parent / "search_spaces", Path(__file__).parent.parent / "search_spaces")
_SPACE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,100}")


def shipped_spaces() -> dict[str, Path]:
    """The spaces that come with the package, by name (``v4_flash_tp4`` -> its ``.yaml``)."""
    out: dict[str, Path] = {}
    for folder in SHIPPED_DIRS:
        if folder.is_dir():
            for f in sorted(folder.glob("*.yaml")):
                out.setdefault(f.stem, f)
    return out


def resolve_space(path: str | Path) -> str:
    """A space file, or the name of a shipped space (``v4_flash_tp4``, ``v4_flash_tp4.yaml``): the file to read.

    A file that exists always wins; a bare name that is not a file names a shipped space."""
    text = str(path)
    if Path(text).exists() or not _SPACE_NAME.fullmatch(text):
        return text
    shipped = shipped_spaces()
    name = text.removesuffix(".yaml").removesuffix(".yml")
    if name in shipped:
        return str(shipped[name])
    raise SpaceError(
        f"{_show(text, 100)}: no such file, and no shipped space of that name (shipped: {', '.join(shipped)})"
    )


def load_space(path: str | Path) -> SearchSpace:
    """Read and validate a search-space file (or a shipped space by name, :func:`resolve_space`); raise
    :class:`SpaceError` with a clear message."""
    path = resolve_space(path)
    text, doc = _read(path)
    path = STDIN_NAME if path == STDIN else path
    return _space(path, text, doc)


def load_space_text(text: str, label: str) -> SearchSpace:
    """:func:`load_space` of a space's YAML text (a generated one: ``tuner search --model``); ``label`` stands
    for the file's path in messages and in the database."""
    try:
        doc = yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise SpaceError(f"{label}: not valid YAML: {e}") from None
    return _space(label, text, doc)


def _space(path: str, text: str, doc) -> SearchSpace:
    if not isinstance(doc, dict):
        raise SpaceError(f"{path}: must be a YAML mapping with keys {list(TOP_KEYS)}, got {type(doc).__name__}")
    _check_keys(path, "", doc, TOP_KEYS)
    for req in ("name", "workloads", "concurrency", "parameters", "baseline"):
        if req not in doc:
            raise _err(path, req, f"is required: {TOP_KEYS[req]}")
    name = _name(path, "name", doc["name"], strict=True)  # checked in the order the file reads
    kernel = doc.get("kernel", DEFAULT_KERNEL)
    adapter = load_adapter(kernel, f"{path}: `kernel`")
    target = _choice(path, "target", doc.get("target", "sm_120"), TARGETS)
    workloads = _workloads(path, doc["workloads"], adapter)
    concurrency = _concurrency(path, doc["concurrency"])
    parameters = _parameters(path, doc["parameters"], adapter)
    cons = doc.get("constraints") or []
    if not isinstance(cons, list):
        raise _err(path, "constraints", f"must be a list of expression strings, got {_show(cons)}")
    compiled = [_constraint(path, f"constraints[{i}]", c, adapter.param_names) for i, c in enumerate(cons)]
    baseline = _baseline(path, doc["baseline"], parameters, adapter)
    measurement = _measurement(path, doc.get("measurement") or {})
    sampler = _sampler(path, doc.get("sampler") or {})
    spill = doc.get("max_spill_bytes")
    if spill is not None:
        _pos_int(path, "max_spill_bytes", spill, minimum=0)
    space = SearchSpace(
        name,
        path,
        text,
        target,
        workloads,
        concurrency,
        parameters,
        cons,
        baseline,
        measurement,
        sampler,
        spill,
        compiled,
        adapter=adapter,
        kernel=kernel,
    )
    if not space.satisfies(baseline):
        raise _err(path, "baseline", f"violates the constraints {_show(cons, 200)}")
    space.configs()  # every constraint evaluated on every config now: an arithmetic error is reported here
    return space


def _workloads(path: str, wls, adapter: KernelAdapter) -> list:
    if not isinstance(wls, list) or not wls:
        raise _err(path, "workloads", f"must be a non-empty list of workloads, got {_show(wls)}")
    workloads = []
    for i, w in enumerate(wls):
        key = f"workloads[{i}]"
        try:
            workloads.append(adapter.parse_workload(path, key, w))
        except SpaceError:
            raise
        except (ValueError, TypeError) as e:  # a user's adapter says what is wrong; this says where
            raise _err(path, key, " ".join(str(e).split())) from None
    if len({w.name for w in workloads}) != len(workloads):
        raise _err(path, "workloads", "names must be unique")
    return workloads


def _concurrency(path: str, conc) -> list[int]:
    if not isinstance(conc, list) or not conc:
        raise _err(path, "concurrency", f"must be a non-empty list of positive integers, got {_show(conc)}")
    concurrency = [_pos_int(path, f"concurrency[{i}]", c, maximum=MAX_CONCURRENCY) for i, c in enumerate(conc)]
    if len(set(concurrency)) != len(concurrency):
        raise _err(path, "concurrency", f"has duplicates: {_show(concurrency)}")
    return concurrency


def _required(adapter: KernelAdapter) -> list[str]:
    """The parameters a space must give; the rest keep their default (e.g. maxnreg 0)."""
    return [p.name for p in adapter.params if p.required]


def _parameters(path: str, given, adapter: KernelAdapter) -> dict[str, list]:
    """Each declared parameter's choices (a parameter the file omits keeps its default)."""
    params = adapter.params
    REQUIRED_PARAMS = _required(adapter)  # noqa: N806 - named as in the message
    _check_keys(path, "parameters", given, adapter.param_names)
    missing = [p for p in REQUIRED_PARAMS if p not in given]
    if missing:
        raise _err(path, f"parameters.{missing[0]}", f"is required; every one of {REQUIRED_PARAMS} must be given")
    choices = {
        p.name: _distribution(path, f"parameters.{p.name}", given[p.name]) if p.name in given else [p.default]
        for p in params
    }
    n_configs = math.prod(len(v) for v in choices.values())  # before anything is expanded
    if n_configs > MAX_CONFIGS:
        counts = ", ".join(f"{p} {len(v)}" for p, v in choices.items())
        raise _err(
            path,
            "parameters",
            f"span {n_configs} configs ({counts}); at most {MAX_CONFIGS} are allowed, narrow the ranges",
        )
    parameters = {p: list(v) for p, v in choices.items()}
    for p in params:
        for v in parameters[p.name]:
            if not p.valid(v):
                raise _err(path, f"parameters.{p.name}", f"{p.name} must be {p.rule}, got {_show(v)}")
    return parameters


def _baseline(path: str, given, parameters: dict[str, list], adapter: KernelAdapter):
    _check_keys(path, "baseline", given, adapter.param_names)
    for p in _required(adapter):
        if p not in given:
            raise _err(path, f"baseline.{p}", "is required")
    for p, v in given.items():
        _pos_int(path, f"baseline.{p}", v, minimum=0)
    try:
        baseline = adapter.config(given)
    except (ValueError, TypeError) as e:
        raise _err(path, "baseline", str(e)) from None
    for p in adapter.param_names:
        if getattr(baseline, p) not in parameters[p]:
            raise _err(
                path,
                f"baseline.{p}",
                f"must be one of the space's choices {_show(parameters[p])}, got {getattr(baseline, p)}",
            )
    return baseline


def _measurement(path: str, meas) -> dict:
    _check_keys(path, "measurement", meas, (*MEASUREMENT_DEFAULTS, "screen_rounds", "min_effect"))
    measurement = {
        k: _pos_int(path, f"measurement.{k}", meas.get(k, d), maximum=MEASUREMENT_MAX[k])
        for k, d in MEASUREMENT_DEFAULTS.items()
    }
    if "min_effect" in meas:  # the smallest effect worth deploying, a fraction (0.01 = 1 %)
        v = meas["min_effect"]
        if not isinstance(v, int | float) or isinstance(v, bool) or not 0 <= v < 1:
            raise _err(path, "measurement.min_effect", f"must be a number >= 0 and < 1 (0.01 = 1 %), got {_show(v)}")
        measurement["min_effect"] = float(v)
    if measurement["rounds"] < 3:
        raise _err(path, "measurement.rounds", f"must be >= 3 for a confidence interval, got {measurement['rounds']}")
    # successive halving: every launch gets screen_rounds, the promising ones the rest of rounds (tuner/study.py)
    default_screen = max(3, measurement["rounds"] // 3)
    screen = _pos_int(path, "measurement.screen_rounds", meas.get("screen_rounds", default_screen), minimum=3)
    if screen > measurement["rounds"]:
        raise _err(
            path,
            "measurement.screen_rounds",
            f"must be at most measurement.rounds ({measurement['rounds']}), got {screen}",
        )
    measurement["screen_rounds"] = min(screen, measurement["rounds"])
    return measurement


def _sampler(path: str, samp) -> dict:
    """The strategy's name, seed, trial cap and ``options`` (the other keys: checked against the named strategy's
    options table, :func:`tuner.strategies.options_type`)."""
    if not isinstance(samp, dict):
        raise _err(path, "sampler", f"must be a mapping with keys {list(SAMPLER_KEYS)}, got {type(samp).__name__}")
    sampler = {
        "name": samp.get("name", strategies.DEFAULT),
        "seed": samp.get("seed", 0),
        "n_trials": samp.get("n_trials"),
    }
    _choice(path, "sampler.name", sampler["name"], SAMPLERS)
    table = strategies.options_type(sampler["name"])
    allowed = [*SAMPLER_KEYS, *table.names()]
    unknown = [k for k in samp if not isinstance(k, str) or k not in allowed]
    if unknown:
        raise _err(
            path,
            f"sampler.{_key(unknown[0])}",
            f"unknown key for strategy {sampler['name']}; allowed: {allowed} (options: `tuner search --help`)",
        )
    _pos_int(path, "sampler.seed", sampler["seed"], minimum=0)
    if sampler["n_trials"] is not None:
        _pos_int(path, "sampler.n_trials", sampler["n_trials"])
    options = {k: v for k, v in samp.items() if k not in SAMPLER_KEYS}
    try:
        table.from_mapping(options, sampler["name"])
    except strategies.OptionError as e:
        raise _err(path, f"sampler.{e.name}", e.problem) from None
    sampler["options"] = options
    return sampler
