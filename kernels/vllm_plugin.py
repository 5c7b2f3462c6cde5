"""vLLM plugin: the tuned kernel behind vLLM's sm_120 sparse-MLA decode, with no fork and no patch.

vLLM (0.34.0) runs the entry points of group ``vllm.general_plugins`` in every process (``pyproject.toml`` declares
``sparse_mla = "sparse_mla_tuner.kernels.vllm_plugin:register"``). :func:`register`:

- **DeepSeek-V3.2 / GLM** (vLLM's ``fp8_ds_mla`` cache: the 656-byte ``fp8_v32`` rows, and the 528-byte
  ``fp8_v32_nope`` rows of a model without RoPE, GLM-5.3-Flash, which vLLM's sm_120 implementation sizes by
  ``get_fp8_ds_mla_row_bytes``): re-points the attention backend slot ``FLASHINFER_MLA_SPARSE_SM120`` with vLLM's
  ``register_backend()`` to
  ``kernels.vllm_backends.SparseMLASM120Backend``, a subclass of vLLM's own backend (same name, metadata, cache
  layout and checks) whose implementation overrides one method, ``_run_mqa_kernel(q, kv_cache, indices)``: a call
  this plugin covers (:func:`v32_leave_reason`, then the device's tables) runs :func:`kernels.sparse_mla_decode` with
  the tuned config, reading vLLM's cache in place; every other call runs vLLM's method (FlashInfer) unchanged.
- **DeepSeek-V4 and V4.1** (opt-in, ``SPARSE_MLA_VLLM_V4=1``): wraps vLLM's class selectors
  ``vllm.models.deepseek_v4.nvidia.model._select_dsv4_attn_cls`` and ``vllm.models.deepseek_v41.nvidia.model.
  _select_dsv4_attn_cls`` when those modules are imported, so that where vLLM picks a
  ``DeepseekV4FlashInferSM120Attention`` (V4's or V4.1's) it gets its subclass ``SparseMLADeepseekV4SM120Attention``
  (:func:`v4_class_for`; ``docs/engines.md`` says why this seam and why opt-in). On sm_12x vLLM keeps V4's 584-byte
  record for V4.1 too (``_use_v41_mxfp8_kv_record``: SM100 only), so both read ``fp8_model1`` caches.

Each distinct call shape is logged once (logger ``vllm.sparse_mla``, under vLLM's own ``vllm`` logger): served with
which table, or left to vLLM and why. Off without uninstalling: ``SPARSE_MLA_VLLM=0`` (read at load: nothing is
registered; and at every call: a registered backend hands every call back), or vLLM's allow-list ``VLLM_PLUGINS``
without ``sparse_mla``. Nothing here raises into the engine: a failure while registering or serving is logged once
and vLLM's own code runs. Tables are read where the SGLang plugin reads them (``$SPARSE_MLA_CONFIG_DIR``, then the
package's ``kernels/configs/``, ``kernels.table``). This module imports vLLM only inside functions that vLLM's own
code calls (:func:`register`, the V4 selector and decode); the V3.2 serving functions take tensors and run without
vLLM. It names ``kernels/vllm_backends.py`` (which imports vLLM and this module) by its path only.
"""

from __future__ import annotations

import importlib.abc
import logging
import os
import sys
import threading

import torch

from . import decode
from ._engine import Route
from ._engine import device_reason
from ._engine import warm_counts
from .config import KernelConfig
from .coverage import SERVED_HEADS
from .coverage import coverage as shared_coverage
from .decode import device_name
from .models import tune_command

PLUGIN_NAME = "sparse_mla"  # the entry point's name, as VLLM_PLUGINS lists it
ENV_SWITCH = "SPARSE_MLA_VLLM"
ENV_V4 = "SPARSE_MLA_VLLM_V4"  # DeepSeek-V4's seam, opt-in
V32_SLOT = "FLASHINFER_MLA_SPARSE_SM120"  # vLLM's sm_12x sparse-MLA backend for V3.2 / GLM-5
V32_BACKEND = "sparse_mla_tuner.kernels.vllm_backends.SparseMLASM120Backend"
V4_MODULE = "vllm.models.deepseek_v4.nvidia.model"
V41_MODULE = "vllm.models.deepseek_v41.nvidia.model"  # DeepSeek-V4.1: the same selector name and class shape
V4_MODULES = (V4_MODULE, V41_MODULE)
V4_SELECTOR = "_select_dsv4_attn_cls"
# q's head dim -> (the cache format, its bytes per token): with RoPE (V3.2, GLM-5) and without (GLM-5.3)
V32_FORMATS = {576: ("fp8_v32", 656), 512: ("fp8_v32_nope", 528)}
CAPTURE_SIZES = (1, 2, 4, 8, *range(16, 97, 8))  # warmed when no table bounds the batch (interpreter)
_OFF = ("0", "false", "off", "no")
_ON = ("", "1", "true", "on", "yes")
_CACHE_DTYPES = (torch.uint8, torch.float8_e4m3fn)

