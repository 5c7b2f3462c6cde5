"""``python -m tuner`` is the ``tuner`` command."""

from sparse_mla_tuner.tuner.cli import main

main()
