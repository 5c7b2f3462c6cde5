"""The kernel adapter (tuner/adapter.py): a study of the example row softmax (examples/row_softmax/) with its
adapter alone, under the interpreter; its compile for the target; the sparse-MLA adapter's hooks; and a
space's `kernel:` refused in one sentence when it names no adapter."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sparse_mla_tuner.tuner.space import load_space
from tests.conftest import tuner_in_process

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = "examples/row_softmax/space.yaml"


@pytest.fixture(scope="module")
def example():
    return load_space(ROOT / EXAMPLE)


def test_the_example_space_names_its_own_adapter(example):
    assert example.kernel == "examples.row_softmax.adapter:RowSoftmaxAdapter"
    assert example.adapter.name == "row_softmax" and example.adapter.param_names == ("BLOCK_N", "num_warps")
    assert len(example.configs()) == 8
    from sparse_mla_tuner.tuner.study import StudyPlan

    spec = example.workloads[0]
    plan = StudyPlan(example, spec, spec.workload(), 2, dict.fromkeys(example.configs(), _feasible()), "grid")
    # BLOCK_N 1024 and 4096 both clamp to the 500-column row's 512: one launch per warp count
    assert len(plan.to_measure()) == 6
    assert {str(c) for c in plan.launches()[next(k for k in plan.launches() if "512" in str(k))]} == {
        "N1024-w2",
        "N4096-w2",
    }


def _feasible():
    from sparse_mla_tuner.tuner.feasibility import Feasibility

    return Feasibility(True, 0, 101_376, None, None, 0, "")


@pytest.mark.parametrize("sampler", ["grid", "surrogate"])
def test_a_study_of_the_example_adapter_alone(example, sampler):
    """Every level measured through the tuner's plan, strategy and statistics with the example's adapter alone:
    each launch passes the gate against the reference, the baseline is the unit, the pick is the fastest."""
    from sparse_mla_tuner.tuner.local_study import run_local_study

    results = run_local_study(example, sampler=sampler)
    assert [(r.workload, r.concurrency) for r in results] == [("row_500", 2), ("row_500", 4)]
    for r in results:
        assert r.failures == {}
        assert r.launches == 6 and 1 <= len(r.ratios) <= 6 and r.stopped
        assert r.ratios[example.baseline] == 1.0
        fastest = min(r.ratios, key=r.ratios.get)
        assert r.pick == (fastest if r.ratios[fastest] < 1.0 else example.baseline)
    table = example.adapter.export_table({r.concurrency: r.pick for r in results})
    assert table == {str(r.concurrency): r.pick.as_dict() for r in results}


def test_the_example_gate_catches_a_wrong_output(example):
    adapter = example.adapter
    x = adapter.inputs(example.workloads[0], 3, "cpu", seed=1)
    expected = adapter.reference(x)
    assert adapter.check(adapter.launch(example.baseline, x), expected) == ""
    wrong = adapter.launch(example.baseline, x).clone()
    wrong[1, 7] += 0.01
    assert "max |error|" in adapter.check(wrong, expected)
    assert adapter.bytes_moved(example.workloads[0], 3) == 2 * 3 * 500 * 2


COMPILE = """
import json, sys, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from sparse_mla_tuner.tuner.space import load_space
space = load_space(sys.argv[1])
out = {}
for cfg in space.configs():
    for s in space.adapter.compile_specs(cfg, space.workloads[0].workload(), 120):
        k = triton.compile(ASTSource(s.kernel, s.signature, s.constexprs, s.attrs),
                           target=GPUTarget("cuda", 120, 32), options=s.options)
        out[str(cfg)] = [k.metadata.shared, k.n_regs if hasattr(k, "n_regs") else None, k.metadata.num_warps]
print(json.dumps(out))
"""


def test_the_example_compiles_for_its_target(example):
    """The feasibility hook: the adapter's compile specs compile for sm_120 without a GPU (no interpreter)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", COMPILE, EXAMPLE], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert set(got) == {str(c) for c in example.configs()}
    for key, (shared, _, warps) in got.items():
        assert 0 <= shared <= example.limit_bytes, key
        assert warps == int(key.split("-w")[1])


