"""Search-space files: the shipped ones load; malformed ones get one clear sentence and exit 2."""

import subprocess
import sys
import textwrap

import pytest

from sparse_mla_tuner.tuner.errors import SpaceError
from sparse_mla_tuner.tuner.space import load_space

GOOD = """\
name: t
target: sm_120
workloads:
  - {name: w, kv_format: fp8_model1, heads: 64, tp: 4, topk: 64, page_size: 64, context: 256}
concurrency: [1, 4]
parameters:
  BLOCK_T: {type: categorical, choices: [16, 32]}
  num_warps: [4]
  num_stages: {type: int, low: 1, high: 2}
  TARGET_CTAS: [4]
constraints: ["BLOCK_T * num_stages <= 32"]
baseline: {BLOCK_T: 16, num_warps: 4, num_stages: 2, TARGET_CTAS: 4}
measurement: {rounds: 5, finalists: 2, finalist_rounds: 8, trial_timeout_s: 60}
sampler: {name: grid, seed: 0}
"""


@pytest.mark.parametrize(
    "path", ["search_spaces/v4_flash_tp4.yaml", "search_spaces/v32_tp8.yaml", "search_spaces/smoke.yaml"]
)
def test_shipped_spaces_load(path):
    sp = load_space(path)
    assert sp.baseline in sp.configs()
    assert sp.workloads[0].local_heads == 16


def test_v4_space_is_the_v4_flash_tp4_decode_layer():
    sp = load_space("search_spaces/v4_flash_tp4.yaml")
    w = sp.workloads[0]
    assert (w.kv_format, w.heads, w.tp, w.topk, w.page_size, w.context) == ("fp8_model1", 64, 4, 512, 64, 8192)
    graph_sizes = [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96]  # the engines' CUDA-graph batch sizes
    # BLOCK_T x num_warps x num_stages x TARGET_CTAS without the prefetch, and with each of its three kinds at
    # one stage; each of them with both deals (BALANCED 0 and 1)
    assert sp.concurrency == graph_sizes and len(sp.configs()) == (3 * 3 * 4 * 6 + 3 * 3 * 3 * 1 * 6) * 2
    assert str(sp.baseline) == "T16-w4-s2-c256"


def test_constraints_and_int_distributions():
    sp = load_space(_write(GOOD))
    assert sp.parameters["num_stages"] == [1, 2]
    assert [str(c) for c in sp.configs()] == ["T16-w4-s1-c4", "T16-w4-s2-c4", "T32-w4-s1-c4"]


BAD = [
    ("name: t\n", "`workloads`: is required"),
    (GOOD.replace("target: sm_120", "target: sm_121"), "`target`: must be one of"),
    (GOOD.replace("kv_format: fp8_model1", "kv_format: fp16"), "`workloads[0].kv_format`: must be one of"),
    (GOOD.replace("tp: 4", "tp: 3"), "`workloads[0].tp`: must divide heads (64), got 3"),
    (GOOD.replace("concurrency: [1, 4]", "concurrency: [1, -4]"), "`concurrency[1]`: must be an integer >= 1"),
    (GOOD.replace("num_warps: [4]", "num_warps: [3]"), "`parameters.num_warps`: num_warps must be a power of two"),
    (
        GOOD.replace("choices: [16, 32]", "choices: [8, 16]"),
        "`parameters.BLOCK_T`: BLOCK_T must be a power of two >= 16",
    ),
    (GOOD.replace("low: 1, high: 2", "low: 3, high: 2"), "`low <= high` must hold, but got (low=3, high=2)"),
    (GOOD.replace("TARGET_CTAS: [4]\n", "TARGET_CTAS: [4]\n  BLOCK_H: [16]\n"), "`parameters.BLOCK_H`: unknown key"),
    (GOOD.replace("sampler:", "samplr:"), "`samplr`: unknown key"),
    (GOOD.replace("TARGET_CTAS: 4}", "TARGET_CTAS: 8}"), "`baseline.TARGET_CTAS`: must be one of the space's choices"),
    (GOOD.replace('"BLOCK_T * num_stages <= 32"', '"__import__(1)"'), "`constraints[0]`: may use only"),
    (GOOD.replace('"BLOCK_T * num_stages <= 32"', '"BLOCK_N < 3"'), "unknown name 'BLOCK_N'"),
    (GOOD.replace("rounds: 5", "rounds: 2"), "`measurement.rounds`: must be >= 3"),
    (GOOD.replace("rounds: 5", "rounds: 5, screen_rounds: 6"), "`measurement.screen_rounds`: must be at most"),
    (GOOD.replace("rounds: 5", "rounds: 5, screen_rounds: 2"), "`measurement.screen_rounds`: must be an integer >= 3"),
    (GOOD.replace("name: grid", "name: random"), "`sampler.name`: must be one of ['grid', 'surrogate', 'tpe']"),
    (GOOD.replace("constraints: [", "constraints: [[").replace('32"]', '32"]]'), "`constraints[0]`"),
    ("workloads: [\n", "not valid YAML at line"),
    (GOOD.replace('"BLOCK_T * num_stages <= 32"', '"BLOCK_T > 64"'), "`baseline`: violates the constraints"),
]


def _write(text, tmp=[0]):  # noqa: B006 - a counter for unique names
    import tempfile

    f = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    f.write(text)
    f.close()
    return f.name


@pytest.mark.parametrize("text, message", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_malformed_space_names_file_key_and_allowed(text, message):
    path = _write(text)
    with pytest.raises(SpaceError) as e:
        load_space(path)
    assert str(e.value).startswith(path + ": ")
    assert message in str(e.value)


def test_cli_prints_one_sentence_and_exits_2(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(textwrap.dedent(GOOD).replace("tp: 4", "tp: 3"))
    proc = subprocess.run(
        [sys.executable, "-m", "sparse_mla_tuner.tuner", "check", str(path)], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: {path}: `workloads[0].tp`: must divide heads (64), got 3"]
