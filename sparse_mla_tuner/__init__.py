"""sparse-mla-tuner: one import namespace for the repository's ``kernels/``, ``db/`` and ``tuner/`` folders.

Installed, they are ``sparse_mla_tuner.kernels``, ``sparse_mla_tuner.db`` and ``sparse_mla_tuner.tuner``
(``pyproject.toml`` maps the folders), so the package adds no top-level ``kernels`` or ``db`` to an environment.
In a checkout the folders stay where they are, beside this one, and this package's path reaches them.
"""

import os as _os

_here = _os.path.dirname(_os.path.abspath(__file__))
_checkout = _os.path.dirname(_here)
if not _os.path.isdir(_os.path.join(_here, "tuner")) and _os.path.isfile(_os.path.join(_checkout, "tuner", "cli.py")):
    __path__.append(_checkout)  # noqa: F821 (a package's __path__)
