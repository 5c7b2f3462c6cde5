"""``python -m tuner`` is the ``tuner`` command."""

from . import guard_imports

guard_imports()  # before the command line's imports, as the console script has it (see __init__.py)

from .cli import main  # noqa: E402

main()
