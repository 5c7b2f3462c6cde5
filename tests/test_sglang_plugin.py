"""The SGLang plugin (kernels/sglang_plugin.py) against SGLang 0.5.23 itself, on CPU under Triton's interpreter.

SGLang is not a dependency: CI installs it (``--no-deps``, with the small packages its plugin loader and
``flash_mla_sm120`` import) in a side folder on ``PYTHONPATH`` (``.ci/run``). Without it the tests that need it
are skipped; the shape rule and the padded-page kernel path are tested either way.
"""

import importlib.util
import json
import logging
from importlib.metadata import entry_points

import pytest
import torch

import sparse_mla_tuner.kernels.decode as decode
from sparse_mla_tuner.kernels import sglang_plugin as plugin
from sparse_mla_tuner.kernels.config import KernelConfig
from sparse_mla_tuner.kernels.reference import sparse_mla_decode_ref
from sparse_mla_tuner.kernels.table import fit_config
from sparse_mla_tuner.kernels.table import nearest_shape
from sparse_mla_tuner.kernels.table import tuned_shapes
from sparse_mla_tuner.kernels.workload import Workload
from sparse_mla_tuner.kernels.workload import make_batch

HAS_SGLANG = importlib.util.find_spec("sglang") is not None
needs_sglang = pytest.mark.skipif(not HAS_SGLANG, reason="SGLang is not importable (.ci/run installs it aside)")
SCALE = 512**-0.5


@pytest.fixture
def sglang_env(monkeypatch):
    """SGLang's plugin loader and the module of the hooked call, reset before and restored after the test."""
    from sglang.kernels.ops.attention import flash_mla_sm120 as mod
    from sglang.srt import plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    original = mod.flash_mla_with_kvcache_sm120
    monkeypatch.setattr(mod, "flash_mla_with_kvcache_sm120", original)  # restored at teardown
    monkeypatch.setattr(mod, "_sm120_default_backend", "torch")  # the original's CPU path: SGLang's torch reference
    monkeypatch.setattr(plugins, "_plugins_loaded", False)
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    monkeypatch.delenv(plugin.ENV_SWITCH, raising=False)
    HookRegistry.reset()
    yield mod, plugins, HookRegistry, original
    HookRegistry.reset()


@pytest.fixture
def launches(monkeypatch):
    """The kernel launches of the test, and what the kernel was handed as caches."""
    seen = {"launches": [], "caches": []}
    monkeypatch.setattr(decode, "LAUNCH_LISTENERS", [lambda name, cfg, grid: seen["launches"].append(name)])
    real = decode.sparse_mla_decode

    def spy(q, kv_cache, indices, **kw):
        seen["caches"] += [kv_cache, kw.get("extra_kv_cache")]
        return real(q, kv_cache, indices, **kw)

    monkeypatch.setattr(decode, "sparse_mla_decode", spy)
    return seen


def engine_call(
    heads=16,
    q_tokens=2,
    batch=2,
    topk=64,
    extra_topk=64,
    seed=1,
    dtype=torch.float8_e4m3fn,
    pages=(256, 64),
    extra_context=256,
):
    """SGLang's keyword arguments of one DeepSeek-V4 decode call: a window cache of 256-token pages and a
    compressed cache of 64-token pages (``pages``), both padded as SGLang allocates them, -1 indices, ragged
    lengths, a sink."""
    window = Workload("fp8_model1", heads, topk, page_size=pages[0], context=256)
    compressed = Workload("fp8_model1", heads, extra_topk, page_size=pages[1], context=extra_context)
    bt = make_batch(
        window, batch, seed=seed, q_tokens=q_tokens, extra=compressed, with_sink=True, with_topk_length=True,
        invalid_fraction=0.2,
    )  # fmt: skip
    kw = {
        "q": bt.q,
        "k_cache": plugin.engine_cache(bt.kv_cache, dtype),
        "head_dim_v": 512,
        "softmax_scale": SCALE,
        "indices": bt.indices,
        "topk_length": bt.topk_length,
        "attn_sink": bt.attn_sink,
        "extra_k_cache": plugin.engine_cache(bt.extra_kv_cache, dtype),
        "extra_indices_in_kvcache": bt.extra_indices,
        "extra_topk_length": bt.extra_topk_length,
    }
    return kw, bt


def sglang_reference(mod, kw):
    return mod._sm120_sparse_decode_fwd(
        kw["q"], kw["k_cache"], kw["indices"], kw["topk_length"], kw["attn_sink"], kw["head_dim_v"],
        kw["softmax_scale"], kw["extra_k_cache"], kw["extra_indices_in_kvcache"], kw["extra_topk_length"],
    )  # fmt: skip


# --- with SGLang ---------------------------------------------------------------------------------------


