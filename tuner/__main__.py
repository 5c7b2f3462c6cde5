"""``python -m tuner`` is the ``tuner`` command."""

from tuner.cli import main

main()
