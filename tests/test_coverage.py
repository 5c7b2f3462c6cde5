"""Model presets (kernels/models.py, tuner/adapters/sparse_mla/presets.py), the coverage rule (kernels/coverage.py)
that the SGLang plugin and `tuner shapes` share, `tuner search --model`, `tuner export --engine`, and the shapes users
run served correctly (interpreter, against kernels/reference.py; a shape not served reaches the engine's function)."""

import json
import logging
import os
import shutil
import warnings

import pytest
import torch

import sparse_mla_tuner.kernels.decode as decode
from sparse_mla_tuner.kernels import sglang_plugin as plugin
from sparse_mla_tuner.kernels.config import KernelConfig
from sparse_mla_tuner.kernels.coverage import coverage
from sparse_mla_tuner.kernels.coverage import shape_problem
from sparse_mla_tuner.kernels.models import PRESETS
from sparse_mla_tuner.kernels.models import capture_sizes
from sparse_mla_tuner.kernels.models import get_preset
from sparse_mla_tuner.kernels.models import rows
from sparse_mla_tuner.kernels.models import tune_command
from sparse_mla_tuner.kernels.reference import sparse_mla_decode_ref
from sparse_mla_tuner.kernels.table import lookup_config
from sparse_mla_tuner.kernels.table import tables_dir
from sparse_mla_tuner.kernels.workload import Workload
from sparse_mla_tuner.kernels.workload import make_batch
from tests.conftest import tuner_in_process as tuner

H200_DB = os.path.join(os.path.dirname(__file__), "..", "results", "h200.db")
ENTRY = {"BLOCK_T": 32, "num_warps": 4, "num_stages": 1, "TARGET_CTAS": 8}


@pytest.fixture
def fresh_plugin(monkeypatch):
    for name in ("_ROUTES", "_CLASSES", "_SHAPES"):
        monkeypatch.setattr(plugin, name, {})
    monkeypatch.setattr(plugin, "_logged", set())


# --- presets ---------------------------------------------------------------------------------------------------


def test_presets_give_the_engines_calls():
    v4, v32, glm = get_preset("deepseek-v4-flash"), get_preset("DeepSeek-V3.2"), get_preset("glm-5")
    assert v4.shapes(4) == [("fp8_model1", 16, 128)] and (v4.extra_topk, v4.attn_sink) == (512, True)
    assert v32.shapes(8) == [("fp8_v32", 16, 2048)] and v32.shapes(16) == [("fp8_v32", 8, 2048)]
    assert glm.shapes(1) == [("fp8_v32", 64, 2048)]
    with pytest.raises(ValueError, match="allowed"):
        v4.heads_per_rank(3)
    # TP16 of a 64-head model is 4 local heads: no engine call of 4 heads is served, so no table of them is tuned
    with pytest.raises(
        ValueError,
        match=r"gives 4 local heads of deepseek-v4-flash's 64, which the kernel does not serve "
        r"\(allowed: \[1, 2, 4, 8\]\)",
    ):
        v4.heads_per_rank(16)
    with pytest.raises(ValueError, match="presets: deepseek-v4-flash"):
        get_preset("llama")
    # SGLang captures 12, vLLM does not; both capture 1, 2, 4, 8 and multiples of 8
    assert (
        12 in capture_sizes("sglang")
        and 12 not in capture_sizes("vllm")
        and capture_sizes(max_batch=8)
        == (
            1,
            2,
            4,
            8,
        )
    )
    assert rows([1, 2, 4], [1, 2]) == [1, 2, 4, 8]
    assert (
        tune_command("fp8_v32", 8, 2048) == "tuner search --model deepseek-v3.2 --tp 16 && tuner export --engine sglang"
    )
    assert "kv_format fp8_v32, heads 12" in tune_command("fp8_v32", 12, 2048, engine="vllm")
    # a call past the default batches: the search flags that reach it (a batch up to the capture size holding it)
    assert tune_command("fp8_v32", 16, 2048, batch=97, q_tokens=2) == (
        "tuner search --model deepseek-v3.2 --tp 8 --q-tokens 1,2 --max-batch 104 && tuner export --engine sglang"
    )
    assert tune_command("fp8_v32", 16, 2048, batch=96) == tune_command("fp8_v32", 16, 2048)