@needs_sglang
def test_load_plugins_discovers_the_entry_point_and_the_registry_applies_it(sglang_env):
    mod, plugins, registry, original = sglang_env
    names = {ep.name: ep.value for ep in entry_points(group=plugins.GENERAL_PLUGINS_GROUP)}
    assert names.get(plugin.PLUGIN_NAME) == "sparse_mla_tuner.kernels.sglang_plugin:register", (
        "the package's entry point is not installed (pip install -e . after changing pyproject.toml)"
    )
    plugins.load_plugins()
    wrapped = mod.flash_mla_with_kvcache_sm120
    assert wrapped is not original and wrapped.__wrapped__ is original
    assert [(t, h) for t, h, _ in registry._hooks[plugin.TARGET]] == [(plugin_hook_type(), plugin.sglang_hook)]
    assert plugin.TARGET in registry._patched


def plugin_hook_type():
    from sglang.srt.plugins.hook_registry import HookType

    return HookType.AROUND


@needs_sglang
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.uint8])
def test_engine_call_matches_sglang_reference_reading_the_cache_in_place(sglang_env, launches, dtype):
    mod, plugins, _, _ = sglang_env
    plugins.load_plugins()
    kw, bt = engine_call(dtype=dtype)
    kw["indices"][0, 1, :] = -1  # a query token of the window cache with no valid index
    out, lse = mod.flash_mla_with_kvcache_sm120(**kw)
    assert launches["launches"], "the kernel did not serve a covered call"
    ref_out, _ = sglang_reference(mod, kw)
    assert out.shape == ref_out.shape == (2, 2, 16, 512) and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref_out.float(), atol=2e-2, rtol=2e-2)
    # our own fp32 reference on the contiguous caches agrees too, lse included
    ours_ref, ours_lse = sparse_mla_decode_ref(*bt.args(), **bt.kwargs(), sm_scale=SCALE)
    torch.testing.assert_close(out.float(), ours_ref.float(), atol=2e-2, rtol=2e-2)
    assert lse.shape == (2, 16, 2)
    # no copy: the kernel got views of SGLang's buffers, with their padded page strides
    main, extra = launches["caches"][:2]
    assert main.data_ptr() == kw["k_cache"].data_ptr() and main.stride(0) == plugin.page_bytes(256) == 149760
    assert extra.data_ptr() == kw["extra_k_cache"].data_ptr() and extra.stride(0) == plugin.page_bytes(64) == 37440


@needs_sglang
def test_deepseek_v41_on_sm120_is_the_v4_call_and_is_served(sglang_env, launches):
    """SGLang 0.5.23 has no V4.1-format call on sm_120: ``select_dsv4_kv_layout`` keeps V4's 584-byte record off
    SM100, and ``deepseek_v4_backend`` decodes every V4-family model (V4.1 too) there through
    ``flash_mla_with_kvcache_sm120``. A V4.1-shaped call (64 heads at TP1, the window on the 64-token pages of
    ``SGLANG_OPT_SM120_DIRECT_SWA_KV``, a ratio-1 compressed cache on 128-token pages) is served and matches SGLang's
    own torch reference (``srt/mem_cache/deepseek_v4_memory_pool.py`` does not import on a CPU, so the layout rule is
    read from its source, not run)."""
    mod, plugins, _, _ = sglang_env
    plugins.load_plugins()
    kw, _ = engine_call(heads=64, q_tokens=1, batch=2, topk=64, extra_topk=128, pages=(64, 128))
    out, _ = mod.flash_mla_with_kvcache_sm120(**kw)
    assert launches["launches"], "the kernel did not serve a covered call"
    ref_out, _ = sglang_reference(mod, kw)
    torch.testing.assert_close(out.float(), ref_out.float(), atol=2e-2, rtol=2e-2)


# the shapes users run, on SGLang's call: every head count, the compressed cache's top-k from 64 to 2048 (256 and 1152
# included; the window's is 128 as DeepSeek-V4's), 1 to 8 query tokens, pages of 32, 64 and 256 tokens; small batches,
# ragged lengths and -1 indices, so that the interpreter stays quick
V4_USER_CALLS = [
    # heads, q_tokens, extra_topk, (window page, compressed page)
    (8, 1, 64, (256, 64)),
    (16, 8, 256, (64, 32)),
    (32, 3, 1152, (256, 64)),
    (64, 1, 2048, (32, 256)),
    (128, 2, 512, (256, 64)),
    (16, 5, 1024, (256, 32)),
]


