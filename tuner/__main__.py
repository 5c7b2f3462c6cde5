"""``python -m tuner`` is the ``tuner`` command."""

from . import main

main()
