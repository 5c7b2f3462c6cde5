"""The vLLM plugin (kernels/vllm_plugin.py, kernels/vllm_backends.py) against vLLM 0.34.0 itself, on CPU under Triton's
interpreter.

vLLM is not a dependency: CI installs it (``--no-deps``, with the small packages the modules below import) in a side
folder on ``PYTHONPATH`` (``.ci/run``). Without it the tests that need it skip; the serving rule, the tables and the
warm-up are tested either way. What runs here is vLLM's own code: its plugin
loader, its backend registry, its ``FLASHINFER_MLA_SPARSE_SM120`` backend and implementation classes, its
``flat_kv_row_view`` of the cache and its DeepSeek-V4 class selector. What cannot run on a CPU machine is vLLM's Triton
code (``vllm.triton_utils`` finds no active GPU driver and binds a placeholder, so ``triton_convert_req_index_to_global_
index`` fails with ``AttributeError: module 'triton' has no attribute 'next_power_of_2'``) and FlashInfer (not
installed): the global row indices are made here by the rule vLLM's docstring states, and the reference is the fp32
attention over the bytes as vLLM documents the 656-byte layout (``flashmla_sparse.py``).
"""

import importlib.util
import json
import logging
import sys
import types

import pytest
import torch

import sparse_mla_tuner.kernels.decode as decode
from sparse_mla_tuner.kernels import vllm_plugin as plugin
from sparse_mla_tuner.kernels.config import KernelConfig
from sparse_mla_tuner.kernels.kv_format import quantize
from sparse_mla_tuner.kernels.models import tune_command
from sparse_mla_tuner.kernels.reference import sparse_mla_decode_ref
from sparse_mla_tuner.kernels.table import fit_config

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not importable (.ci/run installs it aside)")
SLOT = plugin.V32_SLOT


@pytest.fixture
def vllm_env(monkeypatch):
    """vLLM's plugin loader and backend registry, reset before and restored after the test."""
    import vllm.plugins as plugins
    from vllm.v1.attention.backends import registry

    monkeypatch.setattr(plugins, "plugins_loaded", False)
    monkeypatch.setattr(registry, "_ATTN_OVERRIDES", dict(registry._ATTN_OVERRIDES))
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    monkeypatch.delenv(plugin.ENV_SWITCH, raising=False)
    monkeypatch.delenv(plugin.ENV_V4, raising=False)
    monkeypatch.setattr(plugin, "_logged", set())
    monkeypatch.setattr(plugin, "_ROUTES", {})
    monkeypatch.setattr(plugin, "_CLASSES", {})
    registry.AttentionBackendEnum[SLOT].clear_override()
    meta_path = list(sys.meta_path)
    yield plugins, registry
    sys.meta_path[:] = meta_path


@pytest.fixture
def launches(monkeypatch):
    seen = []
    monkeypatch.setattr(decode, "LAUNCH_LISTENERS", [lambda name, cfg, grid: seen.append(name)])
    return seen


@pytest.fixture
def flashinfer_calls(monkeypatch):
    """vLLM's own decode call (FlashInfer's, absent here), recorded: what reaches vLLM's method."""
    import vllm.utils.flashinfer as fi

    calls = []

    def record(**kw):
        calls.append(kw)
        kw["out"].fill_(7.0)
        return kw["out"]

    monkeypatch.setattr(fi, "flashinfer_trtllm_batch_decode_with_kv_cache_mla", record)
    return calls


@needs_vllm
def test_vllms_loader_runs_the_entry_point_and_the_registry_maps_the_slot_to_our_backend(vllm_env, caplog):
    plugins, registry = vllm_env
    slot = registry.AttentionBackendEnum[SLOT]
    assert slot.get_path() != plugin.V32_BACKEND
    with caplog.at_level(logging.INFO, logger="vllm.sparse_mla"):
        plugins.load_general_plugins()
    assert slot.get_path() == plugin.V32_BACKEND
    assert any(f"{SLOT} -> {plugin.V32_BACKEND}" in r.getMessage() for r in caplog.records)
    backend = slot.get_class()
    from vllm.v1.attention.backends.mla.flashinfer_mla_sparse import FlashInferMLASparseSM120Backend
    from vllm.v1.attention.backends.mla.flashinfer_mla_sparse_sm120 import FlashInferMLASparseSM120Impl

    assert issubclass(backend, FlashInferMLASparseSM120Backend) and backend is not FlashInferMLASparseSM120Backend
    assert backend.get_name() == SLOT  # vLLM picks the fp8_ds_mla cache and the warm-ups by this name
    assert issubclass(backend.get_impl_cls(), FlashInferMLASparseSM120Impl)
    assert backend.get_impl_cls() is not FlashInferMLASparseSM120Impl
    # idempotent: vLLM loads plugins in every process, and a second load or register() changes nothing
    overrides = dict(registry._ATTN_OVERRIDES)
    plugins.plugins_loaded = False
    plugins.load_general_plugins()
    plugin.register()
    assert registry._ATTN_OVERRIDES == overrides