@needs_sglang
@pytest.mark.parametrize(
    ("heads", "q_tokens", "extra_topk", "pages"),
    V4_USER_CALLS,
    ids=[f"H{h}-s{s}-extra{k}-pages{p[0]}+{p[1]}" for h, s, k, p in V4_USER_CALLS],
)
def test_users_shapes_match_sglangs_reference(sglang_env, launches, heads, q_tokens, extra_topk, pages):
    mod, plugins, _, _ = sglang_env
    plugins.load_plugins()
    kw, _ = engine_call(
        heads=heads, q_tokens=q_tokens, batch=1, topk=128, extra_topk=extra_topk, pages=pages,
        extra_context=extra_topk + 100, seed=heads + extra_topk,
    )  # fmt: skip
    out, _ = mod.flash_mla_with_kvcache_sm120(**kw)
    assert launches["launches"], "the kernel did not serve a covered call"
    ref_out, _ = sglang_reference(mod, kw)
    assert out.shape == ref_out.shape == (1, q_tokens, heads, 512)
    torch.testing.assert_close(out.float(), ref_out.float(), atol=2e-2, rtol=2e-2)


@needs_sglang
@pytest.mark.parametrize(
    "change",
    [
        {"heads": 12},  # a head count engines do not use
        {"q_tokens": 9},  # more query tokens than a verify step
        {"head_dim_v": 448},
        {"k_cache_bytes": 656},  # another cache layout
    ],
    ids=lambda c: next(iter(c)),
)
def test_uncovered_call_reaches_the_original(sglang_env, launches, change, caplog):
    mod, plugins, _, _ = sglang_env
    plugins.load_plugins()
    kw, _ = engine_call(heads=change.get("heads", 16), q_tokens=change.get("q_tokens", 1), batch=1)
    if "head_dim_v" in change:
        kw["head_dim_v"] = change["head_dim_v"]
    if "k_cache_bytes" in change:
        kw["k_cache"] = torch.zeros(2, 64, 1, 656, dtype=torch.uint8)
    seen = []

    def original(**kwargs):
        seen.append(kwargs)
        return ("original", None)

    with caplog.at_level(logging.INFO, logger=plugin.logger.name):
        for _ in range(2):
            assert plugin.sglang_hook(original, **kw) == ("original", None)
    assert len(seen) == 2 and all(s.keys() == kw.keys() and all(s[k] is kw[k] for k in kw) for s in seen)
    assert launches["launches"] == []
    left = [r for r in caplog.records if "leaves" in r.getMessage()]
    assert len(left) == 1, "the plugin says once which shape it leaves"


@needs_sglang
def test_uncovered_call_through_sglang_gives_sglangs_own_result(sglang_env, launches):
    mod, plugins, _, original = sglang_env
    plugins.load_plugins()
    kw, _ = engine_call(heads=12, q_tokens=1, batch=1)
    out = mod.flash_mla_with_kvcache_sm120(**kw)[0]
    assert launches["launches"] == []
    assert torch.equal(out, original(**kw)[0])


@needs_sglang
@pytest.mark.parametrize("value", ["0", "off"])
def test_switched_off_changes_nothing(sglang_env, launches, monkeypatch, value):
    mod, plugins, registry, original = sglang_env
    monkeypatch.setenv(plugin.ENV_SWITCH, value)
    plugins.load_plugins()
    assert mod.flash_mla_with_kvcache_sm120 is original and not registry._hooks.get(plugin.TARGET)
    kw, _ = engine_call(batch=1, q_tokens=1)
    out = mod.flash_mla_with_kvcache_sm120(**kw)[0]
    assert torch.equal(out, sglang_reference(mod, kw)[0])
    # installed, then switched off: the hook hands every call to the original
    calls = []
    assert plugin.sglang_hook(lambda **k: calls.append(k) or "original", **kw) == "original"
    assert calls and launches["launches"] == []


@needs_sglang
def test_allow_list_without_the_plugin_loads_nothing(sglang_env, monkeypatch):
    mod, plugins, _, original = sglang_env
    monkeypatch.setenv("SGLANG_PLUGINS", "some_other_plugin")
    plugins.load_plugins()
    assert mod.flash_mla_with_kvcache_sm120 is original


# --- without SGLang: the hook alone, the shape rule, the padded pages ----------------------------------


def test_hook_serves_without_sglang_installed(launches):
    kw, bt = engine_call(heads=8, q_tokens=1, batch=2, topk=32, extra_topk=64)
    out, _ = plugin.sglang_hook(lambda **k: pytest.fail("the original was called"), **kw)
    ref, _ = sparse_mla_decode_ref(*bt.args(), **bt.kwargs(), sm_scale=SCALE)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
    assert launches["launches"]


def test_positional_arguments_go_to_the_original():
    assert plugin.sglang_hook(lambda *a, **k: ("original", a), 1, 2) == ("original", (1, 2))


def test_a_bad_switch_value_turns_the_plugin_off_with_one_warning(monkeypatch, caplog):
    monkeypatch.setenv(plugin.ENV_SWITCH, "maybe")
    with caplog.at_level(logging.WARNING, logger=plugin.logger.name):
        assert not plugin.enabled() and not plugin.enabled()
    msgs = [r.getMessage() for r in caplog.records if plugin.ENV_SWITCH in r.getMessage()]
    assert len(msgs) == 1 and "\n" not in msgs[0]