def test_preset_space_takes_the_shipped_spaces_sections():
    from sparse_mla_tuner.tuner.adapters.sparse_mla.presets import preset_space
    from sparse_mla_tuner.tuner.space import load_space

    space = preset_space("deepseek-v4-flash", 4, q_tokens=(1, 2))
    base = load_space("v4_flash_layer_tp4")
    (w,) = space.workloads
    assert (w.kv_format, w.local_heads, w.topk, w.extra, w.attn_sink) == (
        "fp8_model1",
        16,
        128,
        ("fp8_model1", 512, 64, 8192),
        True,
    )
    assert space.parameters == base.parameters and space.baseline == base.baseline
    assert space.measurement == base.measurement and space.constraints == base.constraints
    # rows B * s_q of both engines' sizes up to 96, with SGLang's sizes of speculative decoding for a verify step
    assert space.concurrency == rows(capture_sizes(speculative=True), (1, 2))
    assert {3, 10, 14, 44} <= set(space.concurrency) and 3 not in preset_space("glm-5", 4).concurrency
    assert max(space.concurrency) == 192 and 3 not in capture_sizes("vllm", speculative=True)
    assert preset_space("glm-5", 4).workloads[0].fields() == load_space("v32_tp8").workloads[0].fields() | {
        "name": "glm-5_tp4",
        "tp": 4,
    }


@pytest.mark.parametrize(
    ("model", "shipped", "shape", "extra"),
    [
        ("glm-5.3-flash", "glm53_nope_tp4", ("fp8_v32_nope", 16, 2176), None),
        ("deepseek-v4.1-flash", "v41_flash_layer_tp4", ("fp8_v41", 16, 128), ("fp4_v41", 512, 32, 8192)),
    ],
)
def test_the_new_formats_presets_give_their_shipped_spaces_call(model, shipped, shape, extra):
    """The presets of GLM-5.3 (no RoPE) and DeepSeek-V4.1 (fp8 window, fp4 compressed cache) at TP4 search exactly
    the call of the format's shipped space (its pages too), with its parameter and measurement sections."""
    from sparse_mla_tuner.tuner.adapters.sparse_mla.presets import preset_space
    from sparse_mla_tuner.tuner.space import load_space

    preset = get_preset(model)
    assert preset.shapes(4) == [shape] and preset.heads == 64 and "not a config.json fact" in preset.note
    space, base = preset_space(model, 4), load_space(shipped)
    (w,) = space.workloads
    assert (w.kv_format, w.local_heads, w.topk, w.extra) == (*shape, extra)
    assert w.fields() == base.workloads[0].fields() | {"name": f"{model.replace('.', '_')}_tp4"}
    assert space.parameters == base.parameters and space.baseline == base.baseline
    assert space.constraints == base.constraints and space.measurement == base.measurement
    assert tune_command(*shape) == f"tuner search --model {model} --tp 4 && tuner export --engine sglang"


def test_tuner_shapes_lists_the_new_formats_by_model_and_by_default():
    """`tuner shapes --model` of each new preset names its own format and shape; with no format named every main
    cache's format is listed; the extra-only fp4 cache is refused by name, a shape of it says why."""
    proc = tuner("shapes", "--model", "glm-5.3-flash", "--tp", "2", "-f", "json")
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)
    assert (row["kv_format"], row["heads"], row["topk"], row["served"]) == ("fp8_v32_nope", 32, 2176, True)
    proc = tuner("shapes", "--model", "deepseek-v4.1-flash", "--tp", "8", "-f", "json")
    (row,) = json.loads(proc.stdout)
    assert (row["kv_format"], row["heads"], row["topk"], row["served"]) == ("fp8_v41", 8, 128, True)
    proc = tuner("shapes", "--heads", "16", "--topk", "2048", "-f", "json")
    listed = {r["kv_format"]: r for r in json.loads(proc.stdout)}
    assert set(listed) == {"fp8_model1", "fp8_v32", "fp8_v32_nope", "fp8_v41"}
    assert all(r["served"] and r["origin"] == "default" for r in listed.values())  # the interpreter, no table
    proc = tuner("shapes", "--kv-format", "fp4_v41")
    assert proc.returncode == 2 and "fp4_v41" in proc.stderr and proc.stderr.strip().count("\n") == 0
    c = coverage("fp4_v41", 16, 512)
    assert not c.served and "extra cache only" in c.reason and "fp8_v41" in c.reason


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["search", "--model", "llama", "--tp", "4"], "not a model preset"),
        (["search", "--model", "glm-5", "--tp", "3"], "allowed"),
        (["search", "--model", "deepseek-v4-flash", "--tp", "16"], "4 local heads"),
        (["shapes", "--model", "glm-5", "--tp", "16"], "4 local heads"),
        (["search", "--model", "glm-5"], "needs --tp"),
        (["search"], "SPACE_FILE or --model"),
        (["search", "search_spaces/smoke.yaml", "--tp", "4"], "apply to --model"),
        (["search", "--model", "glm-5", "--tp", "4", "--q-tokens", "9"], "--q-tokens"),
        (["export", "--engine", "sglang", "--format", "triton"], "--engine sglang writes"),
        (["shapes", "--heads", "x"], "--heads"),
        (["shapes", "--model", "glm-5"], "together"),
    ],
)
def test_bad_input_is_one_sentence(args, words, tmp_path):
    proc = tuner(*args, "--db", f"sqlite:///{tmp_path / 't.db'}") if args[0] != "shapes" else tuner(*args)
    assert proc.returncode == 2, proc.stderr
    assert words in proc.stderr and proc.stderr.strip().count("\n") == 0


