"""Model presets: the sparse-MLA decode calls an engine makes for a model at a tensor-parallel size.

Pure data and arithmetic (no torch, no Triton): the tuner builds a search space from a preset (``tuner search
--model deepseek-v4-flash --tp 4``), and the engine plugins name that command in their log when they leave a
shape to the engine (:func:`tune_command`).

A preset holds what the model's config fixes: the attention heads (split over TP ranks), the cache format and
each cache's top-k (DeepSeek-V4's sliding window and compressed cache, with the attention sink; V3.2 and GLM-5
one 656-byte cache). The engine fixes the rest: the CUDA-graph batch sizes it captures (:data:`CAPTURE_SIZES`),
and with speculative decoding the verify step's query tokens per request (``q_tokens``, 1 to 8).

Facts (from each model's published ``config.json``: ``num_attention_heads``, ``index_topk``, the window):
DeepSeek-V4-Flash has 64 heads,
a 128-token window (top-k 128) and, in its compress-ratio-4 layers, an indexer top-k of 512 over a compressed
cache of 64-token pages; DeepSeek-V3.2 has 128 heads and index top-k 2048; GLM-5 has 64 heads and index top-k
2048 (the same 656-byte cache as V3.2).

The two presets of the newer cache formats rest on engine sources and public reports, not on a config.json we could
read (marked so in each preset's ``note``):

- ``glm-5.3-flash`` (``fp8_v32_nope``, 528 B/token, no RoPE): 64 heads, ``qk_rope_head_dim`` 0 and
  ``kv_lora_rank`` 512 are the defaults of SGLang 0.5.23's ``Glm5NextConfig`` (``srt/configs/glm5_next.py``); the
  decode top-k 2176 is the indexer's 2048 widened by its kpool tail to a multiple of 128 (vLLM PR #55277, FlashInfer
  PR #4842: H=64 at TP1, H=32 at TP2). Not public as a config.json fact: ``index_topk`` itself.
- ``deepseek-v4.1-flash`` (``fp8_v41`` window + ``fp4_v41`` compressed cache, 32-token pages): 64 heads (vLLM
  issue #56837 reports ``num_heads=64`` on one GPU), a 128-token window (as V4); the compressed cache's top-k 512 is
  the shipped space's (FlashInfer's ``_DECODE_DSV4_1_TOPK``). Not public as a config.json fact: the V4.1 index top-k
  (vLLM #56837 and FlashInfer PR #5244 report a decode top-k of 1152 on sm_120, a width this preset does not assume).
  On sm_120 neither engine writes the V4.1 records: SGLang 0.5.23 (``select_dsv4_kv_layout``) and vLLM 0.34.0
  (``_use_v41_mxfp8_kv_record``) keep V4's 584-byte record there, so a V4.1 model's sm_120 calls read the
  ``fp8_model1`` tables (``deepseek-v4-flash``'s shapes); this preset tunes the V4.1 records for the GPUs that write
  them.
"""

from __future__ import annotations

from dataclasses import dataclass

# The decode CUDA-graph batch sizes each engine captures by default, up to 96 (the tables' range; a larger batch
# is served while a table reaches it):
# - SGLang 0.5.23, `generate_decode_cuda_graph_batch_sizes` (srt/arg_groups/cuda_graph_hook.py), without
#   speculative decoding: [1, 2, 4, 8, 12] + range(16, 257, 8) + ...
# - vLLM: [1, 2, 4] + multiples of 8 (`_BATCH_SIZES_TO_CAPTURE`, vllm#7894; v1's `cudagraph_capture_sizes`).
SGLANG_CAPTURE_SIZES = (1, 2, 4, 8, 12, *range(16, 257, 8))
# - SGLang 0.5.23 with speculative decoding (MTP: the verify step's q_tokens > 1), the same function's other branch:
#   range(1, 9) + range(10, 33, 2) + range(40, 65, 4) + range(72, 257, 8) + ...
SGLANG_SPEC_CAPTURE_SIZES = (*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8))
VLLM_CAPTURE_SIZES = (1, 2, 4, *range(8, 257, 8))
MAX_BATCH = 96  # the largest decode batch the presets tune by default
MAX_Q_TOKENS = 8  # a speculative verify step's query tokens per request
TP_SIZES = (1, 2, 4, 8, 16)
SERVED_HEADS = (8, 16, 32, 64, 128)  # the local head counts the kernel serves (kernels/coverage.py's rule)


def capture_sizes(engine: str | None = None, max_batch: int = MAX_BATCH, speculative: bool = False) -> tuple[int, ...]:
    """The CUDA-graph batch sizes up to ``max_batch`` of ``engine`` (``sglang`` or ``vllm``; None: both);
    ``speculative``: also SGLang's sizes with speculative decoding on (a search of verify steps, ``--q-tokens``)."""
    sglang = SGLANG_CAPTURE_SIZES + (SGLANG_SPEC_CAPTURE_SIZES if speculative else ())
    sizes = {"sglang": sglang, "vllm": VLLM_CAPTURE_SIZES}
    if engine is not None and engine not in sizes:
        raise ValueError(f"engine must be one of {sorted(sizes)}, got {engine!r}")
    chosen = sizes[engine] if engine else sglang + VLLM_CAPTURE_SIZES
    return tuple(sorted({b for b in chosen if b <= max_batch}))


