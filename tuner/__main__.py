"""``python -m tuner`` is the ``tuner`` command."""

import atexit
import sys

from . import _end_of_shutdown
from . import _unraisable
from . import guard_imports

atexit.register(_end_of_shutdown)  # first, so it runs last (see __init__.py)
sys.unraisablehook = _unraisable
guard_imports()  # before the command line's imports, as the console script has it

from .cli import main  # noqa: E402

main()
