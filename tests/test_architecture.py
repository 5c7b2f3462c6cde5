"""The structure the code promises: the kernel's parameter declaration, compile_spec agreeing with the
launcher, typed messages, and layers that import only downward."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import sparse_mla_tuner.kernels.decode as decode
from sparse_mla_tuner.kernels import Workload
from sparse_mla_tuner.kernels import make_batch
from sparse_mla_tuner.kernels import sparse_mla_decode
from sparse_mla_tuner.kernels.config import PARAM_NAMES
from sparse_mla_tuner.kernels.config import PARAMS
from sparse_mla_tuner.kernels.config import KernelConfig
from sparse_mla_tuner.kernels.config import Role
from sparse_mla_tuner.kernels.config import launch_identity

ROOT = Path(__file__).resolve().parent.parent


# --- the declaration -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text", ["T16-w4-s2-c256", "T64-w8-s4-c1024", "T32-w2-s1-c7", "T16-w4-s2-c256-r128", "c256-T16-w4-s2"]
)
def test_key_round_trips(text):
    cfg = KernelConfig.parse(text)
    assert KernelConfig.parse(str(cfg)) == cfg
    assert set(cfg.as_dict()) == set(PARAM_NAMES)


@pytest.mark.parametrize(
    "bad", ["T16-w4-s2", "T17-w4-s2-c256", "T16-w4-s2-c256-x1", "T16-w4-s2-c0", "", "T16-T16-w4-s2-c1"]
)
def test_bad_keys_are_refused_in_one_sentence(bad):
    with pytest.raises(ValueError) as e:
        KernelConfig.parse(bad)
    assert "\n" not in str(e.value)


def test_roles_decide_compile_key_options_and_triton_config():
    cfg = KernelConfig(BLOCK_T=32, num_warps=8, num_stages=3, TARGET_CTAS=512)
    assert dict(cfg.compile_key()) == {p.name: getattr(cfg, p.name) for p in PARAMS if p.role is not Role.LAUNCH}
    assert cfg.compile_key() == cfg.replace(TARGET_CTAS=1).compile_key()  # the grid is not the binary
    assert cfg.compile_key() != cfg.replace(maxnreg=128).compile_key()
    kw = cfg.triton_config_kwargs()
    assert kw == {
        "kwargs": {"BLOCK_T": 32, "PREFETCH": 0, "BALANCED": 0, "MERGE": 0},
        "num_warps": 8,
        "num_stages": 3,
    }  # maxnreg 0
    assert cfg.compile_key() != cfg.replace(PREFETCH=1).compile_key()
    assert str(cfg.replace(PREFETCH=1)) == "T32-w8-s3-c512-p1"  # printed only when set: old keys still parse
    assert str(cfg.replace(BALANCED=1)) == "T32-w8-s3-c512-b1" and KernelConfig.parse("T32-w8-s3-c512-b1").BALANCED == 1
    assert cfg.compile_key() != cfg.replace(BALANCED=1).compile_key()
    assert str(cfg.replace(MERGE=1)) == "T32-w8-s3-c512-m1" and KernelConfig.parse("T32-w8-s3-c512-m1").MERGE == 1
    assert cfg.compile_key() != cfg.replace(MERGE=1).compile_key()
    assert cfg.replace(maxnreg=128).options()["maxnreg"] == 128
    assert str(cfg) == "T32-w8-s3-c512" and str(cfg.replace(maxnreg=128)) == "T32-w8-s3-c512-r128"
    assert cfg.compile_label() == "T32-w8-s3"


def test_launch_identity_merges_clamped_target_ctas():
    # 16 heads, topk 512, BLOCK_T 32: 16 tiles; at C=8 any TARGET_CTAS >= 128 asks for the 16-split maximum
    a, b = KernelConfig(32, 4, 1, 128), KernelConfig(32, 4, 1, 1024)
    assert launch_identity(a, 16, 512, 8) == launch_identity(b, 16, 512, 8)
    assert launch_identity(a, 16, 512, 96) != launch_identity(b, 16, 512, 96)  # 2 vs 11 splits at C=96
    assert launch_identity(a, 16, 512, 8) != launch_identity(a.replace(num_warps=8), 16, 512, 8)
    # MERGE changes the launch where a row has splits to merge, not at one split per row (the same binary runs)
    assert launch_identity(a, 16, 512, 8) != launch_identity(a.replace(MERGE=1), 16, 512, 8)
    one = KernelConfig(32, 4, 1, 1)
    assert launch_identity(one, 16, 512, 8) == launch_identity(one.replace(MERGE=1), 16, 512, 8)


def test_database_columns_come_from_the_declaration():
    from sparse_mla_tuner.db.models import CONFIG_COLUMNS
    from sparse_mla_tuner.db.models import TrialModel
    from sparse_mla_tuner.tuner.adapters.sparse_mla.records import config_of

    assert CONFIG_COLUMNS == {p.name: p.default for p in PARAMS}  # named in db/ (no kernel import), as declared
    cols = set(TrialModel.__table__.columns.keys())
    assert set(PARAM_NAMES) <= cols
    assert {p.name: TrialModel.__table__.columns[p.name].server_default.arg for p in PARAMS} == {
        p.name: str(p.default) for p in PARAMS
    }
    t = TrialModel(**KernelConfig(32, 8, 3, 512).as_dict())
    assert config_of(t) == KernelConfig(32, 8, 3, 512)


# --- compile_spec is what the launcher launches ------------------------------------------------------

SPEC_PROGRAM = """
import json, sys
from sparse_mla_tuner.kernels.config import KernelConfig
from sparse_mla_tuner.kernels.decode import compile_spec
from sparse_mla_tuner.kernels.workload import Workload
out = {}
for key, wl, batch in json.loads(sys.argv[1]):
    cfg, wl = KernelConfig.parse(key), Workload(**wl)
    out[f"{key} {wl.kv_format} {batch}"] = [
        {"name": s.name, "signature": s.signature, "constexprs": s.constexprs, "options": s.options}
        for s in compile_spec(cfg, wl, 120, batch)
    ]
