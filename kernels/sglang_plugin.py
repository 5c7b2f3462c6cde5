"""SGLang plugin: the tuned kernel behind SGLang's sm_120 sparse-MLA decode call, with no fork and no patch.

SGLang (0.5.23) loads the entry points of group ``sglang.srt.plugins`` (``pyproject.toml`` declares
``sparse_mla = "sparse_mla_tuner.kernels.sglang_plugin:register"``). :func:`register` puts :func:`sglang_hook` AROUND
``sglang.kernels.ops.attention.flash_mla_sm120.flash_mla_with_kvcache_sm120``, the function DeepSeek-V4's attention
backend calls on sm_120 with keyword arguments only (for V4.1 too: off SM100 SGLang keeps V4's 584-byte record for
it). The hook serves a call whose shape, format and device the tables cover (see :func:`leave_reason`) with
:func:`kernels.sparse_mla_decode` and the tuned config, and hands every other call, unchanged, to the original. A
second hook, :func:`sglang_v32_hook`, wraps :data:`V32_TARGET`, the call SGLang's DSA backend makes for
DeepSeek-V3.2 / GLM decode on sm_120, by the same rules: the 656-byte ``fp8_v32`` cache (``kv_cache_dim`` 656, RoPE
64) and the 528-byte ``fp8_v32_nope`` one of a model without RoPE (``kv_cache_dim`` 528, ``qk_rope_head_dim`` 0:
GLM-5.3, FlashMLA's ``V32_NO_ROPE``). Which shapes and tables serve is :func:`kernels.coverage.coverage`, the rule
``tuner shapes`` prints; a call the kernel raises on goes back to SGLang (once said, then left). Each distinct call
shape is logged once (logger ``sglang.srt.plugins.sparse_mla``, which goes to SGLang's log): served with which
table, or left and why (with the command that tunes the shape's own table).

- Off without uninstalling: ``SPARSE_MLA_SGLANG=0`` (also ``false``/``off``/``no``), read at load and at every
  call; or leave ``sparse_mla`` out of SGLang's ``SGLANG_PLUGINS`` allow-list.
- The cache is read in place: ``k_cache`` is SGLang's strided view ``[num_pages, page_size, 1, 584]`` (uint8 or
  float8_e4m3fn) of pages padded to ``ceil(page_size * 584 / 576) * 576`` bytes; the kernel takes the page
  stride ``k_cache.stride(0)`` as it is. Only indices that are not contiguous int32 are copied (a few kB).
- CUDA graphs: the config of each ``B * s_q`` rows is resolved once, on the host, and cached, so a captured call
  has a fixed split count; its outputs and split scratch are allocated at capture, in the graph's pool, and
  replays allocate nothing. The hook itself runs no Python at replay.
- Warm: the first call of a new shape outside graph capture (SGLang's warm-up forward passes) runs
  :func:`warm_up_like`, which launches the kernel once at every row count the plugin serves for that shape, so
  every config the tables can pick, and every binary it launches, is compiled and loaded before serving
  (``SGLANG_CRASH_ON_TRITON_LOAD_AFTER_READY`` stays quiet). :func:`warm_up` does the same from shapes alone.

The hook does not import SGLang: it can be called (and checked on a GPU,
``python -m sparse_mla_tuner.kernels.sglang_check``) where SGLang is not installed. Only :func:`register` imports
SGLang's ``HookRegistry``.
"""

from __future__ import annotations

import logging
import os
import threading

import torch

from . import decode
from ._engine import Route
from ._engine import device_reason
from ._engine import warm_counts
from .config import KernelConfig
from .coverage import SERVED_HEADS
from .coverage import coverage
from .coverage import shape_problem
from .decode import device_name
from .kv_format import FORMATS
from .models import tune_command

TARGET = "sglang.kernels.ops.attention.flash_mla_sm120.flash_mla_with_kvcache_sm120"
PLUGIN_NAME = "sparse_mla"  # the entry point's name, as SGLANG_PLUGINS lists it
ENV_SWITCH = "SPARSE_MLA_SGLANG"
KV_FORMAT = "fp8_model1"  # DeepSeek-V4's cache (FlashMLA's "V4"); 584 bytes per token
# DeepSeek-V3.2 and GLM (the 656-byte "V32" cache; the 528-byte "V32_NO_ROPE" one of a model without RoPE): the
# call SGLang's DSA backend makes for decode on sm_120
# (`_forward_flashinfer_sparse_mla`, imported inside the method, so the registry's patch takes effect)
V32_TARGET = "sglang.kernels.ops.attention.flash_mla_sm120.flashinfer_sparse_mla_forward"
# (kv_cache_dim, qk_rope_head_dim) of the DSA call -> the cache format and q's head dim (512 latent + the rope dims)
V32_FORMATS = {(656, 64): ("fp8_v32", 576), (528, 0): ("fp8_v32_nope", 512)}
V32_KEYWORDS = frozenset(
    {
        "q",
        "kv_cache",
        "indices",
        "seq_lens",
        "workspace_buffer",
        "page_size",
        "kv_cache_dim",
        "qk_nope_head_dim",
        "kv_lora_rank",
        "qk_rope_head_dim",
        "sm_scale",
        "skip_softmax_threshold_scale_factor",
    }
)
MAX_Q_TOKENS = 8  # speculative decoding's verify step
CAPTURE_SIZES = (1, 2, 4, 8, *range(16, 97, 8))  # SGLang's default CUDA-graph batch sizes up to 96 (15 sizes)
KEYWORDS = frozenset(
    {
        "q",
        "k_cache",
        "head_dim_v",
        "softmax_scale",
        "indices",
        "topk_length",
        "attn_sink",
        "extra_k_cache",
        "extra_indices_in_kvcache",
        "extra_topk_length",
    }
)
_OFF = ("0", "false", "off", "no")
_ON = ("", "1", "true", "on", "yes")
_CACHE_DTYPES = (torch.uint8, torch.float8_e4m3fn)

