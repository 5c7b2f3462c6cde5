"""The sparse-MLA wing: everything of the tuner that knows the sparse-MLA decode kernel (``kernels/``).

- ``adapter.py``: the kernel as the tuner's first adapter (``kernel: sparse_mla``), its workload entry and the
  kernel's types the rest of the wing takes;
- ``export.py``: its engine tables (vLLM's and SGLang's layouts, the Triton module);
- ``report.py``: its sections of the A/B report (the call's line, the same-run FlashMLA benchmark);
- ``records.py``: what the results database's columns mean for it (a trial's config, a workload's whole call, and
  the shape a recording is replayed for);
- ``presets.py``: the model presets as search spaces (``tuner search --model``).

The tuner's core reaches it only through :class:`tuner.adapter.KernelAdapter`; nothing is imported here.
"""
