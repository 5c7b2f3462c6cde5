"""The built-in kernel adapters (:mod:`tuner.adapter`): ``sparse_mla``, the project's own kernel."""