logger = logging.getLogger("sglang.srt.plugins.sparse_mla")


def enabled() -> bool:
    """Whether ``SPARSE_MLA_SGLANG`` lets the plugin serve (unset: yes). A value other than
    0/false/off/no or 1/true/on/yes turns it off, with one warning saying what is allowed."""
    value = os.environ.get(ENV_SWITCH, "").strip().lower()
    if value in _ON:
        return True
    if value not in _OFF:
        _log_once(
            ("switch", value),
            logging.WARNING,
            "%s=%r is not one of 0/false/off/no or 1/true/on/yes; the sparse-MLA plugin stays off",
            ENV_SWITCH,
            os.environ.get(ENV_SWITCH),
        )
    return False


def register() -> None:
    """The entry point SGLang's ``load_plugins()`` calls: registers :func:`sglang_hook` AROUND :data:`TARGET`.

    A guest never raises into the engine: an SGLang without the hook registry (releases before it) or any other
    failure to register is one log line, and SGLang's own kernels serve."""
    try:
        _register()
    except Exception as e:  # noqa: BLE001 - whatever it is, the engine must start without us
        logger.warning(
            "sparse-MLA plugin: not registered (%s: %s); SGLang's own kernels serve",
            type(e).__name__,
            " ".join(str(e).split())[:300],
        )


def _register() -> None:
    if not enabled():
        value = os.environ.get(ENV_SWITCH)
        logger.info("sparse-MLA plugin: off (%s=%r); SGLang's own kernels serve", ENV_SWITCH, value)
        return
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry
        from sglang.srt.plugins.hook_registry import HookType
    except ImportError as e:
        logger.warning(
            "sparse-MLA plugin: this SGLang has no plugin hook registry (sglang.srt.plugins.hook_registry: %s); "
            "not registered, SGLang's own kernels serve (the plugin needs SGLang 0.5.23 or later)",
            type(e).__name__,
        )
        return

    HookRegistry.register(TARGET, sglang_hook, HookType.AROUND)
    HookRegistry.register(V32_TARGET, sglang_v32_hook, HookType.AROUND)
    logger.info(
        "sparse-MLA plugin: wraps %s (DeepSeek-V4 and V4.1 decode on sm_120). Serves %s caches (584 B/token, "
        "pages padded or not, uint8 or e4m3) with q [B, s_q <= %d, H in %s, 512] bf16, head_dim_v 512, any top-k, "
        "on a GPU with an exported table for the format (the nearest tuned heads/top-k when the shape has none; B "
        "* s_q up to its largest batch). Leaves every other call to SGLang. Off: %s=0.",
        TARGET,
        KV_FORMAT,
        MAX_Q_TOKENS,
        list(SERVED_HEADS),
        ENV_SWITCH,
    )
    logger.info(
        "sparse-MLA plugin: wraps %s (DeepSeek-V3.2 / GLM DSA decode on sm_120). Serves fp8_v32 caches (656 B/token, "
        "kv_cache_dim 656, RoPE 64, q [T, H, 576]) and fp8_v32_nope caches (V32_NO_ROPE: 528 B/token, kv_cache_dim "
        "528, qk_rope_head_dim 0, q [T, H, 512]), kv_lora_rank 512, q bf16 with H in %s, any top-k, on a GPU with an "
        "exported table for the format (the nearest tuned heads/top-k when the shape has none; T up to its largest "
        "batch). Leaves skip-softmax and every other call to SGLang. Off: %s=0.",
        V32_TARGET,
        list(SERVED_HEADS),
        ENV_SWITCH,
    )