logger = logging.getLogger("vllm.sparse_mla")
_logged: set = set()
_LOCK = threading.RLock()


def _log_once(key, level, msg, *args) -> None:
    if key not in _logged:
        _logged.add(key)
        logger.log(level, msg, *args)


def _switch(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    value = value.strip().lower()
    if value in _ON:
        return True
    if value not in _OFF:
        _log_once(
            ("switch", name, value),
            logging.WARNING,
            "%s=%r is not one of 0/false/off/no or 1/true/on/yes; taken as off",
            name,
            os.environ.get(name),
        )
    return False


def enabled() -> bool:
    """Whether ``SPARSE_MLA_VLLM`` lets the plugin serve (unset: yes). A value other than 0/false/off/no or
    1/true/on/yes turns it off, with one warning saying what is allowed."""
    return _switch(ENV_SWITCH, True)


def v4_enabled() -> bool:
    """Whether ``SPARSE_MLA_VLLM_V4`` opts DeepSeek-V4 in (unset: no)."""
    return enabled() and _switch(ENV_V4, False)


# --- registration ------------------------------------------------------------------------------------


def register() -> None:
    """The entry point vLLM's ``load_general_plugins()`` calls, in every process and possibly more than once:
    re-points :data:`V32_SLOT` to :data:`V32_BACKEND` and, opted in, wraps the DeepSeek-V4 class selector.
    Never raises."""
    if not enabled():
        _log_once(
            ("off",),
            logging.INFO,
            "sparse-MLA plugin: off (%s=%s); vLLM's own kernels serve",
            ENV_SWITCH,
            os.environ.get(ENV_SWITCH),
        )
        return
    try:
        _register_v32()
    except Exception as e:  # a vLLM without this registry or slot: vLLM's own backend serves
        _log_once(("register", "v32"), logging.WARNING, "sparse-MLA plugin: %s not taken over (%r)", V32_SLOT, e)
    if v4_enabled():
        try:
            _register_v4()
        except Exception as e:
            _log_once(("register", "v4"), logging.WARNING, "sparse-MLA plugin: DeepSeek-V4 not wrapped (%r)", e)


def _register_v32() -> None:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.backends.registry import register_backend

    slot = AttentionBackendEnum[V32_SLOT]
    current = slot.get_path()
    if current == V32_BACKEND:
        return  # already ours: loading twice changes nothing
    if slot.is_overridden():
        _log_once(
            ("taken", current),
            logging.WARNING,
            "sparse-MLA plugin: %s is already re-pointed to %s by another package; left as it is",
            V32_SLOT,
            current,
        )
        return
    register_backend(slot, V32_BACKEND)
    _log_once(
        ("registered", "v32"),
        logging.INFO,
        "sparse-MLA plugin: %s -> %s. Serves DeepSeek-V3.2/GLM decode on the fp8_ds_mla cache: 656-byte rows with q "
        "[T, H, 576] (fp8_v32) and the 528-byte rows of a model without RoPE with q [T, H, 512] (fp8_v32_nope), "
        "bf16, H in %s, any top-k, on a GPU with an exported table for the format (the nearest tuned heads/top-k "
        "when the shape has none; T up to its largest batch). Leaves every other call to vLLM's %s. Off: %s=0.",
        V32_SLOT,
        V32_BACKEND,
        list(SERVED_HEADS),
        V32_SLOT,
        ENV_SWITCH,
    )


def _register_v4() -> None:
    for name in V4_MODULES:
        module = sys.modules.get(name)
        if module is not None:
            wrap_v4_selector(module)
        elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
            sys.meta_path.insert(0, _AfterImport(name, wrap_v4_selector))
    _log_once(
        ("registered", "v4"),
        logging.INFO,
        "sparse-MLA plugin: DeepSeek-V4/V4.1 on sm_12x -> SparseMLADeepseekV4SM120Attention (wraps %s.%s and %s.%s; "
        "%s=1)",
        V4_MODULE,
        V4_SELECTOR,
        V41_MODULE,
        V4_SELECTOR,
        ENV_V4,
    )


_V4_CLASSES: dict[type, type] = {}
# vLLM's DeepSeek-V4 / V4.1 sm_12x FlashInfer attention classes, by module, and whether the model is V4.1
_V4_BASES = {
    "vllm.models.deepseek_v4.nvidia.flashinfer_sparse": False,
    "vllm.models.deepseek_v41.nvidia.flashinfer_sparse": True,
}


def v4_class_for(cls: type) -> type:
    """Our subclass of vLLM's DeepSeek-V4 or V4.1 sm_12x FlashInfer attention class (made once per class); any other
    class unchanged. Its ``_forward_decode`` runs the tuned kernel where :func:`serve_v4_decode` covers the call, else
    vLLM's."""
    if cls.__name__ != "DeepseekV4FlashInferSM120Attention" or cls.__module__ not in _V4_BASES:
        return cls
    sub = _V4_CLASSES.get(cls)
    if sub is None:

        class SparseMLADeepseekV4SM120Attention(cls):
            """vLLM's DeepSeek-V4 (or V4.1) sm_12x attention, with covered decode calls on the tuned kernel."""

            _sparse_mla_v41 = _V4_BASES[cls.__module__]

            def _forward_decode(self, q, kv_cache, swa_metadata, attn_metadata, swa_only, output):
                if serve_v4_decode(self, q, kv_cache, swa_metadata, attn_metadata, swa_only, output):
                    return None
                return super()._forward_decode(q, kv_cache, swa_metadata, attn_metadata, swa_only, output)

        sub = _V4_CLASSES[cls] = SparseMLADeepseekV4SM120Attention
    return sub


def wrap_v4_selector(module) -> None:
    """Wrap ``module._select_dsv4_attn_cls`` (once; V4's or V4.1's) so that vLLM's sm_12x FlashInfer class becomes
    ours."""
    original = getattr(module, V4_SELECTOR)
    if getattr(original, "_sparse_mla_original", None) is not None:
        return

    def select(vllm_config):
        cls = original(vllm_config)
        if not v4_enabled():
            return cls
        try:
            return v4_class_for(cls)
        except Exception as e:
            _log_once(("v4 class",), logging.WARNING, "sparse-MLA plugin: DeepSeek-V4 left to vLLM (%r)", e)
            return cls

    select._sparse_mla_original = original
    select.__wrapped__ = original
    setattr(module, V4_SELECTOR, select)


class _ThenLoader(importlib.abc.Loader):
    """A module's own loader, then ``then(module)``."""

    def __init__(self, loader, then):
        self.loader, self.then = loader, then

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        try:
            self.then(module)
        except Exception as e:  # never break vLLM's import
            _log_once(("after import",), logging.WARNING, "sparse-MLA plugin: %r", e)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``then(module)`` right after the module ``name`` is executed by its own loader."""

    def __init__(self, name: str, then):
        self.name, self.then = name, then

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _ThenLoader(spec.loader, self.then)
                return spec
        return None


# --- coverage: which tables serve a shape ------------------------------------------------------------


def coverage(device: torch.device, kv_format: str, heads: int, topk: int) -> tuple | str | None:
    """``(tuned, max_rows, origin, tune)``: the tuned ``(heads, topk)`` whose table serves this shape on ``device``,
    that table's largest batch, where it comes from (``measured``, ``replayed``, ``unverified``, ``nearest``) and the
    command that tunes the shape's own table (None when measured); a reason (str, with that command) when it is left
    to vLLM; None on the interpreter without a table (the default config serves). The one place this plugin asks the
    tables: through :func:`kernels.coverage.coverage`, the rule the SGLang plugin and ``tuner shapes`` use, so the
    three agree."""
    c = shared_coverage(kv_format, heads, topk, device_name=device_name(device))
    tune = tune_command(kv_format, heads, topk, engine="vllm") if c.tune else None
    if not c.served:
        return c.reason + (f" (to tune it: {tune})" if tune else "")
    if c.origin == "default":
        return None
    return c.tuned, c.max_rows, c.origin, tune


class _Route(Route):
    """A served shape class (every row count, T): :class:`kernels._engine.Route`, where its table comes from, and
    how the log names it."""

    origin, tune = "default", None

    def how(self) -> str:
        if self.shape is None:
            return "the default config (interpreter)"
        how = f"the table of heads={self.shape[0]}, topk={self.shape[1]}, T up to {self.max_rows}"
        if self.origin != "measured":
            how += f" ({self.origin}: to tune this shape's own table, {self.tune})"
        return how


_ROUTES: dict[tuple, _Route | str] = {}  # by the call's signature
_CLASSES: dict[tuple, _Route | str] = {}  # by the signature less the row count


# --- DeepSeek-V3.2 / GLM: FLASHINFER_MLA_SPARSE_SM120's _run_mqa_kernel ------------------------------


def v32_format(q) -> str | None:
    """The cache format of a ``_run_mqa_kernel`` call from q's head dim (576: ``fp8_v32``; 512, no RoPE:
    ``fp8_v32_nope``); None for another."""
    found = V32_FORMATS.get(q.shape[-1]) if isinstance(q, torch.Tensor) and q.dim() else None
    return found[0] if found else None


def v32_leave_reason(q, kv_cache, indices) -> str | None:
    """Why a ``_run_mqa_kernel(q, kv_cache, indices)`` call goes to vLLM's own method (None: the kernel serves it,
    subject to the device's tables)."""
    if not isinstance(q, torch.Tensor) or q.dim() != 3 or q.dtype != torch.bfloat16:
        return "q is not [T, H, D] bf16"
    T, H, D = q.shape
    if D not in V32_FORMATS:
        return f"q has head dim {D} (served: 576, 512 latent + 64 rope; 512, no rope)"
    kv_format, row_bytes = V32_FORMATS[D]
    if q.stride(-1) != 1:
        return "q's last dimension is not contiguous"
    if T < 1:
        return "no tokens"
    if H not in SERVED_HEADS:
        return f"q has {H} heads (served: {', '.join(map(str, SERVED_HEADS))})"
    if not isinstance(kv_cache, torch.Tensor) or kv_cache.dim() != 3:
        return "kv_cache is not [num_pages, page_size, bytes]"
    if kv_cache.shape[2] != row_bytes:
        bpt = kv_cache.shape[2]
        return f"kv_cache has {bpt} bytes per token (served with q's head dim {D}: {row_bytes}, {kv_format})"
    if kv_cache.dtype not in _CACHE_DTYPES:
        return f"kv_cache is {kv_cache.dtype} (served: uint8 or float8_e4m3fn bytes)"
    if kv_cache.shape[0] < 1 or kv_cache.shape[1] < 1:
        return "kv_cache is empty"
    if not kv_cache.is_contiguous():
        return f"kv_cache has strides {list(kv_cache.stride())} (served: contiguous rows)"
    if not isinstance(indices, torch.Tensor) or indices.dim() != 2 or indices.shape[0] != T or indices.shape[1] < 1:
        return f"indices are not [{T}, topk]"
    if indices.dtype not in (torch.int32, torch.int64):
        return f"indices are {indices.dtype} (served: int32 or int64)"
    return device_reason(q, {q.device, kv_cache.device, indices.device})