def test_the_sparse_mla_adapter_runs_its_kernel_against_its_reference():
    from sparse_mla_tuner.tuner.study import launch_key

    space = load_space(ROOT / "search_spaces/smoke.yaml")
    adapter, wl = space.adapter, space.workloads[0].workload()
    assert space.kernel == "sparse_mla" and adapter.source_hash()
    inputs = adapter.inputs(wl, 2, "cpu", seed=3)
    assert adapter.check(adapter.launch(space.baseline, inputs), adapter.reference(inputs)) == ""
    assert adapter.bytes_moved(wl, 2) == wl.min_bytes(2)
    assert json.loads(launch_key(space.baseline, wl, 4)) == json.loads(
        json.dumps(adapter.launch_identity(space.baseline, wl, 4))
    )
    assert len(adapter.encode(space.baseline, wl, 4)) == 1 + len(adapter.params) + 4 + 4  # log C, params, p, 1 cache


BAD_KERNELS = [
    ("5", "must be one of ['sparse_mla'] or `module:Class`"),
    ("sparse", "unknown adapter 'sparse'"),
    ("no_such_module_anywhere:Cls", "module 'no_such_module_anywhere' does not import (ModuleNotFoundError"),
    ("examples.row_softmax.adapter:SoftmaxConfig", "is not a KernelAdapter subclass"),
    ("sparse_mla_tuner.tuner.adapter:KernelAdapter", "cannot be made (TypeError"),
]


@pytest.mark.parametrize("kernel, says", BAD_KERNELS, ids=[k for k, _ in BAD_KERNELS])
def test_a_bad_kernel_is_one_sentence_and_exit_2(tmp_path, kernel, says):
    text = (ROOT / "search_spaces/smoke.yaml").read_text().replace("name: smoke\n", f"name: smoke\nkernel: {kernel}\n")
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    proc = tuner_in_process("check", str(path), "--db", f"sqlite:///{tmp_path / 'c.db'}")
    assert proc.returncode == 2
    message = proc.stderr.strip()
    assert "\n" not in message and "Traceback" not in message
    assert f"{path}: `kernel`: " in message and says in message


def test_tuner_search_tunes_the_example_adapter_through_the_results_database(tmp_path):
    """`tuner search` of the example's space under the interpreter, recorded in the results database: `tuner best`
    names its pick, `tuner show` its parameters, and a second search measures nothing at the finished level."""
    import sqlite3

    from tests.conftest import tuner_processes

    db = tmp_path / "s.db"
    search = ["search", EXAMPLE, "--backend", "interpreter", "--concurrency", "2", "--db", f"sqlite:///{db}", "-q"]
    first, again = tuner_processes([[*search, "-f", "json"], [*search, "-f", "json"]])
    assert first.returncode == 0, first.stderr[-2000:]
    [row] = json.loads(first.stdout)
    assert (row["workload"], row["C"], row["ok"], row["duplicate"]) == ("row_500", 2, 6, 2)
    assert row["stopped"] == "every one of the 6 distinct feasible launches measured" and row["gpu_s"] > 0
    con = sqlite3.connect(db)
    samples = con.execute("SELECT COUNT(*) FROM tuner_samples").fetchone()[0]
    assert samples > 0
    (kernel,) = con.execute("SELECT DISTINCT adapter FROM tuner_kernels").fetchone()
    assert kernel == "examples.row_softmax.adapter:RowSoftmaxAdapter"
    assert all(json.loads(p) in [c.as_dict() for c in load_space(ROOT / EXAMPLE).configs()]
               for p, in con.execute("SELECT params FROM tuner_trials"))  # fmt: skip

    assert again.returncode == 0, again.stderr[-2000:]
    [row2] = json.loads(again.stdout)
    assert row2["stopped"] == row["stopped"] and row2["best"] == row["best"] and row2["gpu_s"] == 0
    assert con.execute("SELECT COUNT(*) FROM tuner_samples").fetchone()[0] == samples  # nothing measured again

    best = tuner_in_process("best", "--concurrency", "2", "--db", f"sqlite:///{db}", "-f", "json")
    assert best.returncode == 0, best.stderr
    [b] = json.loads(best.stdout)
    assert (b["space"], b["workload"], b["config"]) == ("row_softmax_example", "row_500", row["best"])
    assert f"N{b['BLOCK_N']}-w{b['num_warps']}" == b["config"]  # the adapter's parameters, not the built-in's
    show = tuner_in_process("show", str(b["trial"]), "--db", f"sqlite:///{db}", "-f", "json")
    shown = json.loads(show.stdout)
    assert shown["BLOCK_N"] == b["BLOCK_N"] and "BLOCK_T" not in shown and shown["adapter"].endswith("Adapter")
    check = tuner_in_process("check", EXAMPLE, "--db", f"sqlite:///{db}", "-f", "json", "-q")
    assert check.returncode == 0, check.stderr
    assert [(r["BLOCK_N"], r["num_warps"], r["feasible"]) for r in json.loads(check.stdout)] == [
        (c.BLOCK_N, c.num_warps, True) for c in load_space(ROOT / EXAMPLE).configs()
    ]  # the search's compiles, cached
    export = tuner_in_process("export", "--db", f"sqlite:///{db}", "--out", str(tmp_path / "tables"))
    assert export.returncode == 2 and "\n" not in export.stderr.strip() and "export_table" in export.stderr