def sglang_hook(original_fn, *args, **kwargs):
    """AROUND hook of ``flash_mla_with_kvcache_sm120(**kwargs)``: ``(out [B, s_q, H, 512] bf16, lse [B, H, s_q])``
    from the tuned kernel for a covered call, else whatever ``original_fn`` returns."""
    if args:
        return original_fn(*args, **kwargs)
    try:
        route = key = None
        if enabled():
            key = _signature(kwargs)
            route = _ROUTES.get(key)
            if route is None:
                route = _route(key, kwargs)
    except Exception as e:  # noqa: BLE001 - an argument that is not what SGLang passes, or a fault of ours
        why = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
        _log_once(("route-failed", type(e).__name__), logging.INFO, "sparse-MLA plugin leaves a call: %s", why)
        return original_fn(*args, **kwargs)
    if route is None or isinstance(route, str):
        return original_fn(*args, **kwargs)
    try:
        return _serve(route, kwargs)
    except Exception as e:  # noqa: BLE001 - our kernel failed this shape: SGLang's own serves it from now on
        why = f"the kernel failed ({type(e).__name__}: {' '.join(str(e).split())[:300]})"
        with _LOCK:
            _ROUTES[key] = why
        _log_once(("serve-failed", key), logging.WARNING, "sparse-MLA plugin leaves this shape to SGLang: %s", why)
        return original_fn(*args, **kwargs)


# --- which calls are served ----------------------------------------------------------------------------


def _cache_sig(cache):
    if not isinstance(cache, torch.Tensor):
        return ("not a tensor", type(cache).__name__)
    return (tuple(cache.shape), tuple(cache.stride()), cache.dtype, cache.device)


def _tensor_sig(t):
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        return ("not a tensor", type(t).__name__)
    return (tuple(t.shape), t.dtype, t.device)


def _signature(kw: dict) -> tuple:
    """What decides the route: every argument's shape, dtype, device (and the caches' strides)."""
    q, idx, eidx = kw.get("q"), kw.get("indices"), kw.get("extra_indices_in_kvcache")
    return (
        tuple(sorted(kw)),
        _tensor_sig(q),
        q.stride(-1) if isinstance(q, torch.Tensor) and q.dim() else None,
        _cache_sig(kw.get("k_cache")),
        _tensor_sig(idx),
        _tensor_sig(kw.get("topk_length")),
        _tensor_sig(kw.get("attn_sink")),
        None if kw.get("extra_k_cache") is None else _cache_sig(kw.get("extra_k_cache")),
        _tensor_sig(eidx),
        _tensor_sig(kw.get("extra_topk_length")),
        kw.get("head_dim_v"),
        type(kw.get("softmax_scale")).__name__,
    )


def _cache_problem(name: str, cache) -> str | None:
    if not isinstance(cache, torch.Tensor) or cache.dim() != 4 or cache.shape[2] != 1:
        return f"{name} is not [num_pages, page_size, 1, bytes]"
    if cache.shape[3] != FORMATS[KV_FORMAT].bytes_per_token:
        return f"{name} has {cache.shape[3]} bytes per token (served: 584, DeepSeek-V4's layout)"
    if cache.dtype not in _CACHE_DTYPES:
        return f"{name} is {cache.dtype} (served: uint8 or float8_e4m3fn bytes)"
    pages, page_size = cache.shape[0], cache.shape[1]
    if pages < 1 or page_size < 1:
        return f"{name} is empty"
    if cache.stride(1) != 584 or cache.stride(3) != 1:
        return f"{name} has token strides {list(cache.stride())} (served: 584 bytes per token, in place)"
    if pages > 1 and (cache.stride(0) < page_size * 584 or cache.stride(0) % 4):
        return f"{name} has a page stride of {cache.stride(0)} bytes (served: >= page_size * 584, a multiple of 4)"
    return None


def _index_problem(name: str, idx, lead: tuple) -> str | None:
    if not isinstance(idx, torch.Tensor) or idx.dim() != 3 or tuple(idx.shape[:2]) != lead or idx.shape[2] < 1:
        return f"{name} is not [{lead[0]}, {lead[1]}, topk]"
    if idx.dtype not in (torch.int32, torch.int64):
        return f"{name} is {idx.dtype} (served: int32 or int64)"
    return None


def _length_problem(name: str, t, B: int) -> str | None:
    if t is not None and (not isinstance(t, torch.Tensor) or tuple(t.shape) != (B,) or t.is_floating_point()):
        return f"{name} is not an integer [{B}] tensor"
    return None