print(json.dumps(out))
"""


def _compiler_process(program: str, *args: str):
    """``program``'s JSON output, run where Triton compiles instead of interpreting (no TRITON_INTERPRET)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", program, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


TYPES = {torch.bfloat16: "*bf16", torch.float32: "*fp32", torch.uint8: "*u8", torch.int32: "*i32"}


SPEC_CASES = [
    ("T16-w4-s2-c256", "fp8_model1", 3),
    ("T32-w8-s1-c1", "fp8_v32", 2),
    ("T16-w4-s1-c2", "fp8_model1", 1),
    ("T16-w4-s1-c2-p1", "fp8_v32", 1),
    ("T16-w4-s1-c2-p2", "fp8_model1", 2),
]


def _spec_workload(fmt):
    return Workload(fmt, 16, 64, 64, 128)


@pytest.fixture(scope="module")
def compiled_specs():
    """compile_spec of every case of SPEC_CASES, from one process where Triton compiles (one interpreter start)."""
    cases = [(key, _spec_workload(fmt).__dict__, batch) for key, fmt, batch in SPEC_CASES]
    return _compiler_process(SPEC_PROGRAM, json.dumps(cases))


@pytest.mark.parametrize("key, fmt, batch", SPEC_CASES)
def test_compile_spec_matches_what_the_launcher_runs(key, fmt, batch, monkeypatch, compiled_specs):
    wl = _spec_workload(fmt)
    cfg = KernelConfig.parse(key)
    seen = []

    class Recorder:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda **kw: seen.append((self.name, kw))

    monkeypatch.setattr(decode, "_split_kernel", Recorder("split"))
    monkeypatch.setattr(decode, "_combine_kernel", Recorder("combine"))
    bt = make_batch(wl, batch, device="cpu")
    sparse_mla_decode(*bt.args(), kv_format=fmt, config=cfg)
    specs = compiled_specs[f"{key} {fmt} {batch}"]
    assert [s["name"] for s in specs] == [name for name, _ in seen]
    for spec, (_, kw) in zip(specs, seen, strict=True):
        # the interpreter's fp32 dots; sm_120's fp8 conversion; programmatic dependent launch (sm_90+)
        arch_only = {"DOT_F32", "NATIVE_FP8", "USE_PDL"}
        launched_const = {k: v for k, v in kw.items() if spec["signature"].get(k) == "constexpr" and k not in arch_only}
        assert launched_const == {k: v for k, v in spec["constexprs"].items() if k not in arch_only}
        for name, ty in spec["signature"].items():
            v = kw[name]
            if isinstance(v, torch.Tensor):
                assert ty == TYPES[v.dtype], name
        launched_options = {k: kw[k] for k in ("num_warps", "num_stages", "maxnreg") if k in kw}
        assert launched_options in ({}, spec["options"])  # the interpreter launch drops compile options
    assert specs[0]["options"] == {**cfg.options(), "launch_pdl": True}  # sm_120 launches with PDL


