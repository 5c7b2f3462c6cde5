"""The classes the vLLM plugin (``kernels/vllm_plugin.py``) points vLLM at; vLLM imports this module when it resolves
them (it imports vLLM, so nothing else here imports it).

- :class:`SparseMLASM120Backend` fills the attention backend slot ``FLASHINFER_MLA_SPARSE_SM120`` (DeepSeek-V3.2,
  GLM-5 and, without RoPE on 528-byte rows, GLM-5.3 on sm_12x). It is vLLM's ``FlashInferMLASparseSM120Backend``
  with one change: its implementation class. Its name stays ``FLASHINFER_MLA_SPARSE_SM120``, because vLLM decides by
  that name the cache dtype (``fp8_ds_mla``) and the JIT warm-ups of the slot; metadata, cache layout, support
  checks and prefill are vLLM's.
- :class:`SparseMLASM120Impl` overrides ``_run_mqa_kernel(q, kv_cache, topk_indices_physical)``, the one call
  that runs FlashInfer's sparse decode: a call :func:`vllm_plugin.serve_v32` covers returns the tuned kernel's
  output, any other runs vLLM's method unchanged.

DeepSeek-V4's and V4.1's subclasses are made by :func:`vllm_plugin.v4_class_for` when vLLM's selector runs (opt-in),
since they are defined on classes this module need not import.
"""

from __future__ import annotations

from vllm.v1.attention.backends.mla.flashinfer_mla_sparse import FlashInferMLASparseSM120Backend
from vllm.v1.attention.backends.mla.flashinfer_mla_sparse_sm120 import FlashInferMLASparseSM120Impl

from . import vllm_plugin


class SparseMLASM120Impl(FlashInferMLASparseSM120Impl):
    """vLLM's sm_120 sparse-MLA implementation, with covered decode calls on the tuned kernel."""

    def _run_mqa_kernel(self, q, kv_cache, topk_indices_physical):
        out = vllm_plugin.serve_v32(q, kv_cache, topk_indices_physical, self.scale)
        if out is None:
            return super()._run_mqa_kernel(q, kv_cache, topk_indices_physical)
        return out


class SparseMLASM120Backend(FlashInferMLASparseSM120Backend):
    """vLLM's ``FLASHINFER_MLA_SPARSE_SM120`` backend with :class:`SparseMLASM120Impl` as its implementation."""

    @staticmethod
    def get_impl_cls():
        return SparseMLASM120Impl