def leave_reason(kw: dict) -> str | None:
    """Why a call goes to the original (None: the kernel serves it, subject to the device's tables)."""
    unknown = sorted(set(kw) - KEYWORDS)
    if unknown:
        return f"unknown arguments {unknown}"
    q = kw.get("q")
    if not isinstance(q, torch.Tensor) or q.dim() != 4 or q.shape[-1] != 512 or q.dtype != torch.bfloat16:
        return "q is not [B, s_q, H, 512] bf16"
    if q.stride(-1) != 1:
        return "q's last dimension is not contiguous"
    B, s_q, H, _ = q.shape
    if B < 1:
        return "the batch is empty"
    idx = kw.get("indices")
    topk = idx.shape[-1] if isinstance(idx, torch.Tensor) and idx.dim() else 1
    problem = shape_problem(KV_FORMAT, H, topk, s_q)  # the rule `tuner shapes` prints
    if problem:
        return problem
    if kw.get("head_dim_v") != 512:
        return f"head_dim_v is {kw.get('head_dim_v')!r} (served: 512)"
    scale = kw.get("softmax_scale")
    if scale is not None and not isinstance(scale, (int, float)):
        return "softmax_scale is not a number"
    problem = _cache_problem("k_cache", kw.get("k_cache")) or _index_problem("indices", kw.get("indices"), (B, s_q))
    problem = problem or _length_problem("topk_length", kw.get("topk_length"), B)
    if problem:
        return problem
    extra, eidx = kw.get("extra_k_cache"), kw.get("extra_indices_in_kvcache")
    if (extra is None) != (eidx is None):
        return "extra_k_cache and extra_indices_in_kvcache are not given together"
    if extra is None and kw.get("extra_topk_length") is not None:
        return "extra_topk_length without an extra cache"
    if extra is not None:
        problem = _cache_problem("extra_k_cache", extra) or _index_problem("extra_indices_in_kvcache", eidx, (B, s_q))
        problem = problem or _length_problem("extra_topk_length", kw.get("extra_topk_length"), B)
        if problem:
            return problem
    sink = kw.get("attn_sink")
    if sink is not None and (
        not isinstance(sink, torch.Tensor) or tuple(sink.shape) != (H,) or sink.dtype != torch.float32
    ):
        return f"attn_sink is not a [{H}] float32 tensor"
    tensors = [kw.get(k) for k in KEYWORDS if isinstance(kw.get(k), torch.Tensor)]
    return device_reason(q, {t.device for t in tensors})


class _Route(Route):
    """A served shape class (any batch size; rows are B * s_q, V3.2's T): :class:`kernels._engine.Route`, with
    where its table comes from (``origin``) and the command that would tune the shape's own (``tune``)."""

    def __init__(self, device: torch.device, heads: int, topk: int, shape, max_rows, kv_format: str = KV_FORMAT):
        super().__init__(device, kv_format, heads, topk, shape, max_rows)
        self.origin, self.tune = "default", None


_ROUTES: dict[tuple, _Route | str] = {}  # by the call's whole signature
_CLASSES: dict[tuple, _Route | str] = {}  # by the signature less the batch size
_SHAPES: dict[tuple, tuple | str | None] = {}  # (device, heads, topk) -> the tuned shape serving it
_LOCK = threading.RLock()
_logged: set = set()


def _log_once(key, level, msg, *args) -> None:
    if key not in _logged:
        _logged.add(key)
        logger.log(level, msg, *args)


def largest_batch(device: str, heads: int, topk: int, kv_format: str = KV_FORMAT) -> int:
    """The largest batch key of the table ``lookup_config`` reads for this shape (0: none usable)."""
    from .coverage import largest_batch as largest

    return largest(device, kv_format, heads, topk)


def _class_key(kw: dict) -> tuple:
    """A call's signature less its batch size: the calls of one shape at every batch size share it."""
    q, kc, idx = kw["q"], kw["k_cache"], kw["indices"]
    extra, eidx = kw.get("extra_k_cache"), kw.get("extra_indices_in_kvcache")
    geometry = None if extra is None else (tuple(extra.shape[1:]), extra.stride(0), extra.dtype, eidx.shape[-1])
    flags = tuple(kw.get(k) is None for k in ("topk_length", "attn_sink", "extra_topk_length"))
    return (q.device, tuple(q.shape[1:]), tuple(kc.shape[1:]), kc.stride(0), kc.dtype, idx.shape[-1], geometry, flags)


def _table_for(device: torch.device, heads: int, topk: int, kv_format: str = KV_FORMAT):
    """:func:`kernels.coverage.coverage` of the shape on ``device`` (the rule ``tuner shapes`` prints): the tuned
    shape whose table serves it and that table's largest batch, None on the interpreter without a table (the
    default config serves), or why it is left (with the command that would tune it)."""
    key = (device, kv_format, heads, topk)
    found = _SHAPES.get(key)
    if found is None and key not in _SHAPES:
        c = coverage(kv_format, heads, topk, device_name=device_name(device))
        if not c.served:
            found = c.reason + (f" (to tune it: {c.tune})" if c.tune else "")
        elif c.origin == "default":
            found = None
        else:
            found = (c.tuned, c.max_rows, c.origin, c.tune)
        _SHAPES[key] = found
    return found


def _route_of(q: torch.Tensor, heads: int, topk: int, kv_format: str) -> _Route | str:
    table = _table_for(q.device, heads, topk, kv_format)
    if isinstance(table, str):
        return table
    if table is None:  # Triton's interpreter (tests) without a table: every legal call, the default config
        return _Route(q.device, heads, topk, None, None, kv_format)
    route = _Route(q.device, heads, topk, table[0], table[1], kv_format)
    route.origin, route.tune = table[2], table[3]
    return route


def _shape_class(kw: dict) -> _Route | str:
    """The route of a call that :func:`leave_reason` accepted, shared by every batch size of its shape."""
    key = _class_key(kw)
    route = _CLASSES.get(key)
    if route is None:
        q = kw["q"]
        route = _route_of(q, q.shape[2], kw["indices"].shape[-1], KV_FORMAT)
        _CLASSES[key] = route
    return route