def test_padded_pages_give_the_contiguous_result():
    W = Workload("fp8_model1", 16, 48, page_size=64, context=192)
    bt = make_batch(W, 2, seed=3, with_topk_length=True, invalid_fraction=0.1)
    padded = plugin.engine_cache(bt.kv_cache, torch.uint8).squeeze(2)
    assert not padded.is_contiguous() and padded.stride(0) == 37440
    a = decode.sparse_mla_decode(bt.q, bt.kv_cache, bt.indices, kv_format="fp8_model1", topk_length=bt.topk_length)
    b = decode.sparse_mla_decode(bt.q, padded, bt.indices, kv_format="fp8_model1", topk_length=bt.topk_length)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_a_page_stride_too_small_is_one_sentence():
    buf = torch.zeros(2 * 64 * 584, dtype=torch.uint8)
    bad = buf.as_strided((2, 64, 584), (64 * 584 - 8, 584, 1))
    q = torch.zeros(1, 16, 512, dtype=torch.bfloat16)
    idx = torch.zeros(1, 16, dtype=torch.int32)
    with pytest.raises(ValueError, match="page stride") as e:
        decode.sparse_mla_decode(q, bad, idx, kv_format="fp8_model1")
    assert "\n" not in str(e.value)


SHAPES = [(16, 128), (16, 512), (64, 512), (128, 2048)]


@pytest.mark.parametrize(
    ("heads", "topk", "want"),
    [
        (16, 512, (16, 512)),  # tuned: itself
        (16, 256, (16, 128)),  # top-k rounds down
        (16, 64, (16, 128)),  # nothing below: the smallest above
        (8, 1152, (16, 512)),  # 8 heads: 16-head programs; top-k down
        (32, 512, (64, 512)),  # 32 heads: the nearest of the 32-head programs
        (64, 1152, (64, 512)),
        (128, 4096, (128, 2048)),
    ],
)
def test_nearest_shape_rule(heads, topk, want):
    assert nearest_shape(SHAPES, heads, topk) == want
    assert nearest_shape([], heads, topk) is None


def test_nearest_shape_with_only_smaller_programs_takes_the_largest():
    assert nearest_shape([(8, 128), (16, 512)], 64, 512) == (16, 512)


@pytest.mark.parametrize("topk", [1, 16, 17, 64, 100, 128, 512])
def test_fit_config_keeps_the_tile_within_the_width(topk):
    cfg = KernelConfig(BLOCK_T=128, num_warps=8, num_stages=1, TARGET_CTAS=512)
    fitted = fit_config(cfg, topk)
    assert fitted.BLOCK_T <= max(16, topk * 2) and fitted.BLOCK_T <= cfg.BLOCK_T
    assert fitted.replace(BLOCK_T=cfg.BLOCK_T) == cfg  # only the tile changes
    assert fit_config(fitted, topk) == fitted


def test_tuned_shapes_reads_the_names_of_this_devices_tables(tmp_path, monkeypatch):
    entry = {"BLOCK_T": 32, "num_warps": 4, "num_stages": 1, "TARGET_CTAS": 256}
    sub = tmp_path / "triton_3_6_0"
    sub.mkdir()
    for folder, name in [
        (tmp_path, "kv_format=fp8_model1,heads=8,topk=128,device_name=NVIDIA_H200.json"),
        (sub, "kv_format=fp8_model1,heads=64,topk=512,device_name=NVIDIA_H200.json"),
        (tmp_path, "kv_format=fp8_v32,heads=16,topk=2048,device_name=NVIDIA_H200.json"),
        (tmp_path, "kv_format=fp8_model1,heads=32,topk=512,device_name=NVIDIA_B200.json"),
    ]:
        (folder / name).write_text(json.dumps({"1": entry}))
    monkeypatch.setenv("SPARSE_MLA_CONFIG_DIR", str(tmp_path))
    shapes = tuned_shapes("NVIDIA H200", "fp8_model1")
    assert {(8, 128), (64, 512)} <= set(shapes)
    assert (16, 2048) not in shapes and (32, 512) not in shapes
    assert tuned_shapes("NVIDIA H200", "fp8_model1", config_dir=tmp_path) == [(8, 128), (64, 512)]
    assert plugin.largest_batch("NVIDIA H200", 8, 128) == 1


