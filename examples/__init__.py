"""Kernels of others wrapped as tuner adapters (``docs/adapters.md``)."""
