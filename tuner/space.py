"""Search-space files (``search_spaces/*.yaml``): parse, validate, expand.

Every error is a :class:`SpaceError` whose message names the file, the key path and what is
allowed; the CLI prints it as one sentence and exits with status 2. Unknown keys are errors.
"""

from __future__ import annotations

import ast
import hashlib
import itertools
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

import yaml

from kernels.config import PARAM_NAMES
from kernels.config import PARAMS
from kernels.config import KernelConfig
from kernels.kv_format import FORMATS
from kernels.kv_format import get_format
from kernels.workload import Workload
from tuner.errors import SpaceError

# Opt-in shared memory per block (bytes) of each target arch.
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
    "target": f"the arch whose limits feasibility enforces: one of {sorted(TARGETS)}",
    "workloads": "a list of workloads",
    "concurrency": "a list of positive batch sizes",
    "parameters": f"a mapping of {list(PARAM_NAMES)} to distributions",
    "constraints": "a list of expressions over the parameters",
    "baseline": "a config inside the space",
    "measurement": "rounds, finalists, finalist_rounds, trial_timeout_s",
    "sampler": "name (grid | tpe), seed, n_trials",
    "max_spill_bytes": "a non-negative integer; configs that spill more are infeasible",
}
WORKLOAD_KEYS = ("name", "kv_format", "heads", "tp", "topk", "page_size", "context")
MEASUREMENT_DEFAULTS = {"rounds": 10, "finalists": 3, "finalist_rounds": 30, "trial_timeout_s": 60}
SAMPLER_KEYS = ("name", "seed", "n_trials")
SAMPLERS = ("grid", "tpe")


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

    @property
    def local_heads(self) -> int:
        return self.heads // self.tp

    def workload(self) -> Workload:
        return Workload(self.kv_format, self.local_heads, self.topk, self.page_size, self.context)

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
        }