def _v32_signature(q, kv_cache, indices) -> tuple:
    def sig(t):
        if not isinstance(t, torch.Tensor):
            return ("not a tensor", type(t).__name__)
        return (tuple(t.shape), tuple(t.stride()), t.dtype, t.device)

    return (sig(q), sig(kv_cache), sig(indices))


def _v32_route(q, kv_cache, indices) -> _Route | str:
    key = _v32_signature(q, kv_cache, indices)
    route = _ROUTES.get(key)
    if route is not None:
        return route
    with _LOCK:
        route = _ROUTES.get(key)
        if route is not None:
            return route
        route = v32_leave_reason(q, kv_cache, indices)
        shape = list(q.shape[1:]) if isinstance(q, torch.Tensor) else type(q).__name__
        if route is None:
            T, H, _ = q.shape
            topk = indices.shape[1]
            kv_format = v32_format(q)
            class_key = ("v32", q.device, H, tuple(kv_cache.shape[1:]), kv_cache.dtype, topk, indices.dtype)
            route = _CLASSES.get(class_key)
            if route is None:
                found = coverage(q.device, kv_format, H, topk)
                if isinstance(found, str):
                    route = found
                elif found is None:
                    route = _Route(q.device, kv_format, H, topk, None, None)
                else:
                    route = _Route(q.device, kv_format, H, topk, *found[:2])
                    route.origin, route.tune = found[2:]
                _CLASSES[class_key] = route
            if isinstance(route, _Route) and not route.serves(T):
                h, k = route.shape
                route = (
                    f"T = {T} tokens above the largest batch ({route.max_rows}) of the table of heads={h}, topk={k} "
                    f"(to tune larger batches: {tune_command(kv_format, H, topk, engine='vllm', batch=T)})"
                )
        if isinstance(route, _Route):
            _log_once(
                ("serve", str(shape), tuple(kv_cache.shape[1:]), indices.shape[1]),
                logging.INFO,
                "sparse-MLA plugin serves %s (%s): q [T, %s], kv_cache [..., %s] with %s",
                V32_SLOT,
                route.kv_format,
                ", ".join(map(str, shape)),
                ", ".join(map(str, kv_cache.shape[1:])),
                route.how(),
            )
        else:
            _log_once(
                ("leave", str(shape), route),
                logging.INFO,
                "sparse-MLA plugin leaves q [T, %s] to vLLM's %s: %s",
                ", ".join(map(str, shape)) if isinstance(shape, list) else shape,
                V32_SLOT,
                route,
            )
        _ROUTES[key] = route
        return route