def test_model_search_by_replay_then_export_gives_tables_the_plugin_loads_without_warning(tmp_path, monkeypatch):
    """The done-when of issue 54 in small: two levels of the V4-Flash TP4 preset replayed from the H200 database,
    exported for SGLang to where its plugin reads, loaded with no warning; the level the database lacks (12, SGLang's
    capture size) is said, not invented."""
    from sparse_mla_tuner.db.store import Store

    monkeypatch.delenv("SPARSE_MLA_CONFIG_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    replay = tmp_path / "h200.db"
    shutil.copy(H200_DB, replay)
    Store(f"sqlite:///{replay}", upgrade=True)
    db = f"sqlite:///{tmp_path / 'tuner.db'}"
    args = ["--backend", "replay", "--replay-db", f"sqlite:///{replay}", "--db", db, "-q", "-f", "json"]
    proc = tuner("search", "--model", "deepseek-v4-flash", "--tp", "4", *args, "--concurrency", "1,16")
    assert proc.returncode == 0, proc.stderr
    assert "no samples of deepseek-v4-flash_tp4 at rows [12]: not measured" in proc.stderr
    assert {(r["workload"], r["C"]) for r in json.loads(proc.stdout)} == {
        ("deepseek-v4-flash_tp4", 1),
        ("deepseek-v4-flash_tp4", 16),
    }
    proc = tuner("export", "--engine", "sglang", "--db", db)
    assert proc.returncode == 0, proc.stderr
    written = [p for p in proc.stdout.split() if p.endswith(".json")]
    folder = tables_dir()
    assert folder == tmp_path / "data" / "sparse_mla_tuner" / "configs"
    assert all(str(p).startswith(str(folder)) for p in written) and len(written) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a TableWarning (missing, stale kernel, other Triton) fails here
        cfg = lookup_config("NVIDIA H200", "fp8_model1", 16, 128, 16)
        c = coverage("fp8_model1", 16, 128, device_name="NVIDIA H200")
    assert cfg == lookup_config("NVIDIA H200", "fp8_model1", 16, 128, 16, config_dir=folder / "triton_3_6_0")
    assert c.served and c.origin == "replayed" and c.max_rows == 16  # replay stands in for measuring: it says so
    # vLLM's layout goes to the same folder, flat
    proc = tuner("export", "--engine", "vllm", "--db", db)
    assert proc.returncode == 0 and all(os.path.dirname(p) == str(folder) for p in proc.stdout.split())


def test_model_search_by_replay_of_a_call_not_recorded_is_refused(tmp_path):
    replay = tmp_path / "h200.db"
    shutil.copy(H200_DB, replay)
    proc = tuner(
        "search", "--model", "deepseek-v4-flash", "--tp", "8", "--backend", "replay", "--replay-db",
        f"sqlite:///{replay}", "--db", f"sqlite:///{tmp_path / 't.db'}",
    )  # fmt: skip
    assert proc.returncode == 2 and "no recording of deepseek-v4-flash_tp8's call" in proc.stderr


# --- coverage: one rule for the plugin and `tuner shapes` ------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "word"),
    [(("fp8_model1", 12, 128, 1), "12 heads"), (("fp8_v32", 16, 2048, 9), "9 query tokens"), (("bf16", 16, 1, 1), "")],
)
def test_shape_problem_names_the_argument(shape, word):
    problem = shape_problem(*shape)
    assert problem and word in problem
    c = coverage(*shape[:3], q_tokens=shape[3], device_name="NVIDIA H200")
    assert not c.served and c.reason == problem and c.origin == "none"