@needs_vllm
def test_allow_list_without_the_plugin_and_the_off_switch_register_nothing(vllm_env, monkeypatch):
    plugins, registry = vllm_env
    monkeypatch.setenv("VLLM_PLUGINS", "some_other_plugin")
    plugins.load_general_plugins()
    assert not registry.AttentionBackendEnum[SLOT].is_overridden()
    monkeypatch.delenv("VLLM_PLUGINS")
    monkeypatch.setenv(plugin.ENV_SWITCH, "0")
    plugins.plugins_loaded = False
    plugins.load_general_plugins()
    assert not registry.AttentionBackendEnum[SLOT].is_overridden()


@needs_vllm
def test_a_slot_another_package_took_over_is_left_to_it(vllm_env, caplog):
    plugins, registry = vllm_env
    registry.register_backend(registry.AttentionBackendEnum[SLOT], "other.pkg.Backend")
    with caplog.at_level(logging.WARNING, logger="vllm.sparse_mla"):
        plugins.load_general_plugins()
    assert registry.AttentionBackendEnum[SLOT].get_path() == "other.pkg.Backend"
    assert any("already re-pointed to other.pkg.Backend" in r.getMessage() for r in caplog.records)


def _ref_attention(q, rows, idx, scale):
    """fp32 attention over the rows as vLLM documents them: 512 e4m3, 4 fp32 scales (one per 128), then 64 bf16 rope
    values (656 bytes) or none (528 bytes, a model without RoPE: ``get_fp8_ds_mla_row_bytes`` of the sm_120 impl)."""
    data = rows.view(torch.uint8)
    nope = data[:, :512].contiguous().view(torch.float8_e4m3fn).float().view(-1, 4, 128)
    scales = data[:, 512:528].contiguous().view(torch.float32)
    kv = torch.cat(
        [(nope * scales[..., None]).view(-1, 512), data[:, 528:].contiguous().view(torch.bfloat16).float()], 1
    )  # [rows, 576] or [rows, 512]
    out = torch.zeros(q.shape[0], q.shape[1], 512)
    for t in range(q.shape[0]):
        sel = idx[t][idx[t] >= 0].long()
        if len(sel) == 0:
            continue
        k = kv[sel]
        p = torch.softmax(q[t].float() @ k.T * scale, dim=-1)
        out[t] = p @ k[:, :512]
    return out