def test_export_writes_the_tables_of_named_shapes(tmp_path):
    import os
    import shutil

    from sparse_mla_tuner.db.store import Store
    from tests.conftest import tuner_in_process as tuner

    db = tmp_path / "h200.db"
    shutil.copy(os.path.join(os.path.dirname(__file__), "..", "results", "h200.db"), db)
    url = f"sqlite:///{db}"
    Store(url, upgrade=True)
    everything, named = tmp_path / "all", tmp_path / "named"
    assert tuner("export", "--db", url, "--out", str(everything)).returncode == 0
    proc = tuner(
        "export", "--db", url, "--out", str(named), "--shape", "16x512", "--shape", "8x128", "--shape", "64X1152"
    )
    assert proc.returncode == 0, proc.stderr

    def name(kv, heads, topk):
        return f"kv_format={kv},heads={heads},topk={topk},device_name=NVIDIA_H200.json"

    tuned = {(int(p.name.split(",")[1][6:]), int(p.name.split(",")[2][5:])) for p in everything.glob("*fp8_model1*")}
    for heads, topk in [(16, 512), (8, 128), (64, 1152)]:
        src = nearest_shape(tuned, heads, topk)
        got = json.loads((named / name("fp8_model1", heads, topk)).read_text())
        assert got == json.loads((everything / name("fp8_model1", *src)).read_text())
        prov = json.loads((named / name("fp8_model1", heads, topk).replace(".json", ".provenance.json")).read_text())
        assert prov["workload"] == {"kv_format": "fp8_model1", "heads": src[0], "topk": src[1]}  # what was measured
    assert not (named / name("fp8_model1", 16, 128)).exists()  # only the named shapes
    bad = tuner("export", "--db", url, "--out", str(tmp_path / "bad"), "--shape", "sixteen")
    assert bad.returncode == 2 and "HEADSxTOPK" in bad.stderr and bad.stderr.strip().count("\n") == 0


def test_warm_up_launches_every_row_count_asked(launches):
    done = plugin.warm_up(heads=16, topk=16, extra_topk=64, q_tokens=2, batch_sizes=[1, 3], device="cpu")
    assert [rows for rows, _ in done] == [2, 6]
    assert all(isinstance(cfg, KernelConfig) for _, cfg in done)
    assert len(launches["launches"]) >= 2
    # the caches it warms on are SGLang's padded layout
    assert all(c is None or c.stride(0) in (plugin.page_bytes(256), plugin.page_bytes(64)) for c in launches["caches"])


@pytest.fixture
def fresh_plugin(monkeypatch):
    """The plugin's per-shape decisions forgotten (they are cached for the process)."""
    for name in ("_ROUTES", "_CLASSES", "_SHAPES"):
        monkeypatch.setattr(plugin, name, {})
    monkeypatch.setattr(plugin, "_logged", set())


def test_a_covered_shape_runs_the_nearest_tables_config_and_larger_batches_go_back(
    tmp_path, monkeypatch, fresh_plugin, caplog
):
    tuned = {"1": {"BLOCK_T": 128, "num_warps": 4, "num_stages": 1, "TARGET_CTAS": 3}}
    tuned["4"] = {"BLOCK_T": 16, "num_warps": 2, "num_stages": 1, "TARGET_CTAS": 5}
    table = tmp_path / "kv_format=fp8_model1,heads=16,topk=512,device_name=cpu-interpreter.json"
    table.write_text(json.dumps(tuned))
    monkeypatch.setenv("SPARSE_MLA_CONFIG_DIR", str(tmp_path))
    used = []
    monkeypatch.setattr(decode, "LAUNCH_LISTENERS", [lambda name, cfg, grid: used.append((name, cfg))])
    kw, bt = engine_call(heads=8, q_tokens=1, batch=2, topk=64, extra_topk=64)  # no table of its own
    with caplog.at_level(logging.INFO, logger=plugin.logger.name):
        out, _ = plugin.sglang_hook(lambda **k: pytest.fail("the original was called"), **kw)
    want = fit_config(KernelConfig.from_dict(tuned["1"]), 64)  # nearest batch key to 2; tile fitted to 64 tokens
    assert want.BLOCK_T == 64 and {cfg for _, cfg in used} == {want}
    ref, _ = sparse_mla_decode_ref(*bt.args(), **bt.kwargs(), sm_scale=SCALE)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
    assert any("heads=16, topk=512" in r.getMessage() for r in caplog.records)
    used.clear()
    big, _ = engine_call(heads=8, q_tokens=1, batch=5, topk=64, extra_topk=64)  # 5 rows: past the table's 4
    assert plugin.sglang_hook(lambda **k: "original", **big) == "original" and not used