def _how(route: _Route) -> str:
    if route.shape is None:
        return "the default config (interpreter)"
    how = f"the table of heads={route.shape[0]}, topk={route.shape[1]}, B * s_q up to {route.max_rows}"
    if route.origin != "measured":
        how += f" ({route.origin}: to tune this shape's own table, {route.tune})"
    return how


def _cached_route(key: tuple, kw: dict, leave, shape_class, rows_name: str, rows, log) -> _Route | str:
    """The route of the call signature ``key``, resolved once (``log(route, kw)`` then says it): why ``leave``
    leaves the call, else its ``shape_class`` route unless its ``rows(q)`` (named ``rows_name``) pass the largest
    batch of the table (then why, with the command that tunes larger batches)."""
    with _LOCK:
        route = _ROUTES.get(key)
        if route is not None:
            return route
        route = leave(kw) or shape_class(kw)
        if isinstance(route, _Route) and not route.serves(rows(kw["q"])):
            h, k = route.shape
            q = kw["q"]  # V4: [B, s_q, H, D] (a verify step's rows are B * s_q); V3.2/GLM: [T, H, D]
            s_q = q.shape[1] if q.dim() == 4 else 1
            command = tune_command(route.kv_format, route.heads, route.topk, batch=q.shape[0], q_tokens=s_q)
            route = (
                f"{rows_name} above the largest batch ({route.max_rows}) of the table of heads={h}, topk={k} (to "
                f"tune larger batches: {command})"
            )
        log(route, kw)
        _ROUTES[key] = route
        return route


def _route(key: tuple, kw: dict) -> _Route | str:
    return _cached_route(key, kw, leave_reason, _shape_class, "B * s_q", lambda q: q.shape[0] * q.shape[1], _say)


def _say(route: _Route | str, kw: dict) -> None:
    """Logs once per shape which DeepSeek-V4 calls are served (and how) or left (and why)."""
    q = kw.get("q")
    shape = list(q.shape[1:]) if isinstance(q, torch.Tensor) else type(q).__name__
    if isinstance(route, _Route):
        how = _how(route)
        extra = kw.get("extra_k_cache")
        _log_once(
            ("serve", _class_key(kw)),
            logging.INFO,
            "sparse-MLA plugin serves q [B, %s], k_cache [..., %s] (page stride %d B)%s with %s",
            ", ".join(map(str, shape)),
            ", ".join(map(str, kw["k_cache"].shape[1:])),
            kw["k_cache"].stride(0),
            ""
            if extra is None
            else f" and extra_k_cache [..., {', '.join(map(str, extra.shape[1:]))}] (page stride {extra.stride(0)} B)",
            how,
        )
    else:
        _log_once(
            ("leave", str(shape), route),
            logging.INFO,
            "sparse-MLA plugin leaves q [B, %s] to SGLang: %s",
            ", ".join(map(str, shape)) if isinstance(shape, list) else shape,
            route,
        )


# --- serving -----------------------------------------------------------------------------------------


def _fall_back(key: tuple, error: Exception, original_fn, kwargs: dict):
    """A served call whose launch failed: said once (WARNING), the shape left to SGLang, and this call too."""
    reason = f"the kernel failed on it ({type(error).__name__}: {' '.join(str(error).split())[:300]})"
    with _LOCK:
        _ROUTES[key] = reason
    _log_once(("failed", key), logging.WARNING, "sparse-MLA plugin leaves this shape to SGLang: %s", reason)
    return original_fn(**kwargs)


def _pages(cache: torch.Tensor) -> torch.Tensor:
    """``[num_pages, page_size, 1, 584]`` bytes -> the kernel's ``[num_pages, page_size, 584]`` uint8, a view."""
    return cache.view(torch.uint8).squeeze(2)


def _idx(t):
    return t if t is None or (t.dtype == torch.int32 and t.is_contiguous()) else t.to(torch.int32).contiguous()


def _serve(route: _Route, kw: dict, *, warming: bool = False):
    q = kw["q"]
    B, s_q = q.shape[0], q.shape[1]
    rows = B * s_q
    if not warming and not route.warm and q.device.type == "cuda" and not torch.cuda.is_current_stream_capturing():
        route.warm = True  # a first call under capture warms nothing (the launches would be captured)
        warm_up_like(kw)
    extra = kw.get("extra_k_cache")
    extra_kw = {}
    if extra is not None:
        extra_kw = {
            "extra_kv_cache": _pages(extra),
            "extra_indices": _idx(kw["extra_indices_in_kvcache"]),
            "extra_kv_format": KV_FORMAT,
            "extra_topk_length": _idx(kw.get("extra_topk_length")),
        }
    scale = kw.get("softmax_scale")
    return decode.sparse_mla_decode(
        q,
        _pages(kw["k_cache"]),
        _idx(kw["indices"]),
        kv_format=KV_FORMAT,
        sm_scale=q.shape[-1] ** -0.5 if scale is None else float(scale),
        topk_length=_idx(kw.get("topk_length")),
        attn_sink=kw.get("attn_sink"),
        config=route.config(rows),
        **extra_kw,
    )