@dataclass(frozen=True)
class Preset:
    """One model's sparse-MLA decode call: heads (all ranks), the main cache's format and top-k, the optional
    compressed cache (its top-k, page size and context), the sink, and the page size the engine allocates."""

    name: str
    heads: int
    kv_format: str
    topk: int
    page_size: int  # the main cache's page size in the engine (informative: a table is not keyed by it)
    context: int  # the context the search measures the main cache at
    extra_topk: int | None = None
    extra_format: str | None = None  # the compressed cache's format (None: the main cache's)
    extra_page_size: int = 64
    extra_context: int = 8192
    attn_sink: bool = False
    note: str = ""

    def heads_per_rank(self, tp: int) -> int:
        """Local heads at tensor-parallel size ``tp``; ValueError for a size that does not divide the heads, or
        whose local heads the kernel does not serve (a table no engine call would read)."""
        allowed = [t for t in TP_SIZES if self.heads % t == 0 and self.heads // t in SERVED_HEADS]
        if tp not in allowed:
            if tp in TP_SIZES and self.heads % tp == 0:
                local = self.heads // tp
                why = f"gives {local} local heads of {self.name}'s {self.heads}, which the kernel does not serve"
            else:
                why = f"does not split {self.name}'s {self.heads} heads"
            raise ValueError(f"--tp {tp} {why} (allowed: {allowed})")
        return self.heads // tp

    def shapes(self, tp: int) -> list[tuple[str, int, int]]:
        """``(kv_format, heads, topk)`` of every table the engine's calls read at ``tp`` (one per call: a call's
        table is keyed by its main cache's top-k)."""
        return [(self.kv_format, self.heads_per_rank(tp), self.topk)]


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "deepseek-v4-flash",
            heads=64,
            kv_format="fp8_model1",
            topk=128,
            page_size=256,
            context=128,
            extra_topk=512,
            extra_page_size=64,
            extra_context=8192,
            attn_sink=True,
            note="the compress-ratio-4 layers' call: window (top-k 128) + compressed cache (top-k 512) + sink",
        ),
        Preset("deepseek-v3.2", heads=128, kv_format="fp8_v32", topk=2048, page_size=64, context=8192),
        Preset("glm-5", heads=64, kv_format="fp8_v32", topk=2048, page_size=64, context=8192),
        Preset(
            "glm-5.3-flash",
            heads=64,
            kv_format="fp8_v32_nope",
            topk=2176,
            page_size=64,
            context=8192,
            note="no RoPE (V32_NO_ROPE, 528 B/token); top-k 2176 is the indexer's 2048 and its kpool tail (vLLM "
            "#55277, FlashInfer #4842), not a config.json fact",
        ),
        Preset(
            "deepseek-v4.1-flash",
            heads=64,
            kv_format="fp8_v41",
            topk=128,
            page_size=32,
            context=128,
            extra_topk=512,
            extra_format="fp4_v41",
            extra_page_size=32,
            extra_context=8192,
            attn_sink=True,
            note="window (fp8_v41, top-k 128) + compressed cache (fp4_v41, top-k 512: the shipped space's, not a "
            "config.json fact) + sink; on sm_120 the engines write V4's fp8_model1 records instead",
        ),
    )
}


def get_preset(name: str) -> Preset:
    """The preset of ``name`` (case-insensitive); ValueError naming the presets otherwise."""
    preset = PRESETS.get(str(name).strip().lower())
    if preset is None:
        raise ValueError(f"--model {str(name)[:60]!r} is not a model preset (presets: {', '.join(PRESETS)})")
    return preset


def rows(batch_sizes, q_tokens) -> list[int]:
    """The row counts (``B * s_q``) the engine's calls have: a table is keyed by rows."""
    return sorted({b * s for b in batch_sizes for s in q_tokens})


def tune_command(
    kv_format: str, heads: int, topk: int, engine: str = "sglang", *, batch: int = 1, q_tokens: int = 1
) -> str:
    """The commands that tune and export the table of ``(kv_format, heads, topk)`` for ``engine``: the preset and
    TP size whose calls read it, else a search space to write. ``batch`` and ``q_tokens``: a call of that many
    requests of that many query tokens must be in the table (the search's ``--max-batch`` and ``--q-tokens`` when
    the defaults do not reach it)."""
    flags = f" --q-tokens 1,{q_tokens}" if q_tokens > 1 else ""
    if batch > MAX_BATCH:  # the engines pad a batch up to a capture size: tune up to the one that holds it
        held = [b for b in capture_sizes(max_batch=batch + 256) if b >= batch]
        flags += f" --max-batch {held[0] if held else batch}"
    for preset in PRESETS.values():
        for tp in TP_SIZES:
            if preset.heads % tp == 0 and (preset.kv_format, preset.heads // tp, preset.topk) == (
                kv_format,
                heads,
                topk,
            ):
                return f"tuner search --model {preset.name} --tp {tp}{flags} && tuner export --engine {engine}"
    return (
        f"tuner search SPACE.yaml (a space with kv_format {kv_format}, heads {heads}, topk {topk}"
        f"{f', concurrency up to {batch * q_tokens} rows' if batch * q_tokens > MAX_BATCH else ''}) "
        f"&& tuner export --engine {engine}"
    )