def test_warm_up_compiles_every_config_the_table_can_pick(tmp_path, monkeypatch, fresh_plugin):
    tuned = {
        "1": {"BLOCK_T": 16, "num_warps": 4, "num_stages": 1, "TARGET_CTAS": 2},
        "4": {"BLOCK_T": 32, "num_warps": 2, "num_stages": 1, "TARGET_CTAS": 8},
    }
    name = "kv_format=fp8_model1,heads=16,topk=32,device_name=cpu-interpreter.json"
    (tmp_path / name).write_text(json.dumps(tuned))
    monkeypatch.setenv("SPARSE_MLA_CONFIG_DIR", str(tmp_path))
    used = set()
    monkeypatch.setattr(decode, "LAUNCH_LISTENERS", [lambda n, cfg, grid: used.add(cfg)])
    done = plugin.warm_up(heads=16, topk=32, extra_topk=64, q_tokens=2, device="cpu")  # every batch the table serves
    assert [rows for rows, _ in done] == [2, 4]  # B = 1, 2 with 2 query tokens; B = 3 is past the table's 4 rows
    assert {cfg for _, cfg in done} == {KernelConfig.from_dict(e) for e in tuned.values()} == used


# --- DeepSeek-V3.2 / GLM: SGLang's DSA decode on sm_120 (flashinfer_sparse_mla_forward) ---------------------


def v32_call(heads=16, tokens=3, topk=64, pages=2, seed=5, nope=False):
    """SGLang's exact keyword arguments of ``_forward_flashinfer_sparse_mla``'s call, on a cache SGLang's own
    quantizer wrote and passed as its pool buffer ``[tokens, 1, kv_cache_dim]``: ``quantize_k_cache`` (512 e4m3, 4
    fp32 scales, 64 bf16 RoPE per token: 656 bytes), or with ``nope`` a model without RoPE (GLM-5.3:
    ``qk_rope_head_dim`` 0, ``quantize_k_cache_separate`` with no rope part, 528 bytes, q of 512 dims); -1-padded
    token indices and ``seq_lens`` (SGLang's ``dsa_cache_seqlens``, clamped to the top-k) shorter than the top-k for
    one row."""
    from sglang.kernels.ops.quantization.dsa_quant_k_cache import quantize_k_cache
    from sglang.kernels.ops.quantization.dsa_quant_k_cache import quantize_k_cache_separate

    g = torch.Generator().manual_seed(seed)
    n = pages * 64
    width, kv_cache_dim = (512, 528) if nope else (576, 656)
    k = (torch.randn(pages, 64, 1, width, generator=g) * 0.5).bfloat16()
    if nope:
        rows, _ = quantize_k_cache_separate(k.view(n, 512), None)  # [n, 1, 528]
        cache = rows.view(torch.uint8).view(torch.float8_e4m3fn).view(pages, 64, 1, 528)
    else:
        cache = quantize_k_cache(k)  # [pages, 64, 1, 656] float8_e4m3fn
    q = (torch.randn(tokens, heads, width, generator=g) * 0.5).bfloat16()
    indices = torch.stack([torch.randperm(n, generator=g)[:topk] for _ in range(tokens)]).to(torch.int32)
    seq_lens = torch.full((tokens,), topk, dtype=torch.int32)
    seq_lens[0] = topk // 2
    indices[0, topk // 2 :] = -1  # SGLang pads the page table with -1 past a short context
    indices[-1, 3] = -1
    kw = {
        "q": q,
        "kv_cache": cache.view(-1, 1, kv_cache_dim),
        "indices": indices,
        "seq_lens": seq_lens,
        "workspace_buffer": torch.empty(16, dtype=torch.uint8),
        "page_size": 64,
        "kv_cache_dim": kv_cache_dim,
        "qk_nope_head_dim": 256 if nope else 192,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 0 if nope else 64,
        "sm_scale": 0.1352,
        "skip_softmax_threshold_scale_factor": None,
    }
    return kw, cache


def v32_sglang_reference(kw, cache):
    """Sparse attention over the keys SGLang's own dequantizer (``dequantize_k_cache``, either row width) reads from
    the cache: for each row, the first ``seq_lens`` indices that are not -1; V is the first 512 dims of K (absorbed
    MLA)."""
    from sglang.kernels.ops.attention.dsa.dequant_k_cache import dequantize_k_cache

    keys = dequantize_k_cache(cache).float().reshape(-1, kw["q"].shape[-1])
    q = kw["q"].float()
    out = torch.zeros(q.shape[0], q.shape[1], 512)
    for t in range(q.shape[0]):
        idx = kw["indices"][t, : int(kw["seq_lens"][t])].long()
        kt = keys[idx[idx >= 0]]
        p = torch.softmax(q[t] @ kt.T * kw["sm_scale"], dim=-1)
        out[t] = p @ kt[:, :512]
    return out


@pytest.fixture
def v32_hooked(sglang_env, fresh_plugin):
    mod, plugins, registry, _ = sglang_env
    original = mod.flashinfer_sparse_mla_forward
    plugins.load_plugins()
    yield mod, original
    mod.flashinfer_sparse_mla_forward = original  # HookRegistry.reset() does not restore a patched attribute


@needs_sglang
@pytest.mark.parametrize("nope", [False, True], ids=["v32-656B", "v32-no-rope-528B"])
def test_v32_call_through_sglang_matches_its_reference_and_runs_our_kernel(v32_hooked, launches, nope):
    mod, original = v32_hooked
    wrapped = mod.flashinfer_sparse_mla_forward
    assert wrapped is not original and wrapped.__wrapped__ is original
    kw, cache = v32_call(nope=nope)
    out = mod.flashinfer_sparse_mla_forward(**kw)
    assert launches["launches"], "the kernel did not serve a covered call"
    assert out.shape == (3, 16, 512) and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), v32_sglang_reference(kw, cache), atol=2e-2, rtol=2e-2)
    # the kernel read SGLang's pool buffer in place
    assert launches["caches"][0].data_ptr() == kw["kv_cache"].data_ptr()