@dataclass
class SearchSpace:
    name: str
    path: str
    text: str
    target: str
    workloads: list[WorkloadSpec]
    concurrency: list[int]
    parameters: dict[str, list[int]]  # expanded choices per parameter (one value when the file omits it)
    constraints: list[str]
    baseline: KernelConfig
    measurement: dict[str, int]
    sampler: dict
    max_spill_bytes: int | None = None
    _compiled: list = field(default_factory=list, repr=False)

    @property
    def text_hash(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()[:12]

    @property
    def limit_bytes(self) -> int:
        return TARGETS[self.target]

    def satisfies(self, cfg: KernelConfig) -> bool:
        env = cfg.as_dict()
        return all(eval(code, {"__builtins__": {}}, env) for code in self._compiled)  # noqa: S307 (AST-checked)

    def configs(self) -> list[KernelConfig]:
        """Every config of the grid that satisfies the constraints, in a stable order."""
        out = []
        for values in itertools.product(*(self.parameters[p] for p in PARAM_NAMES)):
            cfg = KernelConfig(**dict(zip(PARAM_NAMES, values, strict=True)))
            if self.satisfies(cfg):
                out.append(cfg)
        return out


def _err(path: str, key: str, msg: str) -> SpaceError:
    return SpaceError(f"{path}: `{key}`: {msg}")


def _pos_int(path, key, v, minimum=1) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise _err(path, key, f"must be an integer >= {minimum}, got {v!r}")
    return v


def _check_keys(path, where, d, allowed) -> None:
    if not isinstance(d, dict):
        raise _err(path, where, f"must be a mapping with keys {list(allowed)}, got {type(d).__name__}")
    unknown = [k for k in d if k not in allowed]
    if unknown:
        raise _err(
            path, f"{where}.{unknown[0]}" if where else str(unknown[0]), f"unknown key; allowed: {list(allowed)}"
        )


def _distribution(path, key, spec) -> list[int]:
    """Optuna's abbreviated form -> the list of values; a plain list is categorical."""
    if isinstance(spec, list):
        spec = {"type": "categorical", "choices": spec}
    if not isinstance(spec, dict) or "type" not in spec:
        raise _err(path, key, "must be a list of values or {type: categorical, choices: [...]} or {type: int, ...}")
    kind = spec["type"]
    if kind == "categorical":
        _check_keys(path, key, spec, ("type", "choices"))
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise _err(path, f"{key}.choices", f"must be a non-empty list, got {choices!r}")
        for i, c in enumerate(choices):
            if not isinstance(c, int) or isinstance(c, bool):
                raise _err(path, f"{key}.choices[{i}]", f"must be an integer, got {c!r}")
        if len(set(choices)) != len(choices):
            raise _err(path, f"{key}.choices", f"has duplicates: {choices}")
        return list(choices)
    if kind == "int":
        _check_keys(path, key, spec, ("type", "low", "high", "step"))
        low, high, step = spec.get("low"), spec.get("high"), spec.get("step", 1)
        for name, v in (("low", low), ("high", high), ("step", step)):
            if not isinstance(v, int) or isinstance(v, bool):
                raise _err(path, f"{key}.{name}", f"must be an integer, got {v!r}")
        if low > high:
            raise _err(path, key, f"`low <= high` must hold, but got (low={low}, high={high})")
        if step < 1:
            raise _err(path, f"{key}.step", f"must be >= 1, got {step}")
        return list(range(low, high + 1, step))
    raise _err(path, f"{key}.type", f"must be `categorical` or `int`, got {kind!r}")


_ALLOWED_NODES = (
    ast.Expression,
    ast.BoolOp,
    ast.And,
    ast.Or,
    ast.UnaryOp,
    ast.Not,
    ast.USub,
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


def _constraint(path, key, expr):
    if not isinstance(expr, str):
        raise _err(path, key, f"must be an expression string such as 'BLOCK_T * num_stages <= 128', got {expr!r}")
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as e:
        raise _err(path, key, f"is not a valid expression ({e.msg}): {expr!r}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED_NODES):
            raise _err(path, key, f"may use only {list(PARAM_NAMES)}, numbers, arithmetic and comparisons: {expr!r}")
        if isinstance(node, ast.Name) and node.id not in PARAM_NAMES:
            raise _err(path, key, f"unknown name {node.id!r}; allowed: {list(PARAM_NAMES)}")
        if isinstance(node, ast.Constant) and not isinstance(node.value, int | float):
            raise _err(path, key, f"only numeric constants are allowed: {expr!r}")
    return compile(tree, f"<{key}>", "eval")


def load_space(path: str | Path) -> SearchSpace:
    """Read and validate a search-space file; raise :class:`SpaceError` with a clear message."""
    path = str(path)
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise SpaceError(f"{path}: cannot read the search space ({e.strerror})") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise SpaceError(f"{path}: not valid YAML{where}: {getattr(e, 'problem', e)}") from None
    if not isinstance(doc, dict):
        raise SpaceError(f"{path}: must be a YAML mapping with keys {list(TOP_KEYS)}")
    _check_keys(path, "", doc, TOP_KEYS)
    for req in ("name", "workloads", "concurrency", "parameters", "baseline"):
        if req not in doc:
            raise _err(path, req, f"is required: {TOP_KEYS[req]}")
    name = doc["name"]
    if not isinstance(name, str) or not name or not all(c.isalnum() or c in "_-" for c in name):
        raise _err(path, "name", f"must be letters, digits, '_' or '-', got {name!r}")
    target = doc.get("target", "sm_120")
    if target not in TARGETS:
        raise _err(path, "target", f"must be one of {sorted(TARGETS)}, got {target!r}")

    wls = doc["workloads"]
    if not isinstance(wls, list) or not wls:
        raise _err(path, "workloads", "must be a non-empty list")
    workloads = []
    for i, w in enumerate(wls):
        key = f"workloads[{i}]"
        _check_keys(path, key, w, WORKLOAD_KEYS)
        missing = [k for k in WORKLOAD_KEYS if k not in w and k not in ("tp", "page_size", "context")]
        if missing:
            raise _err(path, f"{key}.{missing[0]}", "is required")
        if w["kv_format"] not in FORMATS:
            raise _err(path, f"{key}.kv_format", f"must be one of {sorted(FORMATS)}, got {w['kv_format']!r}")
        vals = {
            k: _pos_int(path, f"{key}.{k}", w.get(k, d))
            for k, d in (("heads", None), ("tp", 1), ("topk", None), ("page_size", 64), ("context", 8192))
        }
        if vals["heads"] % vals["tp"]:
            raise _err(path, f"{key}.tp", f"must divide heads ({vals['heads']}), got {vals['tp']}")
        if not isinstance(w["name"], str) or not w["name"]:
            raise _err(path, f"{key}.name", f"must be a non-empty string, got {w['name']!r}")
        workloads.append(WorkloadSpec(w["name"], w["kv_format"], **vals))
    if len({w.name for w in workloads}) != len(workloads):
        raise _err(path, "workloads", "names must be unique")

    conc = doc["concurrency"]
    if not isinstance(conc, list) or not conc:
        raise _err(path, "concurrency", "must be a non-empty list of positive integers")
    concurrency = [_pos_int(path, f"concurrency[{i}]", c) for i, c in enumerate(conc)]
    if len(set(concurrency)) != len(concurrency):
        raise _err(path, "concurrency", f"has duplicates: {concurrency}")

    _check_keys(path, "parameters", doc["parameters"], PARAM_NAMES)
    required = [p.name for p in PARAMS if p.always_in_key]
    missing = [p for p in required if p not in doc["parameters"]]
    if missing:
        raise _err(path, f"parameters.{missing[0]}", f"is required; every one of {required} must be given")
    parameters = {
        p.name: _distribution(path, f"parameters.{p.name}", doc["parameters"][p.name])
        if p.name in doc["parameters"]
        else [p.default]
        for p in PARAMS
    }
    for p in PARAMS:
        for v in parameters[p.name]:
            if not p.valid(v):
                raise _err(path, f"parameters.{p.name}", f"{p.name} must be {p.rule}, got {v!r}")

    cons = doc.get("constraints") or []
    if not isinstance(cons, list):
        raise _err(path, "constraints", "must be a list of expression strings")
    compiled = [_constraint(path, f"constraints[{i}]", c) for i, c in enumerate(cons)]

    _check_keys(path, "baseline", doc["baseline"], PARAM_NAMES)
    for p in required:
        if p not in doc["baseline"]:
            raise _err(path, f"baseline.{p}", "is required")
    try:
        baseline = KernelConfig.from_dict(doc["baseline"])
    except (ValueError, TypeError) as e:
        raise _err(path, "baseline", str(e)) from None
    for p in PARAM_NAMES:
        if getattr(baseline, p) not in parameters[p]:
            raise _err(
                path, f"baseline.{p}", f"must be one of the space's choices {parameters[p]}, got {getattr(baseline, p)}"
            )

    meas = doc.get("measurement") or {}
    _check_keys(path, "measurement", meas, MEASUREMENT_DEFAULTS)
    measurement = {k: _pos_int(path, f"measurement.{k}", meas.get(k, d)) for k, d in MEASUREMENT_DEFAULTS.items()}
    if measurement["rounds"] < 3:
        raise _err(path, "measurement.rounds", f"must be >= 3 for a confidence interval, got {measurement['rounds']}")

    samp = doc.get("sampler") or {}
    _check_keys(path, "sampler", samp, SAMPLER_KEYS)
    sampler = {"name": samp.get("name", "grid"), "seed": samp.get("seed", 0), "n_trials": samp.get("n_trials")}
    if sampler["name"] not in SAMPLERS:
        raise _err(path, "sampler.name", f"must be one of {list(SAMPLERS)}, got {sampler['name']!r}")
    _pos_int(path, "sampler.seed", sampler["seed"], minimum=0)
    if sampler["n_trials"] is not None:
        _pos_int(path, "sampler.n_trials", sampler["n_trials"])

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
    )
    if not space.satisfies(baseline):
        raise _err(path, "baseline", f"violates the constraints {cons}")
    return space