def warm_up_like(kw: dict, batch_sizes=None) -> list[tuple[int, KernelConfig]]:
    """Launch the kernel once at every row count the plugin serves for the shape of ``kw`` (an engine call's
    keyword arguments), on its caches (read only: every index is -1) with small fresh q, indices and outputs,
    so that every config and binary the tables can pick is compiled and loaded. ``batch_sizes``: the requests
    per call to warm (default: every one the route serves, up to the tables' largest batch, else
    :data:`CAPTURE_SIZES`). Returns ``(rows, config)`` per launch."""
    with _LOCK:
        route = leave_reason(kw) or _shape_class(kw)
    if isinstance(route, str):
        return []
    q = kw["q"]
    s_q, H = q.shape[1], q.shape[2]
    done = []
    for b in warm_counts(route, batch_sizes, CAPTURE_SIZES, s_q):
        small = dict(kw)
        small["q"] = q.new_zeros(b, s_q, H, q.shape[3])
        small["indices"] = torch.full((b, s_q, kw["indices"].shape[-1]), -1, dtype=torch.int32, device=q.device)
        for name in ("topk_length", "extra_topk_length"):
            if kw.get(name) is not None:
                small[name] = torch.ones(b, dtype=torch.int32, device=q.device)
        if kw.get("extra_k_cache") is not None:
            e = kw["extra_indices_in_kvcache"]
            small["extra_indices_in_kvcache"] = torch.full(
                (b, s_q, e.shape[-1]), -1, dtype=torch.int32, device=q.device
            )
        _serve(route, small, warming=True)
        done.append((b * s_q, route.config(b * s_q)))
    if q.device.type == "cuda":
        torch.cuda.synchronize(q.device)
    return done