@needs_sglang
@pytest.mark.parametrize(
    "change",
    [
        {"heads": 12},
        {"nope_heads": 12},  # V32_NO_ROPE, a head count the kernel does not run
        {"kv_cache_dim": 528},  # 528 bytes with a RoPE part: neither V32 nor V32_NO_ROPE
        {"skip_softmax_threshold_scale_factor": 0.5},
        {"extra": 1},
    ],
    ids=lambda c: next(iter(c)),
)
def test_v32_uncovered_call_reaches_the_original_unchanged(v32_hooked, launches, change, caplog):
    kw, _ = v32_call(heads=change.get("heads", change.get("nope_heads", 16)), tokens=1, nope="nope_heads" in change)
    if "kv_cache_dim" in change:
        kw.update(q=kw["q"][..., :512].contiguous(), kv_cache=torch.zeros(128, 1, 528, dtype=torch.uint8))
        kw.update(kv_cache_dim=528)
    if "skip_softmax_threshold_scale_factor" in change:
        kw["skip_softmax_threshold_scale_factor"] = 0.5
    if "extra" in change:
        kw["enable_pdl"] = True  # an argument a later SGLang may add
    seen = []

    def original(**kwargs):
        seen.append(kwargs)
        return "original"

    with caplog.at_level(logging.INFO, logger=plugin.logger.name):
        assert plugin.sglang_v32_hook(original, **kw) == "original"
        assert plugin.sglang_v32_hook(original, **kw) == "original"
    assert len(seen) == 2 and all(all(s[k] is kw[k] for k in kw) for s in seen)
    assert launches["launches"] == []
    named = "kv_cache_dim 528" if "kv_cache_dim" in change else "fp8_v32_nope" if "nope_heads" in change else "fp8_v32"
    assert len([r for r in caplog.records if f"leaves {named} q" in r.getMessage()]) == 1


@needs_sglang
@pytest.mark.parametrize("nope", [False, True], ids=["v32-656B", "v32-no-rope-528B"])
def test_v32_uncovered_call_through_sglang_runs_sglangs_function(v32_hooked, launches, nope):
    mod, _ = v32_hooked
    kw, _ = v32_call(heads=12, tokens=1, nope=nope)
    with pytest.raises(ImportError, match="flashinfer"):  # SGLang's own FlashInfer path, absent on a CPU
        mod.flashinfer_sparse_mla_forward(**kw)
    assert launches["launches"] == []


@needs_sglang
def test_v32_switched_off_leaves_the_call(v32_hooked, launches, monkeypatch):
    monkeypatch.setenv(plugin.ENV_SWITCH, "0")
    kw, _ = v32_call(tokens=1)
    assert plugin.sglang_v32_hook(lambda **k: "original", **kw) == "original" and launches["launches"] == []


@pytest.mark.parametrize("kv_format", ["fp8_v32", "fp8_v32_nope"])
def test_v32_hook_serves_a_covered_call_with_the_tables_config_and_leaves_larger_batches(
    tmp_path, monkeypatch, fresh_plugin, caplog, kv_format
):
    tuned = {"2": {"BLOCK_T": 32, "num_warps": 4, "num_stages": 1, "TARGET_CTAS": 4}}
    name = f"kv_format={kv_format},heads=16,topk=2048,device_name=cpu-interpreter.json"
    (tmp_path / name).write_text(json.dumps(tuned))
    monkeypatch.setenv("SPARSE_MLA_CONFIG_DIR", str(tmp_path))
    used = []
    monkeypatch.setattr(decode, "LAUNCH_LISTENERS", [lambda name, cfg, grid: used.append(cfg)])
    W = Workload(kv_format, 16, 64, page_size=64, context=128)
    bt = make_batch(W, 2, seed=2, with_topk_length=True, invalid_fraction=0.2)
    kw = plugin.v32_engine_call(bt.q, bt.kv_cache, bt.indices, bt.topk_length)
    with caplog.at_level(logging.INFO, logger=plugin.logger.name):
        out = plugin.sglang_v32_hook(lambda **k: pytest.fail("the original was called"), **kw)
    assert set(used) == {fit_config(KernelConfig.from_dict(tuned["2"]), 64)}
    ref, _ = sparse_mla_decode_ref(*bt.args(), **bt.kwargs(), sm_scale=kw["sm_scale"])
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
    served = [r.getMessage() for r in caplog.records if f"serves {kv_format} " in r.getMessage()]
    assert len(served) == 1 and "heads=16, topk=2048" in served[0] and "nearest" in served[0]
    assert f"kv_format {kv_format}, heads 16, topk 64" in served[0]  # the command that tunes this shape's own table
    used.clear()
    big = make_batch(W, 3, seed=2)  # 3 rows: past the table's largest batch, 2
    assert plugin.sglang_v32_hook(lambda **k: "original", **plugin.v32_engine_call(big.q, big.kv_cache, big.indices))
    assert not used


