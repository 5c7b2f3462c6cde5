"""``python -m tuner`` is the ``tuner`` command."""

from .cli import main

main()