def page_bytes(page_size: int) -> int:
    """SGLang's page of ``page_size`` DeepSeek-V4 tokens: ``ceil(page_size * 584 / 576) * 576`` bytes (padded)."""
    return -(-page_size * 584 // 576) * 576


def engine_cache(pages: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    """A copy of a contiguous ``[num_pages, page_size, 584]`` uint8 cache in SGLang's layout: padded pages, seen
    through the strided view ``[num_pages, page_size, 1, 584]`` SGLang passes (for tests and checks; the hook
    never copies a cache)."""
    num_pages, page_size, bpt = pages.shape
    stride = page_bytes(page_size)
    buf = torch.zeros(num_pages, stride, dtype=torch.uint8, device=pages.device)
    buf[:, : page_size * bpt] = pages.reshape(num_pages, page_size * bpt)
    return buf.view(dtype).as_strided((num_pages, page_size, 1, bpt), (stride, bpt, bpt, 1))


def warm_up(
    *,
    heads: int,
    topk: int,
    page_size: int = 256,
    extra_topk: int | None = None,
    extra_page_size: int = 64,
    q_tokens: int = 1,
    attn_sink: bool = True,
    topk_length: bool = True,
    batch_sizes=None,
    device: str | torch.device = "cuda",
) -> list[tuple[int, KernelConfig]]:
    """:func:`warm_up_like` from shapes alone: SGLang's call of ``heads`` local heads, a window cache of
    ``page_size``-token padded pages with ``topk`` indices and, with ``extra_topk``, a compressed cache of
    ``extra_page_size``-token pages (two pages each; every index is -1)."""
    device = torch.device(device)
    cache = engine_cache(torch.zeros(2, page_size, 584, dtype=torch.uint8, device=device))
    kw = {
        "q": torch.zeros(1, q_tokens, heads, 512, dtype=torch.bfloat16, device=device),
        "k_cache": cache,
        "head_dim_v": 512,
        "softmax_scale": 512**-0.5,
        "indices": torch.full((1, q_tokens, topk), -1, dtype=torch.int32, device=device),
        "topk_length": torch.ones(1, dtype=torch.int32, device=device) if topk_length else None,
        "attn_sink": torch.zeros(heads, dtype=torch.float32, device=device) if attn_sink else None,
    }
    if extra_topk:
        kw["extra_k_cache"] = engine_cache(torch.zeros(2, extra_page_size, 584, dtype=torch.uint8, device=device))
        kw["extra_indices_in_kvcache"] = torch.full((1, q_tokens, extra_topk), -1, dtype=torch.int32, device=device)
        kw["extra_topk_length"] = torch.ones(1, dtype=torch.int32, device=device) if topk_length else None
    return warm_up_like(kw, batch_sizes)


# --- DeepSeek-V3.2 / GLM: SGLang's DSA decode on sm_120 (flashinfer_sparse_mla_forward) ---------------------


def sglang_v32_hook(original_fn, *args, **kwargs):
    """AROUND hook of ``flashinfer_sparse_mla_forward(q, kv_cache, indices, seq_lens, workspace_buffer, *, page_size,
    kv_cache_dim, qk_nope_head_dim, kv_lora_rank, qk_rope_head_dim, sm_scale, skip_softmax_threshold_scale_factor)``:
    ``out [T, H, 512]`` bf16 from the tuned kernel for a covered call, else whatever ``original_fn`` returns."""
    if args or not enabled():
        return original_fn(*args, **kwargs)
    try:
        key = _v32_signature(kwargs)
    except Exception:  # an argument that is not what SGLang passes: not ours to judge
        return original_fn(*args, **kwargs)
    route = _ROUTES.get(key)
    if route is None:
        route = _v32_route(key, kwargs)
    if isinstance(route, str):
        return original_fn(*args, **kwargs)
    try:
        return _v32_serve(route, kwargs)
    except Exception as e:  # never the engine's crash: this shape goes back to SGLang from now on
        return _fall_back(key, e, original_fn, kwargs)


def _v32_signature(kw: dict) -> tuple:
    q, kv = kw.get("q"), kw.get("kv_cache")
    scalars = tuple(
        (k, kw.get(k)) for k in ("page_size", "kv_cache_dim", "qk_nope_head_dim", "kv_lora_rank", "qk_rope_head_dim")
    )
    return (
        "v32",
        tuple(sorted(kw)),
        _tensor_sig(q),
        tuple(q.stride()) if isinstance(q, torch.Tensor) else None,
        _cache_sig(kv) if isinstance(kv, torch.Tensor) else ("not a tensor", type(kv).__name__),
        kv.is_contiguous() if isinstance(kv, torch.Tensor) else None,
        _tensor_sig(kw.get("indices")),
        _tensor_sig(kw.get("seq_lens")),
        scalars,
        type(kw.get("sm_scale")).__name__,
        kw.get("skip_softmax_threshold_scale_factor") is None,
    )


def v32_format(kw: dict) -> tuple[str, int] | None:
    """The cache format of a ``flashinfer_sparse_mla_forward`` call and q's head dim, from its ``kv_cache_dim`` and
    ``qk_rope_head_dim`` (with ``kv_lora_rank`` 512); None for any other geometry."""
    if kw.get("kv_lora_rank") != 512:
        return None
    try:
        return V32_FORMATS.get((kw.get("kv_cache_dim"), kw.get("qk_rope_head_dim")))
    except TypeError:  # an unhashable argument
        return None


def v32_leave_reason(kw: dict) -> str | None:
    """Why a ``flashinfer_sparse_mla_forward`` call goes to the original (None: the kernel serves it, subject to
    the device's tables)."""
    unknown = sorted(set(kw) - V32_KEYWORDS)
    if unknown:
        return f"unknown arguments {unknown}"
    found = v32_format(kw)
    if found is None:
        dim, rope, rank = kw.get("kv_cache_dim"), kw.get("qk_rope_head_dim"), kw.get("kv_lora_rank")
        return (
            f"kv_cache_dim {dim!r}, kv_lora_rank {rank!r}, qk_rope_head_dim {rope!r} (served: 656, 512, 64 for V32; "
            "528, 512, 0 for V32_NO_ROPE)"
        )
    kv_format, width = found
    bpt = FORMATS[kv_format].bytes_per_token
    if kw.get("skip_softmax_threshold_scale_factor") is not None:
        return "skip_softmax_threshold_scale_factor is set (FlashInfer's approximate softmax stays SGLang's)"
    q = kw.get("q")
    if not isinstance(q, torch.Tensor) or q.dim() != 3 or q.shape[-1] != width or q.dtype != torch.bfloat16:
        return f"q is not [T, H, {width}] bf16"
    if q.stride(-1) != 1:
        return "q's last dimension is not contiguous"
    T, H, _ = q.shape
    if T < 1:
        return "the batch is empty"
    idx = kw.get("indices")
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.shape[0] != T or idx.shape[1] < 1:
        return f"indices is not [{T}, topk]"
    if idx.dtype not in (torch.int32, torch.int64):
        return f"indices is {idx.dtype} (served: int32 or int64)"
    problem = shape_problem(kv_format, H, idx.shape[1], 1)  # the rule `tuner shapes` prints
    if problem:
        return problem
    problem = _length_problem("seq_lens", kw.get("seq_lens"), T)
    if problem:
        return problem
    page_size, kv = kw.get("page_size"), kw.get("kv_cache")
    if not isinstance(page_size, int) or page_size < 1:
        return f"page_size is {page_size!r} (served: a positive integer)"
    if not isinstance(kv, torch.Tensor) or kv.dtype not in _CACHE_DTYPES or not kv.is_contiguous():
        return "kv_cache is not a contiguous uint8 or float8_e4m3fn tensor"
    if kv.numel() == 0 or kv.numel() % (page_size * bpt):
        return f"kv_cache holds {kv.numel()} bytes, not whole pages of {page_size} tokens of {bpt} bytes"
    scale = kw.get("sm_scale")
    if not isinstance(scale, (int, float)):
        return "sm_scale is not a number"
    tensors = [t for t in (q, kv, idx, kw.get("seq_lens")) if isinstance(t, torch.Tensor)]
    return device_reason(q, {t.device for t in tensors})


def _v32_class_key(kw: dict) -> tuple:
    q = kw["q"]
    fmt = v32_format(kw)[0]
    return ("v32", fmt, q.device, q.shape[1], kw["indices"].shape[1], kw["seq_lens"] is None, kw["page_size"])


def _v32_shape_class(kw: dict) -> _Route | str:
    key = _v32_class_key(kw)
    route = _CLASSES.get(key)
    if route is None:
        q = kw["q"]
        route = _route_of(q, q.shape[1], kw["indices"].shape[1], v32_format(kw)[0])
        _CLASSES[key] = route
    return route


def _v32_route(key: tuple, kw: dict) -> _Route | str:
    return _cached_route(key, kw, v32_leave_reason, _v32_shape_class, "T", lambda q: q.shape[0], _v32_say)


def _v32_say(route: _Route | str, kw: dict) -> None:
    """Logs once per shape which V3.2/GLM calls are served (and how) or left (and why)."""
    q = kw.get("q")
    shape = list(q.shape[1:]) if isinstance(q, torch.Tensor) else [type(q).__name__]
    found = v32_format(kw)
    name = found[0] if found else f"kv_cache_dim {kw.get('kv_cache_dim')!r}"
    if isinstance(route, _Route):
        _log_once(
            ("serve", _v32_class_key(kw)),
            logging.INFO,
            "sparse-MLA plugin serves %s q [T, %s], kv_cache %s-token pages of %d B, top-k %d with %s",
            name,
            ", ".join(map(str, shape)),
            kw["page_size"],
            kw["kv_cache_dim"],
            kw["indices"].shape[1],
            _how(route),
        )
    else:
        _log_once(
            ("leave", "v32", name, str(shape), route),
            logging.INFO,
            "sparse-MLA plugin leaves %s q [T, %s] to SGLang: %s",
            name,
            ", ".join(map(str, shape)),
            route,
        )


def _v32_serve(route: _Route, kw: dict, *, warming: bool = False):
    q = kw["q"]
    if not warming and not route.warm and q.device.type == "cuda" and not torch.cuda.is_current_stream_capturing():
        route.warm = True
        warm_up_v32_like(kw)
    pages = kw["kv_cache"].view(torch.uint8).view(-1, kw["page_size"], kw["kv_cache_dim"])
    out, _ = decode.sparse_mla_decode(
        q,
        pages,
        _idx(kw["indices"]),
        kv_format=route.kv_format,
        sm_scale=float(kw["sm_scale"]),
        topk_length=_idx(kw.get("seq_lens")),
        config=route.config(q.shape[0]),
    )
    return out


def warm_up_v32_like(kw: dict, batch_sizes=None) -> list[tuple[int, KernelConfig]]:
    """:func:`warm_up_like` for a ``flashinfer_sparse_mla_forward`` call: one launch at every ``T`` the plugin
    serves for its shape (default: up to the table's largest batch, else :data:`CAPTURE_SIZES`), on its cache with
    every index -1. Returns ``(T, config)`` per launch."""
    with _LOCK:
        route = v32_leave_reason(kw) or _v32_shape_class(kw)
    if isinstance(route, str):
        return []
    q = kw["q"]
    done = []
    for t in warm_counts(route, batch_sizes, CAPTURE_SIZES):
        small = dict(kw)
        small["q"] = q.new_zeros(t, q.shape[1], q.shape[2])
        small["indices"] = torch.full((t, kw["indices"].shape[1]), -1, dtype=torch.int32, device=q.device)
        if kw.get("seq_lens") is not None:
            small["seq_lens"] = torch.ones(t, dtype=torch.int32, device=q.device)
        _v32_serve(route, small, warming=True)
        done.append((t, route.config(t)))
    if q.device.type == "cuda":
        torch.cuda.synchronize(q.device)
    return done


def v32_engine_call(
    q: torch.Tensor, pages: torch.Tensor, indices: torch.Tensor, seq_lens=None, *, sm_scale: float | None = None
) -> dict:
    """SGLang's keyword arguments of ``flashinfer_sparse_mla_forward`` for a contiguous ``[num_pages, page_size,
    bytes]`` cache, 656 bytes (``fp8_v32``, q ``[T, H, 576]``) or 528 (``fp8_v32_nope``, q ``[T, H, 512]``, no RoPE):
    the cache passed as SGLang's pool buffer ``[tokens, 1, bytes]`` float8_e4m3fn (for tests and checks; the hook
    never copies a cache)."""
    num_pages, page_size, bpt = pages.shape
    rope = 64 if bpt == 656 else 0
    return {
        "q": q,
        "kv_cache": pages.view(torch.float8_e4m3fn).view(num_pages * page_size, 1, bpt),
        "indices": indices,
        "seq_lens": seq_lens,
        "workspace_buffer": torch.empty(0, dtype=torch.uint8, device=q.device),
        "page_size": page_size,
        "kv_cache_dim": bpt,
        "qk_nope_head_dim": 192 if rope else 256,  # GLM-5's and GLM-5.3's (informative: the call does not use it)
        "kv_lora_rank": 512,
        "qk_rope_head_dim": rope,
        "sm_scale": (512 + rope) ** -0.5 if sm_scale is None else sm_scale,
        "skip_softmax_threshold_scale_factor": None,
    }