def _v32_launch(route: _Route, q, kv_cache, indices, scale) -> torch.Tensor:
    if indices.dtype != torch.int32 or not indices.is_contiguous():
        indices = indices.to(torch.int32).contiguous()
    out, _ = decode.sparse_mla_decode(
        q,
        kv_cache.view(torch.uint8),
        indices,
        kv_format=route.kv_format,
        sm_scale=float(scale),
        config=route.config(q.shape[0]),
    )
    return out


def serve_v32(q, kv_cache, indices, scale) -> torch.Tensor | None:
    """``out [T, H, 512]`` bf16 from the tuned kernel for a covered ``_run_mqa_kernel`` call of vLLM's
    ``FLASHINFER_MLA_SPARSE_SM120`` (``q [T, H, 576]`` bf16 with ``kv_cache [num_pages, 64, 656]`` fp8_ds_mla bytes,
    or without RoPE ``q [T, H, 512]`` with ``[num_pages, 64, 528]``; ``indices [T, topk]`` flat rows, -1 none;
    ``scale`` the softmax scale); None: the caller runs vLLM's own."""
    if not enabled():
        return None
    try:
        route = _v32_route(q, kv_cache, indices)
        if isinstance(route, str):
            return None
        if not route.warm and q.device.type == "cuda" and not torch.cuda.is_current_stream_capturing():
            route.warm = True  # a first call under capture warms nothing (the launches would be captured)
            warm_up_v32_like(q, kv_cache, indices, scale)
        return _v32_launch(route, q, kv_cache, indices, scale)
    except Exception as e:  # never into the engine: vLLM's own kernel serves
        _log_once(("error", type(e).__name__), logging.WARNING, "sparse-MLA plugin: left to vLLM after %r", e)
        return None