PDL_PROGRAM = """
import json, sys, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from sparse_mla_tuner.kernels.config import KernelConfig
from sparse_mla_tuner.kernels.decode import compile_spec
from sparse_mla_tuner.kernels.workload import Workload
out = []
for cc in (120, 80):
    for s in compile_spec(KernelConfig(16, 4, 1, 256), Workload("fp8_v32", 16, 64, 64, 128), cc, 2):
        k = triton.compile(ASTSource(s.kernel, s.signature, s.constexprs, s.attrs),
                           target=GPUTarget("cuda", cc, 32), options=s.options)
        out.append([cc, s.name, bool(k.metadata.launch_pdl), "griddepcontrol.wait" in k.asm["ptx"]])
print(json.dumps(out))
"""


def test_kernels_launch_with_pdl_where_the_arch_has_it():
    """sm_90+ (sm_120 included): both kernels are launched with programmatic dependent launch and wait
    for the kernel before them (griddepcontrol.wait) before reading anything; older archs get neither."""
    got = {(cc, name): (pdl, wait) for cc, name, pdl, wait in _compiler_process(PDL_PROGRAM)}
    assert got == {
        (120, "split"): (True, True),
        (120, "combine"): (True, True),
        (80, "split"): (False, False),
        (80, "combine"): (False, False),
    }


# --- messages ------------------------------------------------------------------------------------------


def test_protocol_messages_round_trip():
    from sparse_mla_tuner.db.verdicts import Verdict
    from sparse_mla_tuner.tuner import protocol

    req = protocol.MeasureRequest(Workload("fp8_v32", 16, 64), 4, KernelConfig(), KernelConfig(32), 5, 7, False)
    assert protocol.decode(protocol.encode(req)) == req
    cal = protocol.CalibrateRequest(Workload("fp8_model1", 16, 512), 96, KernelConfig(), 30)
    assert protocol.decode(protocol.encode(cal)) == cal
    reply = protocol.MeasureReply(Verdict.OK, "", [(1.0, 2.0)], 3, 2, 0.001, 0.0)
    assert protocol.decode(protocol.encode(reply)) == reply
    with pytest.raises(ValueError, match="not a protocol message"):
        protocol.decode('{"op": "measure"}')


# --- layers --------------------------------------------------------------------------------------------


NAMESPACE = "sparse_mla_tuner."