def test_coverage_origins(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSE_MLA_CONFIG_DIR", str(tmp_path))

    def table(heads, topk, device="NVIDIA_H200", workload=None, backend="cuda"):
        name = f"kv_format=fp8_v32,heads={heads},topk={topk},device_name={device}"
        (tmp_path / f"{name}.json").write_text(json.dumps({"4": ENTRY}))
        if workload is not None:
            w = {"kv_format": "fp8_v32", "heads": workload[0], "topk": workload[1]}
            side = {"workload": w, "backend": backend, "entries": {"4": {"verdict": "ok"}}}
            (tmp_path / f"{name}.provenance.json").write_text(json.dumps(side))

    table(16, 2048, workload=(16, 2048))
    table(64, 2048, workload=(16, 2048))  # `tuner export --shape 64x2048` from the 16-head table
    table(32, 1024)  # no provenance
    got = {
        (h, k): (c.origin, c.tuned, c.tune is None)
        for h, k in [(16, 2048), (64, 2048), (32, 1024), (8, 512)]
        for c in [coverage("fp8_v32", h, k, device_name="NVIDIA H200")]
    }
    assert got == {
        (16, 2048): ("measured", (16, 2048), True),
        (64, 2048): ("nearest", (16, 2048), False),
        (32, 1024): ("unverified", (32, 1024), False),
        (8, 512): ("nearest", (16, 2048), False),  # 8 heads: the 16-head programs; top-k: the smallest above
    }
    nothing = coverage("fp8_model1", 16, 128, device_name="NVIDIA B300")
    assert not nothing.served and "no exported fp8_model1 table for NVIDIA B300" in nothing.reason
    assert nothing.tune.startswith("tuner search --model deepseek-v4-flash --tp 4")


def test_tuner_shapes_prints_what_the_plugin_decides(tmp_path, monkeypatch, fresh_plugin, caplog):
    monkeypatch.setenv("SPARSE_MLA_CONFIG_DIR", str(tmp_path))
    (tmp_path / "kv_format=fp8_v32,heads=16,topk=64,device_name=cpu-interpreter.json").write_text(
        json.dumps({"2": ENTRY})
    )
    proc = tuner("shapes", "--kv-format", "fp8_v32", "--heads", "8,12,16", "--topk", "64", "-f", "json")
    assert proc.returncode == 0, proc.stderr
    printed = {r["heads"]: r for r in json.loads(proc.stdout)}
    assert printed[12]["served"] is False and "12 heads" in printed[12]["reason"]
    assert printed[8]["origin"] == "nearest" and printed[8]["tuned"] == "16x64" and printed[8]["max_rows"] == 2
    for heads in (8, 12, 16):
        W = Workload("fp8_v32", heads, 64, page_size=64, context=64)
        bt = make_batch(W, 1, seed=heads)
        kw = plugin.v32_engine_call(bt.q, bt.kv_cache, bt.indices)
        with caplog.at_level(logging.INFO, logger=plugin.logger.name):
            caplog.clear()
            out = plugin.sglang_v32_hook(lambda **k: "original", **kw)
        msg = caplog.records[0].getMessage()
        if printed[heads]["served"]:
            assert isinstance(out, torch.Tensor) and f"heads={printed[heads]['tuned'].replace('x', ', topk=')}" in msg
        else:
            assert out == "original" and printed[heads]["reason"] in msg


# --- the shapes users run, served correctly (issue 54 item 5) --------------------------------------------------

# every head count, top-k 64/256/1152/2048, q_tokens 1..8 and page sizes 32/64/256 for each format, in few calls
# (DeepSeek-V4's compressed cache beside its window: tests/test_sglang_plugin.py, against SGLang's own reference)
USER_SHAPES = [
    ("fp8_model1", 8, 2048, 1, 256),
    ("fp8_model1", 16, 1152, 2, 32),
    ("fp8_model1", 32, 256, 3, 64),
    ("fp8_model1", 64, 64, 1, 256),
    ("fp8_model1", 128, 256, 1, 32),
    ("fp8_model1", 8, 64, 5, 64),
    ("fp8_model1", 16, 64, 8, 32),
    ("fp8_v32", 8, 1152, 1, 64),
    ("fp8_v32", 16, 2048, 1, 32),
    ("fp8_v32", 32, 64, 2, 256),
    ("fp8_v32", 64, 256, 1, 64),
    ("fp8_v32", 128, 64, 1, 256),
    ("fp8_v32", 8, 64, 4, 256),
    ("fp8_v32", 16, 64, 6, 64),
    ("fp8_v32", 8, 256, 7, 32),
    ("fp8_model1", 128, 2048, 8, 256),  # the widest: TP1 heads, top-k 2048, a verify step of 8, 256-token pages
    ("fp8_v32", 128, 2048, 8, 256),
    ("fp8_v32_nope", 8, 2048, 1, 64),
    ("fp8_v32_nope", 16, 1152, 3, 256),
    ("fp8_v32_nope", 64, 256, 8, 32),
    ("fp8_v32_nope", 128, 64, 1, 64),
    ("fp8_v32_nope", 32, 128, 2, 256),
]


@pytest.mark.parametrize(("kv_format", "heads", "topk", "q_tokens", "page_size"), USER_SHAPES)
def test_user_shapes_match_the_reference(kv_format, heads, topk, q_tokens, page_size, monkeypatch):
    monkeypatch.setattr(decode, "POISON_OUTPUTS", True)  # an output the kernel does not write fails
    assert coverage(kv_format, heads, topk, q_tokens=q_tokens).served
    W = Workload(kv_format, heads, topk, page_size=page_size, context=max(topk, page_size) + page_size)
    bt = make_batch(W, 1, seed=topk + heads, q_tokens=q_tokens, with_topk_length=True, invalid_fraction=0.1)
    # wide top-k with wide tiles (fewer interpreted iterations); the default config's 16-token tiles elsewhere
    cfg = KernelConfig(BLOCK_T=64, num_warps=4, num_stages=1, TARGET_CTAS=8) if topk > 1024 else None
    out, lse = decode.sparse_mla_decode(*bt.args(), **bt.kwargs(), config=cfg)
    ref, ref_lse = sparse_mla_decode_ref(*bt.args(), **bt.kwargs())
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, ref_lse, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize(
    ("heads", "q_tokens", "topk"), [(4, 1, 64), (12, 1, 64), (256, 1, 64), (16, 9, 64), (16, 1, 0)]
)
def test_a_shape_not_served_reaches_the_engines_function(heads, q_tokens, topk, fresh_plugin, monkeypatch):
    launched = []
    monkeypatch.setattr(decode, "LAUNCH_LISTENERS", [lambda *a: launched.append(a)])
    q = torch.zeros(2, q_tokens, heads, 512, dtype=torch.bfloat16)
    kw = {
        "q": q,
        "k_cache": plugin.engine_cache(torch.zeros(2, 64, 584, dtype=torch.uint8)),
        "head_dim_v": 512,
        "softmax_scale": 0.04,
        "indices": torch.zeros(2, q_tokens, topk, dtype=torch.int32),
    }
    assert plugin.sglang_hook(lambda **k: "engine", **kw) == "engine"
    v32 = plugin.v32_engine_call(
        torch.zeros(2 * q_tokens, heads, 576, dtype=torch.bfloat16),
        torch.zeros(2, 64, 656, dtype=torch.uint8),
        torch.zeros(2 * q_tokens, topk, dtype=torch.int32),
    )
    if q_tokens == 1:
        assert plugin.sglang_v32_hook(lambda **k: "engine", **v32) == "engine"
    assert launched == []


def test_a_kernel_failure_goes_back_to_the_engine_once_said(fresh_plugin, monkeypatch, caplog):
    def broken(*a, **k):
        raise RuntimeError("out of resources")

    monkeypatch.setattr(decode, "sparse_mla_decode", broken)
    W = Workload("fp8_v32", 16, 32, page_size=64, context=64)
    bt = make_batch(W, 1, seed=1)
    kw = plugin.v32_engine_call(bt.q, bt.kv_cache, bt.indices)
    with caplog.at_level(logging.WARNING, logger=plugin.logger.name):
        assert plugin.sglang_v32_hook(lambda **k: "engine", **kw) == "engine"
        assert plugin.sglang_v32_hook(lambda **k: "engine", **kw) == "engine"
    failed = [r for r in caplog.records if "out of resources" in r.getMessage()]
    assert len(failed) == 1 and failed[0].levelno == logging.WARNING


def test_every_preset_shape_at_every_tp_is_served():
    """Every TP size a preset takes gives calls the kernel serves; the others are refused with the allowed ones."""
    for preset in PRESETS.values():
        for tp in (1, 2, 4, 8, 16):
            if preset.heads % tp or preset.heads // tp < 8:
                with pytest.raises(ValueError, match="allowed"):
                    preset.shapes(tp)
                continue
            for kv, heads, topk in preset.shapes(tp):
                c = coverage(kv, heads, topk, q_tokens=2)
                assert c.served and c.tune == tune_command(kv, heads, topk), (preset.name, tp, c)
                assert c.tune.startswith("tuner search --model ")  # this preset, or one making the same call


@pytest.mark.parametrize(
    ("kv_format", "topk", "preset"), [("fp8_v32", 32, None), ("fp8_v32_nope", 2176, "glm-5.3-flash --tp 4")]
)
def test_a_shape_left_for_want_of_a_table_names_the_command_that_tunes_it(
    fresh_plugin, monkeypatch, caplog, kv_format, topk, preset
):
    monkeypatch.setattr(plugin, "device_name", lambda device: "NVIDIA B300")  # a GPU without any table
    W = Workload(kv_format, 16, topk, page_size=64, context=topk)
    bt = make_batch(W, 1, seed=1)
    kw = plugin.v32_engine_call(bt.q, bt.kv_cache, bt.indices)
    with caplog.at_level(logging.INFO, logger=plugin.logger.name):
        assert plugin.sglang_v32_hook(lambda **k: "engine", **kw) == "engine"
    (msg,) = [r.getMessage() for r in caplog.records if "leaves" in r.getMessage()]
    c = coverage(kv_format, 16, topk, device_name="NVIDIA B300")
    assert c.reason in msg and f"(to tune it: {c.tune})" in msg and "tuner export --engine sglang" in msg
    assert f"no exported {kv_format} table" in msg and (preset is None or f"--model {preset}" in msg)


def test_a_batch_past_the_table_names_the_command_for_larger_batches(tmp_path, monkeypatch, fresh_plugin, caplog):
    monkeypatch.setenv("SPARSE_MLA_CONFIG_DIR", str(tmp_path))
    (tmp_path / "kv_format=fp8_v32,heads=16,topk=2048,device_name=cpu-interpreter.json").write_text(
        json.dumps({"1": ENTRY})
    )
    W = Workload("fp8_v32", 16, 2048, page_size=64, context=2048)
    bt = make_batch(W, 2, seed=1)
    with caplog.at_level(logging.INFO, logger=plugin.logger.name):
        out = plugin.sglang_v32_hook(lambda **k: "engine", **plugin.v32_engine_call(bt.q, bt.kv_cache, bt.indices))
    (msg,) = [r.getMessage() for r in caplog.records if "leaves" in r.getMessage()]
    assert out == "engine" and "T above the largest batch (1)" in msg
    assert "(to tune larger batches: tuner search --model deepseek-v3.2 --tp 8 && tuner export --engine sglang)" in msg


def test_a_verify_step_past_the_table_names_the_query_tokens_to_tune(tmp_path, monkeypatch, fresh_plugin, caplog):
    """A DeepSeek-V4 verify step of 8 query tokens at 16 requests is 128 rows, past a table of 96: the command the
    log names tunes those query tokens (and pasted, it parses)."""
    monkeypatch.setenv("SPARSE_MLA_CONFIG_DIR", str(tmp_path))
    name = "kv_format=fp8_model1,heads=16,topk=128,device_name=cpu-interpreter.json"
    (tmp_path / name).write_text(json.dumps({"96": ENTRY}))
    kw = {
        "q": torch.zeros(16, 8, 16, 512, dtype=torch.bfloat16),
        "k_cache": plugin.engine_cache(torch.zeros(2, 64, 584, dtype=torch.uint8)),
        "head_dim_v": 512,
        "softmax_scale": 0.04,
        "indices": torch.full((16, 8, 128), -1, dtype=torch.int32),
    }
    with caplog.at_level(logging.INFO, logger=plugin.logger.name):
        assert plugin.sglang_hook(lambda **k: "engine", **kw) == "engine"
    (msg,) = [r.getMessage() for r in caplog.records if "leaves" in r.getMessage()]
    command = "tuner search --model deepseek-v4-flash --tp 4 --q-tokens 1,8 && tuner export --engine sglang"
    assert "B * s_q above the largest batch (96)" in msg and f"(to tune larger batches: {command})" in msg
    search = command.split(" && ")[0].split()[1:]
    assert tuner(*search, "--help").returncode == 0