def _vllm_call(heads=16, topk=64, tokens=3, glm_scales=False, seed=0, nope=False):
    """vLLM's arguments of ``_run_mqa_kernel`` as ``forward_mqa`` makes them: the cache of 64-row blocks whose block
    stride is 2 blocks (another layer's pages in between), seen through vLLM's ``flat_kv_row_view`` and viewed as
    ``[-1, 64, 656]`` (``[-1, 64, 528]`` and q of 512 dims with ``nope``, a model without RoPE); the global row of a
    token by the rule of vLLM's ``triton_convert_req_index_to_global_index`` (``block_table[req, i // 64] *
    block_stride_rows + i % 64``, -1 stays -1)."""
    from vllm.v1.attention.backends.mla.sparse_utils import flat_kv_row_view

    g = torch.Generator().manual_seed(seed)
    block, blocks = 64, 4
    fmt, width, bpt = ("fp8_v32_nope", 512, 528) if nope else ("fp8_v32", 576, 656)
    pages = quantize(torch.randn(blocks * block, width, generator=g), fmt, block)  # [4, 64, bpt]
    if glm_scales:  # GLM's arbitrary fp32 scales ("arbitrary_fp32"), not powers of two
        s = pages[..., 512:528].contiguous().view(torch.float32) * 1.37
        pages[..., 512:528] = s.view(torch.uint8).view(blocks, block, 16)
    buf = torch.zeros(blocks, 2 * block, bpt, dtype=torch.uint8)
    buf[:, :block] = pages
    cache = buf[:, :block]  # [4, 64, 656], block stride 2 * 64 rows
    rows, stride_rows = flat_kv_row_view(cache, block)
    assert stride_rows == 2 * block
    req = torch.tensor([0, 1, 1][:tokens])
    block_table = torch.tensor([[2, 0], [1, 3]])
    local = torch.randint(0, 2 * block, (tokens, topk), generator=g)
    local[0, 5:] = -1
    glob = block_table[req[:, None], (local // block).clamp(min=0)] * stride_rows + local % block
    glob = torch.where(local < 0, -1, glob).to(torch.int32)
    q = torch.randn(tokens, heads, width, generator=g).bfloat16()
    return q, rows.view(-1, 64, rows.shape[-1]), glob, rows


def _impl(nope=False):
    from sparse_mla_tuner.kernels.vllm_backends import SparseMLASM120Impl

    impl = object.__new__(SparseMLASM120Impl)  # vLLM's __init__ needs a vLLM config and FlashInfer
    impl.scale, impl.num_heads, impl.kv_lora_rank = (512 if nope else 576) ** -0.5, 16, 512
    impl.qk_nope_head_dim, impl.qk_rope_head_dim = (256, 0) if nope else (512, 64)
    impl.kv_scale_format = "arbitrary_fp32" if nope else "pow2_fp32"
    impl._workspace_buffer = torch.empty(1)
    return impl


@needs_vllm
@pytest.mark.parametrize(
    ("glm_scales", "nope"),
    [(False, False), (True, False), (True, True)],
    ids=["deepseek-pow2-scales", "glm-arbitrary-scales", "glm53-no-rope-528B"],
)
def test_covered_call_runs_the_kernel_on_vllms_cache_in_place_and_matches_the_reference(
    vllm_env, launches, flashinfer_calls, monkeypatch, glm_scales, nope
):
    q, kv, idx, rows = _vllm_call(glm_scales=glm_scales, nope=nope)
    seen = []
    real = decode.sparse_mla_decode
    monkeypatch.setattr(decode, "sparse_mla_decode", lambda q, c, i, **kw: seen.append(c) or real(q, c, i, **kw))
    impl = _impl(nope)
    assert impl.get_fp8_ds_mla_row_bytes() == kv.shape[-1]  # vLLM's own rule for the row of this model
    out = impl._run_mqa_kernel(q, kv, idx)
    assert launches and not flashinfer_calls
    assert seen[0].data_ptr() == kv.data_ptr()  # vLLM's cache, not a copy
    ref = _ref_attention(q, rows, idx, impl.scale)
    assert out.shape == (3, 16, 512) and out.dtype == torch.bfloat16
    err = (out.float() - ref).abs().max().item() / ref.abs().max().item()
    assert err < 0.02, err


@needs_vllm
@pytest.mark.parametrize(
    "change",
    ["heads12", "no_rope_heads12", "no_rope_q_on_656B_rows", "bf16_cache"],
)
def test_uncovered_call_runs_vllms_own_method_unchanged(vllm_env, launches, flashinfer_calls, change, caplog):
    q, kv, idx, _ = _vllm_call(nope=change == "no_rope_heads12")
    if change in ("heads12", "no_rope_heads12"):
        q = q[:, :12]
    elif change == "no_rope_q_on_656B_rows":
        q = q[..., :512].contiguous()
    else:
        kv = torch.zeros(kv.shape[0], 64, 656, dtype=torch.bfloat16)
    impl = _impl()
    with caplog.at_level(logging.INFO, logger="vllm.sparse_mla"):
        out = impl._run_mqa_kernel(q, kv, idx)
    assert not launches and len(flashinfer_calls) == 1
    call = flashinfer_calls[0]
    assert call["sparse_mla_top_k"] == idx.shape[1] and call["block_tables"].shape == (3, 1, idx.shape[1])
    assert torch.equal(out, torch.full_like(out, 7.0))
    assert any("leaves q [T," in r.getMessage() for r in caplog.records)


@needs_vllm
def test_switched_off_at_the_call_runs_vllms_method(vllm_env, launches, flashinfer_calls, monkeypatch):
    monkeypatch.setenv(plugin.ENV_SWITCH, "off")
    q, kv, idx, _ = _vllm_call()
    _impl()._run_mqa_kernel(q, kv, idx)
    assert not launches and len(flashinfer_calls) == 1


@needs_vllm
def test_a_failure_in_the_kernel_path_goes_to_vllm_not_into_the_engine(vllm_env, flashinfer_calls, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("compile failed")

    monkeypatch.setattr(decode, "sparse_mla_decode", boom)
    q, kv, idx, _ = _vllm_call()
    _impl()._run_mqa_kernel(q, kv, idx)
    assert len(flashinfer_calls) == 1


def _v4_modules(v41: bool):
    """vLLM's DeepSeek-V4 (or V4.1) model module, with its class selector, and its sm_12x FlashInfer module."""
    import importlib

    family = "deepseek_v41" if v41 else "deepseek_v4"
    model = importlib.import_module(f"vllm.models.{family}.nvidia.model")
    return model, importlib.import_module(f"vllm.models.{family}.nvidia.flashinfer_sparse")


@needs_vllm
@pytest.mark.parametrize("v41", [False, True], ids=["deepseek-v4", "deepseek-v4.1"])
@pytest.mark.parametrize("opt_in", [True, False])
def test_deepseek_v4_selector_gives_our_subclass_on_sm12x_only_when_opted_in(vllm_env, monkeypatch, opt_in, v41):
    from vllm.platforms import current_platform

    model, flashinfer_sparse = _v4_modules(v41)
    assert model.__name__ in plugin.V4_MODULES
    monkeypatch.setattr(model, plugin.V4_SELECTOR, getattr(model, plugin.V4_SELECTOR))  # restored after the test
    if opt_in:
        monkeypatch.setenv(plugin.ENV_V4, "1")
    plugins, _ = vllm_env
    plugins.load_general_plugins()
    plugin.register()  # twice: wrapped once
    monkeypatch.setattr(current_platform, "get_device_capability", lambda *a, **k: types.SimpleNamespace(major=12))
    config = types.SimpleNamespace(
        attention_config=types.SimpleNamespace(backend=None),
        parallel_config=types.SimpleNamespace(prefill_context_parallel_size=1),  # V4.1's selector reads these two
        lora_config=object(),
    )
    cls = getattr(model, plugin.V4_SELECTOR)(config)
    base = flashinfer_sparse.DeepseekV4FlashInferSM120Attention
    if opt_in:
        assert cls is not base and issubclass(cls, base) and cls._sparse_mla_v41 is v41
        wrapped = getattr(model, plugin.V4_SELECTOR)._sparse_mla_original
        assert getattr(wrapped, "_sparse_mla_original", None) is None  # wrapped once
    else:
        assert cls is base
    monkeypatch.setattr(current_platform, "get_device_capability", lambda *a, **k: types.SimpleNamespace(major=9))
    assert getattr(model, plugin.V4_SELECTOR)(config) is not base  # FlashMLA's class elsewhere, untouched


@needs_vllm
def test_v4_opt_in_wraps_the_selector_when_the_module_is_imported_later(vllm_env, monkeypatch):
    monkeypatch.setenv(plugin.ENV_V4, "1")
    module = types.ModuleType(plugin.V4_MODULE)
    module._select_dsv4_attn_cls = lambda config: int
    monkeypatch.delitem(sys.modules, plugin.V4_MODULE, raising=False)
    plugin.register()
    finder = next(f for f in sys.meta_path if isinstance(f, plugin._AfterImport))
    loader = plugin._ThenLoader(types.SimpleNamespace(exec_module=lambda m: None), finder.then)
    loader.exec_module(module)
    assert module._select_dsv4_attn_cls.__wrapped__ is not None
    assert module._select_dsv4_attn_cls(None) is int  # not vLLM's sm_12x class: unchanged


# --- without vLLM: the serving rule, the tables and the warm-up --------------------------------------------------


@pytest.fixture
def fresh_plugin(monkeypatch):
    """The plugin's per-shape decisions forgotten (they are cached for the process)."""
    for name in ("_ROUTES", "_CLASSES"):
        monkeypatch.setattr(plugin, name, {})
    monkeypatch.setattr(plugin, "_logged", set())
    monkeypatch.delenv(plugin.ENV_SWITCH, raising=False)


def _contiguous_call(heads=16, topk=64, tokens=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    cache = quantize(torch.randn(2 * 64, 576, generator=g), "fp8_v32", 64)  # [2, 64, 656]
    idx = torch.randint(-1, 2 * 64, (tokens, topk), generator=g, dtype=torch.int32)
    return torch.randn(tokens, heads, 576, generator=g).bfloat16(), cache, idx


def test_serve_v32_runs_without_vllm_and_matches_the_reference(fresh_plugin, launches):
    q, cache, idx = _contiguous_call()
    out = plugin.serve_v32(q, cache, idx, 576**-0.5)
    ref, _ = sparse_mla_decode_ref(q, cache, idx, kv_format="fp8_v32", sm_scale=576**-0.5)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
    assert launches
    launches.clear()
    assert plugin.serve_v32(q[:, :12].contiguous(), cache, idx, 576**-0.5) is None and not launches


def test_a_covered_shape_uses_the_nearest_tables_config_and_more_tokens_go_back(
    tmp_path, monkeypatch, fresh_plugin, caplog
):
    tuned = {"1": {"BLOCK_T": 128, "num_warps": 4, "num_stages": 1, "TARGET_CTAS": 3}}
    tuned["4"] = {"BLOCK_T": 16, "num_warps": 2, "num_stages": 1, "TARGET_CTAS": 5}
    (tmp_path / "kv_format=fp8_v32,heads=16,topk=2048,device_name=cpu-interpreter.json").write_text(json.dumps(tuned))
    monkeypatch.setenv("SPARSE_MLA_CONFIG_DIR", str(tmp_path))
    used = []
    monkeypatch.setattr(decode, "LAUNCH_LISTENERS", [lambda name, cfg, grid: used.append(cfg)])
    q, cache, idx = _contiguous_call(heads=8, topk=64, tokens=2)  # no table of its own: 16 heads, top-k 2048's
    with caplog.at_level(logging.INFO, logger=plugin.logger.name):
        assert plugin.serve_v32(q, cache, idx, 576**-0.5) is not None
    want = fit_config(KernelConfig.from_dict(tuned["1"]), 64)  # nearest batch key to 2; tile fitted to 64 tokens
    assert want.BLOCK_T == 64 and set(used) == {want}
    # served from another shape's table: the log says so and names the command for the shape's own (vLLM's layout)
    (served,) = [r.getMessage() for r in caplog.records if "heads=16, topk=2048, T up to 4" in r.getMessage()]
    assert served.endswith(f"(nearest: to tune this shape's own table, {tune_command('fp8_v32', 8, 64, 'vllm')})")
    used.clear()
    q5, cache, idx5 = _contiguous_call(heads=8, topk=64, tokens=5)  # past the table's 4 tokens
    with caplog.at_level(logging.INFO, logger=plugin.logger.name):
        assert plugin.serve_v32(q5, cache, idx5, 576**-0.5) is None and not used
    (left,) = [r.getMessage() for r in caplog.records if "above the largest batch (4)" in r.getMessage()]
    assert f"(to tune larger batches: {tune_command('fp8_v32', 8, 64, 'vllm')})" in left
    assert tune_command("fp8_v32", 8, 2048, "vllm").endswith("--tp 16 && tuner export --engine vllm")


def test_warm_up_compiles_every_config_the_table_can_pick(tmp_path, monkeypatch, fresh_plugin):
    tuned = {
        "1": {"BLOCK_T": 16, "num_warps": 4, "num_stages": 1, "TARGET_CTAS": 2},
        "3": {"BLOCK_T": 32, "num_warps": 2, "num_stages": 1, "TARGET_CTAS": 8},
    }
    (tmp_path / "kv_format=fp8_v32,heads=16,topk=32,device_name=cpu-interpreter.json").write_text(json.dumps(tuned))
    monkeypatch.setenv("SPARSE_MLA_CONFIG_DIR", str(tmp_path))
    used = set()
    monkeypatch.setattr(decode, "LAUNCH_LISTENERS", [lambda n, cfg, grid: used.add(cfg)])
    q, cache, idx = _contiguous_call(topk=32, tokens=1)
    done = plugin.warm_up_v32_like(q, cache, idx, 576**-0.5)  # every token count the table serves
    assert [t for t, _ in done] == [1, 2, 3]
    assert {cfg for _, cfg in done} == {KernelConfig.from_dict(e) for e in tuned.values()} == used


def test_a_bad_switch_value_turns_the_plugin_off_with_one_warning(fresh_plugin, monkeypatch, caplog):
    monkeypatch.setenv(plugin.ENV_SWITCH, "maybe")
    with caplog.at_level(logging.WARNING, logger=plugin.logger.name):
        assert not plugin.enabled() and not plugin.enabled()
    assert [r.getMessage() for r in caplog.records].count(
        "SPARSE_MLA_VLLM='maybe' is not one of 0/false/off/no or 1/true/on/yes; taken as off"
    ) == 1
    q, cache, idx = _contiguous_call()
    assert plugin.serve_v32(q, cache, idx, 576**-0.5) is None


def _v4_layer(monkeypatch, heads=16, topk=64, tokens=2, seed=2, v41=False):
    """Our DeepSeek-V4 (or V4.1) sm_12x class (vLLM's subclassed) on a window-only layer: vLLM's own
    ``_prepare_query`` and ``_as_sparse_cache`` shape the call; FlashInfer's decode (absent) is a recorder. The cache
    is V4's 584-byte record, which vLLM writes for V4.1 too on sm_12x (``_use_v41_mxfp8_kv_record``)."""
    from sparse_mla_tuner.kernels import sglang_plugin

    _, fs = _v4_modules(v41)

    for name in ("_ROUTES", "_CLASSES", "_SHAPES"):  # the SGLang plugin's V4 rule serves: its decisions forgotten
        monkeypatch.setattr(sglang_plugin, name, {})
    calls = []
    monkeypatch.setattr(fs, "flashinfer_trtllm_batch_decode_sparse_mla_dsv4", lambda **kw: calls.append(kw))
    cls = plugin.v4_class_for(fs.DeepseekV4FlashInferSM120Attention)
    layer = object.__new__(cls)
    torch.nn.Module.__init__(layer)  # vLLM's __init__ needs a vLLM config and FlashInfer
    g = torch.Generator().manual_seed(seed)
    pages = quantize(torch.randn(2 * 64, 512, generator=g), "fp8_model1", 64)  # [2, 64, 584]
    layer.swa_cache_layer = types.SimpleNamespace(kv_cache=pages)
    layer.kv_cache_torch_dtype, layer.scale = torch.bfloat16, 512**-0.5
    layer.attn_sink = torch.randn(heads, generator=g)
    layer._get_workspace = lambda device: torch.empty(1)
    idx = torch.randint(-1, 2 * 64, (tokens, topk), generator=g, dtype=torch.int32)
    lens = torch.tensor([topk, topk // 2][:tokens], dtype=torch.int32)
    meta = types.SimpleNamespace(
        num_decode_tokens=tokens, num_decodes=tokens, decode_swa_indices=idx, decode_swa_lens=lens
    )
    q = torch.randn(tokens, heads, 512, generator=g).bfloat16()
    return layer, q, meta, pages, calls


def _v4_ref(layer, q, meta, pages, **extra):
    """The fp32 reference of a V4 layer's decode: the window cache (and ``extra``'s compressed cache), the sink."""
    ref, _ = sparse_mla_decode_ref(
        q.unsqueeze(1),
        pages,
        meta.decode_swa_indices.unsqueeze(1),
        kv_format="fp8_model1",
        sm_scale=layer.scale,
        topk_length=meta.decode_swa_lens,
        attn_sink=layer.attn_sink,
        **extra,
    )
    return ref.squeeze(1).float()


@needs_vllm
@pytest.mark.parametrize("v41", [False, True], ids=["deepseek-v4", "deepseek-v4.1"])
def test_v4_decode_of_our_subclass_runs_the_kernel_when_opted_in_else_vllms(vllm_env, monkeypatch, launches, v41):
    layer, q, meta, pages, calls = _v4_layer(monkeypatch, v41=v41)
    output = torch.full((2, 16, 512), float("nan"), dtype=torch.bfloat16)
    layer._forward_decode(q, None, meta, None, True, output)  # not opted in: vLLM's decode, unchanged
    assert len(calls) == 1 and calls[0]["sparse_indices"] is meta.decode_swa_indices and not launches
    monkeypatch.setenv(plugin.ENV_V4, "1")
    layer._forward_decode(q, None, meta, None, True, output)
    assert len(calls) == 1 and launches
    torch.testing.assert_close(output.float(), _v4_ref(layer, q, meta, pages), atol=2e-2, rtol=2e-2)
    launches.clear()
    layer.attn_sink = torch.zeros(8)  # a sink of another head count: not the rule's, so vLLM's
    layer._forward_decode(q, None, meta, None, True, output)
    assert len(calls) == 2 and not launches


@needs_vllm
def test_v41_compressed_layer_takes_its_indices_from_v41s_own_rule_at_any_ratio(vllm_env, monkeypatch, launches):
    """A V4.1 compressed layer of ratio 2 (V4's ratio-4 rule would not apply): the global top-k indices and lengths
    come from vLLM's V4.1 ``compute_global_topk_indices_and_lens`` (a Triton kernel, which cannot run here: replaced
    by the rule its docstring states, block-table lookup, valid counts, padding tokens 0), and the window plus the
    compressed cache match the reference."""
    from vllm.models.deepseek_v41.common import ops

    layer, q, meta, pages, calls = _v4_layer(monkeypatch, v41=True)
    g = torch.Generator().manual_seed(4)
    compressed = quantize(torch.randn(3 * 64, 512, generator=g), "fp8_model1", 64)  # [3, 64, 584]
    layer.compress_ratio = 2
    layer.topk_indices_buffer = torch.randint(-1, 128, (2, 64), generator=g, dtype=torch.int32)
    block_table = torch.tensor([[2, 0], [1, 2]], dtype=torch.int32)
    seen = []

    def rule(local, token_to_req, table, block_size, is_valid):
        seen.append(block_size)
        glob = table[token_to_req.long()[:, None], (local // block_size).clamp(min=0).long()] * block_size
        glob = torch.where(local < 0, -1, glob + local % block_size).to(torch.int32)
        return glob, torch.where(is_valid, (local >= 0).sum(-1), 0).to(torch.int32)

    monkeypatch.setattr(ops, "compute_global_topk_indices_and_lens", rule)
    meta.is_valid_token = torch.tensor([True, True])
    meta.token_to_req_indices = torch.tensor([0, 1], dtype=torch.int32)
    attn_meta = types.SimpleNamespace(block_size=128, block_table=block_table)
    monkeypatch.setenv(plugin.ENV_V4, "1")
    output = torch.full((2, 16, 512), float("nan"), dtype=torch.bfloat16)
    layer._forward_decode(q, compressed, meta, attn_meta, False, output)
    assert seen == [64] and launches and not calls  # block size 128 // ratio 2, and the kernel served
    glob, lens = rule(layer.topk_indices_buffer, meta.token_to_req_indices, block_table, 64, meta.is_valid_token)
    ref = _v4_ref(
        layer, q, meta, pages, extra_kv_cache=compressed, extra_indices=glob.unsqueeze(1), extra_topk_length=lens
    )
    torch.testing.assert_close(output.float(), ref, atol=2e-2, rtol=2e-2)


def test_the_gpu_check_takes_vllms_arguments_and_needs_a_gpu(monkeypatch, capsys):
    from sparse_mla_tuner.kernels import vllm_check
    from sparse_mla_tuner.kernels.workload import Workload
    from sparse_mla_tuner.kernels.workload import make_batch

    bt = make_batch(Workload("fp8_v32", 16, 64, page_size=64, context=256), 3, q_tokens=1)
    q, kv, idx = vllm_check._vllm_args(bt)
    assert q.shape == (3, 16, 576) and kv.shape[1:] == (64, 656) and idx.shape == (3, 64)
    assert plugin.v32_leave_reason(q, kv, idx) is None  # the check's call is one the plugin serves
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert vllm_check.main([]) == 2
    assert capsys.readouterr().err.strip() == "sparse_mla_tuner.kernels.vllm_check needs a CUDA GPU"