def warm_up_v32_like(q, kv_cache, indices, scale, token_counts=None) -> list[tuple[int, KernelConfig]]:
    """Launch the kernel once at every token count the plugin serves for this call's shape (default: up to the
    table's largest batch, else :data:`CAPTURE_SIZES`), on the engine's cache with every index -1, so that every
    config and binary the tables can pick is compiled before vLLM captures its CUDA graphs. Returns
    ``(tokens, config)`` per launch."""
    route = _v32_route(q, kv_cache, indices)
    if isinstance(route, str):
        return []
    done = []
    for t in warm_counts(route, token_counts, CAPTURE_SIZES):
        small_q = q.new_zeros(t, q.shape[1], q.shape[2])
        small_idx = torch.full((t, indices.shape[1]), -1, dtype=torch.int32, device=q.device)
        _v32_launch(route, small_q, kv_cache, small_idx, scale)
        done.append((t, route.config(t)))
    if q.device.type == "cuda":
        torch.cuda.synchronize(q.device)
    return done


# --- DeepSeek-V4 (opt-in): DeepseekV4FlashInferSM120Attention._forward_decode --------------------------


def serve_v4_decode(layer, q, kv_cache, swa_metadata, attn_metadata, swa_only, output) -> bool:
    """Run one decode of vLLM's ``DeepseekV4FlashInferSM120Attention`` (V4's or V4.1's) on the tuned kernel when the
    SGLang plugin's V4 rule covers it (the same FlashMLA-form arguments: the 584-byte window cache and, on
    compressed layers, the compressed cache with its global top-k indices, the sink, per-token lengths); writes
    ``output`` and returns True. False (nothing written): vLLM's own ``_forward_decode`` runs. The index derivation
    is vLLM 0.34.0's own (``compute_global_topk_indices_and_lens``, V4's or V4.1's); it is not yet checked against
    FlashInfer on an sm_12x GPU, hence opt-in (``SPARSE_MLA_VLLM_V4=1``)."""
    if not v4_enabled():
        return False
    try:
        from . import sglang_plugin

        kw = _v4_kwargs(layer, q, kv_cache, swa_metadata, attn_metadata, swa_only, output)
        if kw is None:
            return False
        result = sglang_plugin.sglang_hook(lambda **_: None, **kw)
        if result is None:
            return False
        output.copy_(result[0].squeeze(1))
        return True
    except Exception as e:  # never into the engine
        _log_once(("v4 error", type(e).__name__), logging.WARNING, "sparse-MLA plugin: V4 left to vLLM after %r", e)
        return False


