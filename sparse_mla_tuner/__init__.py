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


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a child process this package starts: isolated from the caller's working folder.

    ``PYTHONSAFEPATH=1`` keeps the working folder off the child's ``sys.path`` (``python -P``; it is inherited by
    the child's own children, multiprocessing's spawned workers included), so a ``json.py``, ``yaml.py`` or
    ``torch.py`` where someone runs ``tuner`` is never imported. The folder holding this package goes first on
    ``PYTHONPATH`` instead, so a child finds this very package (also in a checkout run without an install).
    """
    env = dict(_os.environ if env is None else env)
    env["PYTHONSAFEPATH"] = "1"
    root = _os.path.dirname(_here)
    paths = [p for p in env.get("PYTHONPATH", "").split(_os.pathsep) if p and _os.path.isabs(p)]
    env["PYTHONPATH"] = _os.pathsep.join([root, *(p for p in paths if p != root)])
    return env


def child_argv(module: str) -> list[str]:
    """``python -P -m MODULE``: a child of this package's, with the working folder off its ``sys.path``."""
    import sys

    return [sys.executable, "-P", "-m", module]