@pytest.mark.parametrize("command", ["search", "calibrate"])
def test_a_bad_adapter_stops_search_and_calibrate_in_one_sentence(tmp_path, command):
    text = (ROOT / EXAMPLE).read_text().replace("examples.row_softmax.adapter:RowSoftmaxAdapter", "no.such:Adapter")
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    proc = tuner_in_process(command, str(path), "--backend", "interpreter", "--db", f"sqlite:///{tmp_path / 's.db'}")
    assert proc.returncode == 2
    message = proc.stderr.strip()
    assert "\n" not in message and "Traceback" not in message
    assert (
        message
        == f"error: {path}: `kernel`: module 'no.such' does not import (ModuleNotFoundError: No module named 'no')"
    )
    assert not (tmp_path / "s.db").exists()  # refused before anything was created


def test_the_replay_backend_of_the_example_asks_for_its_source_in_one_sentence(tmp_path):
    """Any adapter's space replays (tests/test_example_adapter.py); without the database to draw from, one sentence."""
    proc = tuner_in_process("search", EXAMPLE, "--backend", "replay", "--db", f"sqlite:///{tmp_path / 's.db'}")
    assert proc.returncode == 2
    message = proc.stderr.strip()
    assert message == "error: --backend replay needs --replay-db URL (the database whose samples are replayed)"


def test_a_request_of_the_example_crosses_the_protocol_as_its_adapter_says(example):
    from sparse_mla_tuner.tuner.protocol import CalibrateRequest
    from sparse_mla_tuner.tuner.protocol import MeasureRequest
    from sparse_mla_tuner.tuner.protocol import decode
    from sparse_mla_tuner.tuner.protocol import encode

    spec, cfg = example.workloads[0], example.configs()[-1]
    for req in (
        MeasureRequest(spec.workload(), 2, cfg, example.baseline, 3, 7, True, example.adapter.spec),
        CalibrateRequest(spec.workload(), 2, cfg, 3, 0, example.adapter.spec),
    ):
        assert decode(encode(req)) == req
    assert example.adapter.spec == example.kernel


def test_a_bad_example_workload_names_its_place(tmp_path):
    text = (ROOT / EXAMPLE).read_text().replace("cols: 500", "cols: 0")
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    from sparse_mla_tuner.tuner.errors import SpaceError

    with pytest.raises(SpaceError) as e:
        load_space(path)
    assert str(e.value) == f"{path}: `workloads[0]`: `cols` must be an integer in 1..1048576, got 0"


def test_the_example_kernel_matches_its_reference_on_odd_shapes():
    from examples.row_softmax.kernel import row_softmax
    from examples.row_softmax.kernel import row_softmax_ref

    for rows, cols, block in [(1, 1, 16), (3, 17, 16), (2, 300, 64), (5, 1000, 4096)]:
        for dtype, tol in [(torch.float16, 2e-3), (torch.float32, 1e-5)]:
            x = torch.randn(rows, cols, dtype=dtype) * 4
            y = row_softmax(x, block, 4)
            assert (y.float() - row_softmax_ref(x).float()).abs().max().item() <= tol, (rows, cols, block, dtype)