def _v4_kwargs(layer, q, kv_cache, swa_metadata, attn_metadata, swa_only, output) -> dict | None:
    """vLLM's decode arguments in FlashMLA's keyword form (what ``flash_mla_with_kvcache_sm120`` takes); None
    where vLLM's metadata lacks a part (vLLM's own method then raises its own error). V4.1's compressed layers all
    take their indices from the indexer's buffer (``vllm.models.deepseek_v41.common.ops``), as its
    ``_forward_decode`` does; V4's ratio-128 layers from the metadata's precomputed ones."""
    if getattr(layer, "_sparse_mla_v41", False):
        from vllm.models.deepseek_v41.common import ops as fs
    else:
        from vllm.models.deepseek_v4.nvidia import flashinfer_sparse as fs

    n = swa_metadata.num_decode_tokens
    extra_idx = extra_len = None
    if not swa_only:
        if attn_metadata is None or swa_metadata.is_valid_token is None:
            return None
        is_valid = swa_metadata.is_valid_token[:n]
        if layer.compress_ratio == 4 or getattr(layer, "_sparse_mla_v41", False):
            if layer.topk_indices_buffer is None:
                return None
            block_size = attn_metadata.block_size // layer.compress_ratio
            global_indices, extra_len = fs.compute_global_topk_indices_and_lens(
                layer.topk_indices_buffer[:n],
                swa_metadata.token_to_req_indices,
                attn_metadata.block_table[: swa_metadata.num_decodes],
                block_size,
                is_valid,
            )
            extra_idx = global_indices.view(n, 1, -1)
        else:
            extra_idx = attn_metadata.c128a_global_decode_topk_indices
            extra_len = attn_metadata.c128a_decode_topk_lens
        if extra_idx is None or kv_cache is None:
            return None
        extra_idx = extra_idx.view(n, 1, -1)
    swa_indices, swa_lens = swa_metadata.decode_swa_indices, swa_metadata.decode_swa_lens
    if swa_indices is None or swa_lens is None:
        return None
    qp = layer._prepare_query(q, output)
    kw = {
        "q": qp.unsqueeze(1),
        "k_cache": layer._as_sparse_cache(layer.swa_cache_layer.kv_cache),
        "head_dim_v": 512,
        "softmax_scale": float(layer.scale),
        "indices": swa_indices.view(n, 1, -1),
        "topk_length": swa_lens,
        "attn_sink": layer.attn_sink,
    }
    if extra_idx is not None:
        kw.update(
            extra_k_cache=layer._as_sparse_cache(kv_cache),
            extra_indices_in_kvcache=extra_idx,
            extra_topk_length=extra_len,
        )
    return kw