def _imports(path: Path) -> set[str]:
    """The project modules and other modules ``path`` imports, the project's without its namespace
    (``sparse_mla_tuner.kernels.config`` -> ``kernels.config``; ``from sparse_mla_tuner import db`` -> ``db``;
    in tuner/search.py, ``from ..db import queries`` -> ``db.queries`` and ``from .space import Space`` ->
    ``tuner.space``)."""
    package = path.relative_to(ROOT).parent.parts
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.removeprefix(NAMESPACE) for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level:
            base = ".".join(package[: len(package) - node.level + 1])
            if node.module:
                out.add(f"{base}.{node.module}" if base else node.module)
            else:  # from . import stats: the names are modules (or a package's names; both count)
                out |= {f"{base}.{a.name}" for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module == NAMESPACE[:-1]:
                out |= {a.name for a in node.names}
            else:
                out.add(node.module.removeprefix(NAMESPACE))
    return out


def test_imports_are_read_both_ways():
    """The layer tests below see an import whether it is written through the namespace or relative to its file."""
    assert {"tuner.space", "tuner.strategies"} <= _imports(ROOT / "tuner" / "search.py")
    assert {"db.verdicts", "tuner.stats"} <= _imports(ROOT / "tuner" / "study.py")
    assert "kernels.config" in _imports(ROOT / "kernels" / "decode.py")


def test_the_packages_import_each_other_relative_to_their_files():
    """Inside kernels/, db/ and tuner/ a module names another by its place (``from ..db.store import Store``), so that
    the import says which file it reads; the kernel's three files keep the namespace's form, because their text is
    the kernel's identity (``kernels.config.KERNEL_FILES``; a new form would make every table stale), and Alembic
    loads db/migrations/ by path, not as the package's modules."""
    from sparse_mla_tuner.kernels.config import KERNEL_FILES

    for pkg in ("kernels", "db", "tuner"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if (path.parent.name == "kernels" and path.name in KERNEL_FILES) or "migrations" in path.parts:
                continue
            tree = ast.parse(path.read_text())
            absolute = [
                node.module
                for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith(NAMESPACE)
            ]
            absolute += [
                a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names
                if a.name.startswith(NAMESPACE)
            ]  # fmt: skip
            assert not absolute, f"{path.relative_to(ROOT)} imports {absolute} through the namespace"


def test_the_project_imports_itself_only_through_its_namespace():
    """Installed, kernels/, db/ and tuner/ are sparse_mla_tuner.kernels, .db and .tuner: no top-level name."""
    for pkg in ("kernels", "db", "tuner", "tests", "results", "benchmarks"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                bad = [n for n in names if n.split(".")[0] in ("kernels", "db", "tuner")]
                assert not bad, f"{path.relative_to(ROOT)} imports {bad} outside the sparse_mla_tuner namespace"


@pytest.mark.parametrize("package, forbidden", [("kernels", ("tuner", "db")), ("db", ("tuner",))])
def test_layers_import_only_downward(package, forbidden):
    for path in sorted((ROOT / package).rglob("*.py")):
        bad = [m for m in _imports(path) if m.split(".")[0] in forbidden]
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_no_import_cycles():
    modules = {}
    for pkg in ("kernels", "db", "tuner"):
        for path in (ROOT / pkg).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            modules[name] = path
    graph = {m: {i for i in _imports(p) if i in modules and i != m} for m, p in modules.items()}
    state: dict[str, int] = {}

    def visit(m, stack):
        state[m] = 1
        for n in graph[m]:
            if state.get(n) == 1:
                raise AssertionError(" -> ".join([*stack, m, n]))
            if n not in state:
                visit(n, [*stack, m])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])


# --- the kernel adapter ----------------------------------------------------------------------------------

WING = "tuner/adapters/sparse_mla/"  # everything of the tuner that knows the sparse-MLA kernel
KERNEL_DOORS = {"tuner/measure_main.py"}  # beside the wing: the measurement program (the kernels' CUDA-graph timing)
REGISTRY = "tuner/adapter.py"  # the built-in adapters by name (BUILTIN): the core's one mention of the wing
GENERIC = (  # the tuner's core: it speaks of configs, workloads and launches through an adapter object only
    "tuner/adapter.py",
    "tuner/space.py",
    "tuner/study.py",
    "tuner/candidates.py",
    "tuner/noise.py",
    "tuner/recorder.py",
    "tuner/optuna_study.py",
    "tuner/local_study.py",
    "tuner/stats.py",
    "tuner/strategies",
    "tuner/search.py",
    "tuner/cli.py",
    "tuner/measure.py",
    "tuner/feasibility.py",
    "tuner/export.py",
    "tuner/replay.py",
    "tuner/report.py",
)


def test_tuner_names_the_kernel_package_only_in_its_wing():
    """tuner/ reaches kernels/ through the kernel's wing (tuner/adapters/sparse_mla/) and the measurement process's
    program; no other module of tuner/ names the package, in an import or anywhere in its text."""
    naming = {
        str(p.relative_to(ROOT))
        for p in (ROOT / "tuner").rglob("*.py")
        if "sparse_mla_tuner.kernels" in p.read_text() or any(m.split(".")[0] == "kernels" for m in _imports(p))
    }
    outside = sorted(n for n in naming - KERNEL_DOORS if not n.startswith(WING))
    assert not outside, outside
    assert any(n.startswith(WING) for n in naming)  # the check reads the wing (a moved wing would pass unread)


def test_no_core_file_names_the_wing_but_the_registry():
    """The core reaches the kernel's wing through tuner/adapter.py's interface alone: no module of tuner/ outside
    tuner/adapters/ imports the wing or names it, but the registry of built-in adapters (by its module path)."""
    naming = []
    for p in sorted((ROOT / "tuner").rglob("*.py")):
        where = str(p.relative_to(ROOT))
        if where.startswith("tuner/adapters/"):
            continue
        text = p.read_text()
        imports = [m for m in _imports(p) if m.startswith("tuner.adapters")]
        if imports or "adapters.sparse_mla" in text or "adapters/sparse_mla" in text:
            naming.append(where)
    assert naming == [REGISTRY], naming
    assert "sparse_mla_tuner.tuner.adapters.sparse_mla.adapter:SparseMlaAdapter" in (ROOT / REGISTRY).read_text()


def test_the_database_layer_imports_no_kernel():
    """db/ holds the kernel's columns by name (CONFIG_COLUMNS), and their meaning lives in the wing: no db module
    imports kernels/, even inside a function."""
    naming = [
        str(p.relative_to(ROOT))
        for p in sorted((ROOT / "db").rglob("*.py"))
        if "migrations" not in p.parts and any(m.split(".")[0] == "kernels" for m in _imports(p))
    ]
    assert naming == [], naming


@pytest.mark.parametrize("where", GENERIC)
def test_the_tuner_core_imports_no_kernel_adapter(where):
    paths = [ROOT / where] if where.endswith(".py") else sorted((ROOT / where).rglob("*.py"))
    for path in paths:
        bad = [m for m in _imports(path) if m.startswith(("kernels", "tuner.adapters"))]
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


# --- the search code's classes -----------------------------------------------------------------------


def _classes():
    for path in sorted((ROOT / "tuner").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                yield path.relative_to(ROOT), node


def _self_attributes(function) -> set[str]:
    """The attributes a method assigns on ``self`` (``self.x = ...``, ``self.x += ...``, ``self.a, self.b = ...``)."""
    out = set()
    for node in ast.walk(function):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []  # fmt: skip
        for target in targets:
            for t in ast.walk(target):
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    out.add(t.attr)
    return out


def test_no_class_of_the_search_code_is_over_250_lines():
    long = [
        f"{path}:{c.name} {c.end_lineno - c.lineno + 1}" for path, c in _classes() if c.end_lineno - c.lineno >= 250
    ]
    assert not long, long


def test_every_attribute_is_created_in_init():
    """A class's state is declared where it is made: a method other than ``__init__`` (or a dataclass's
    ``__post_init__``) assigns only attributes ``__init__`` or the class body created."""
    stray = []
    for path, c in _classes():
        methods = [f for f in c.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
        made = {a for f in methods if f.name in ("__init__", "__post_init__") for a in _self_attributes(f)}
        made |= {
            t.id for s in c.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) for t in [s.target]
        }
        made |= {t.id for s in c.body if isinstance(s, ast.Assign) for t in s.targets if isinstance(t, ast.Name)}
        for f in methods:
            stray += [f"{path}:{c.name}.{f.name} sets self.{a}" for a in sorted(_self_attributes(f) - made)]
    assert not stray, stray


# --- what a command loads --------------------------------------------------------------------------------

HEAVY = ("torch", "triton", "sparse_mla_tuner.kernels")  # a kernel's modules, and what only a kernel's run needs
CORE = ("cli", "study", "search", "candidates", "measure", "recorder", "strategies")
# the core and the generic drivers, each imported alone in a fresh interpreter: none loads a kernel, torch or Triton
CORE_MODULES = (
    *CORE,
    "strategies.grid",
    "strategies.tpe",
    "strategies.surrogate",
    "adapter",
    "export",
    "replay",
    "report",
    "feasibility",
    "noise",
    "optuna_study",
    "optuna_rows",
    "space",
    "local_study",
    "calibrate",
)

LOADED_PROGRAM = """
import importlib, json, os, sys
heavy = tuple(json.loads(sys.argv[1]))
for name in json.loads(sys.argv[2]):
    importlib.import_module(name)
if json.loads(sys.argv[3]) is not None:  # then run that command line, as the `tuner` executable does
    from sparse_mla_tuner.tuner.cli import main
    sys.argv = ["tuner", *json.loads(sys.argv[3])]
    try:
        main()
    except SystemExit:
        pass
print(json.dumps(sorted(m for m in sys.modules if m.startswith(heavy))), file=sys.__stderr__)
"""


def _loaded(modules, argv=None, env=None):
    """The heavy modules a fresh interpreter holds after importing ``modules`` and running ``tuner ARGV``."""
    env = {**os.environ, **(env or {})}
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run(
        [sys.executable, "-c", LOADED_PROGRAM, json.dumps(HEAVY), json.dumps(list(modules)), json.dumps(argv)],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300,
    )  # fmt: skip
    return json.loads(proc.stderr.strip().splitlines()[-1]), proc.stdout


@pytest.mark.parametrize("module", CORE_MODULES)
def test_each_core_module_alone_loads_no_kernel_torch_or_triton(module):
    """The transitive rule, module by module: importing one core module in a fresh interpreter leaves no
    ``sparse_mla_tuner.kernels`` module, torch or Triton in ``sys.modules`` (what it imports, and what that imports)."""
    loaded, _ = _loaded([f"sparse_mla_tuner.tuner.{module}"])
    assert loaded == [], (module, loaded)


def test_the_tuner_core_loads_no_kernel_torch_or_triton_even_transitively():
    """Importing the core (the command line, the study, the search and their parts) loads no kernel module,
    torch or Triton, whatever imports what: the adapter loads its kernel when a command uses it."""
    loaded, _ = _loaded([f"sparse_mla_tuner.tuner.{m}" for m in CORE])
    assert loaded == []
    loaded, _ = _loaded(["sparse_mla_tuner.db.queries", "sparse_mla_tuner.db.record", "sparse_mla_tuner.db.store"])
    assert loaded == []  # reading the results database needs no kernel either


@pytest.mark.parametrize(
    "argv, env",
    [
        (["--help"], None),
        (["--version"], None),
        (["search", "--help"], None),
        (["best", "--concurrency", "nope"], None),
        (["search", "search_spaces/no_such_space.yaml"], None),
        (["search", "tests/fixtures/typo_space.yaml"], None),
        ([], {"_TUNER_COMPLETE": "bash_complete", "COMP_WORDS": "tuner se", "COMP_CWORD": "1"}),
    ],
    ids=["help", "version", "search-help", "bad-option", "no-space", "typo-space", "completion"],
)
def test_help_version_completion_and_a_bad_input_load_no_kernel(argv, env):
    loaded, out = _loaded([], argv, env=env)
    assert loaded == [], (argv, loaded)
    if env:
        assert "search" in out  # the completion answered


def _cpu_s(argv: list[str]) -> float:
    """The CPU time (user + system) a child process spent."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, capture_output=True, cwd=ROOT, timeout=300, env={**os.environ, "TRITON_INTERPRET": "0"})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def test_help_costs_a_fraction_of_a_torch_import():
    """`tuner --help` costs less CPU than a third of `import torch` on the same machine (a ratio, not seconds: a
    busy or slow machine slows both); before the imports were lazy it cost more than one whole torch import."""
    tuner = [sys.executable, "-m", "sparse_mla_tuner.tuner"]
    torch_s = _cpu_s([sys.executable, "-c", "import torch"])
    help_s = min(_cpu_s([*tuner, "--help"]) for _ in range(2))
    assert help_s < torch_s / 3, (help_s, torch_s)


def test_a_bad_value_the_kernels_adapter_judges_loads_no_torch_or_triton(tmp_path):
    """A space the built-in adapter refuses (an unknown cache format) is refused from the kernel's format table
    alone: its error loads no torch or Triton (the adapter imports them where a kernel runs)."""
    text = (ROOT / "search_spaces" / "smoke.yaml").read_text().replace("fp8_model1", "fp8_nonsense")
    space = tmp_path / "bad_format.yaml"
    space.write_text(text)
    loaded, _ = _loaded([], ["check", str(space)])
    assert [m for m in loaded if m.split(".")[0] in ("torch", "triton")] == [], loaded
    assert "sparse_mla_tuner.kernels.kv_format" in loaded  # the adapter did judge it
