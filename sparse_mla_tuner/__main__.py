"""``python -m sparse_mla_tuner``: the ``tuner`` command."""

from sparse_mla_tuner.tuner.cli import main

main()