def test_v32_warm_up_launches_every_row_count(fresh_plugin, launches):
    W = Workload("fp8_v32", 8, 32, page_size=64, context=64)
    bt = make_batch(W, 1, seed=1)
    done = plugin.warm_up_v32_like(plugin.v32_engine_call(bt.q, bt.kv_cache, bt.indices), batch_sizes=[1, 3])
    assert [t for t, _ in done] == [1, 3] and len(launches["launches"]) >= 2


# --- a guest never raises into the engine (issue 59) ---------------------------------------------------------


@pytest.mark.parametrize("missing", ["sglang", "sglang.srt.plugins.hook_registry"])
def test_register_without_sglangs_hook_registry_logs_one_line_and_returns(monkeypatch, caplog, missing):
    """An SGLang release before the hook registry (or none at all): one line, SGLang's own kernels serve."""
    monkeypatch.delenv(plugin.ENV_SWITCH, raising=False)
    modules = __import__("sys").modules
    for name in [m for m in modules if m == missing or m.startswith(missing + ".")] + [missing]:
        monkeypatch.setitem(modules, name, None)  # `import` of it (or of a module under it) raises ImportError
    with caplog.at_level(logging.INFO, logger=plugin.logger.name):
        assert plugin.register() is None
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 1 and "\n" not in msgs[0] and "not registered" in msgs[0], msgs
    assert "hook registry" in msgs[0]


def test_register_never_raises_into_the_engine(monkeypatch, caplog):
    """Whatever fails while registering (here the registry itself) is one line, never an exception."""
    import sys
    import types

    class Registry:
        @staticmethod
        def register(*a, **k):
            raise RuntimeError("registry is closed")

    fake = types.ModuleType("sglang.srt.plugins.hook_registry")
    fake.HookRegistry, fake.HookType = Registry, types.SimpleNamespace(AROUND="around")
    monkeypatch.setitem(sys.modules, "sglang.srt.plugins.hook_registry", fake)
    monkeypatch.delenv(plugin.ENV_SWITCH, raising=False)
    with caplog.at_level(logging.INFO, logger=plugin.logger.name):
        plugin.register()
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 1 and "registry is closed" in msgs[0] and "not registered" in msgs[0], msgs


def test_a_failing_kernel_hands_the_call_and_its_shape_back(monkeypatch, fresh_plugin, caplog):
    """The tuned kernel raising on a covered call: SGLang's original serves it, and every later call of the shape."""

    def broken(*a, **k):
        raise RuntimeError("out of resources")

    monkeypatch.setattr(decode, "sparse_mla_decode", broken)
    kw, _ = engine_call(heads=8, q_tokens=1, batch=2, topk=32, extra_topk=64)
    calls = []
    with caplog.at_level(logging.INFO, logger=plugin.logger.name):
        for _ in range(2):
            assert plugin.sglang_hook(lambda **k: calls.append(1) or "original", **kw) == "original"
    assert len(calls) == 2
    failed = [r.getMessage() for r in caplog.records if "kernel failed" in r.getMessage()]
    assert len(failed) == 1 and "out of resources" in failed[0]


def test_a_fault_while_routing_hands_the_call_back(monkeypatch, fresh_plugin):
    def broken(*a, **k):
        raise OSError("table unreadable")

    monkeypatch.setattr(plugin, "_shape_class", broken)
    kw, _ = engine_call(heads=8, q_tokens=1, batch=2, topk=32, extra_topk=64)
    assert plugin.sglang_hook(lambda **k: "original", **kw) == "original"


def test_the_originals_own_error_is_not_caught_or_repeated():
    calls = []

    def original(**k):
        calls.append(1)
        raise ValueError("the engine's own")

    with pytest.raises(ValueError, match="the engine's own"):
        plugin.sglang_hook(original, q="not a tensor")
    assert calls == [1]
