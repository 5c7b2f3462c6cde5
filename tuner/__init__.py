"""sparse-mla-tuner: feasibility, search, measurement and queries for the sparse MLA decode kernel.

Run as the ``tuner`` executable (the console script, ``python -m sparse_mla_tuner.tuner`` or ``python -m
sparse_mla_tuner``), this package guards Ctrl-C from its very import: while the command line and its libraries import
(seconds: torch, Triton, SQLAlchemy), an interrupt ends the process at once with one line and exit status 130. Raised
as KeyboardInterrupt inside an extension's initialization it could abort the interpreter from C++ (pybind11:
"terminate called after throwing an instance of 'pybind11::error_already_set'") or leave a half-made module that fails
later. :func:`tuner.cli.main` hands Ctrl-C back to the command (:func:`release_import_guard`) and guards the shutdown
after it (:func:`guard_shutdown`). Imported any other way (tests, a program of one's own), it changes nothing.
"""

import os as _os
import signal as _signal
import sys as _sys

__version__ = "0.1.0"

_SCRIPT_NAMES = ("tuner", "tuner-script.py", "tuner.exe")


def is_executable() -> bool:
    """Whether this process is the ``tuner`` executable (its console script or ``python -m``), not a program that
    imports the package."""
    main = _sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name in (__name__ + ".__main__", __name__.rpartition(".")[0] + ".__main__"):
        return True  # python -m sparse_mla_tuner.tuner, or python -m sparse_mla_tuner
    return _os.path.basename(getattr(main, "__file__", None) or "") in _SCRIPT_NAMES


def _interrupted() -> None:
    try:
        _sys.stderr.write("interrupted\n")
        _sys.stderr.flush()
    except BaseException:  # noqa: BLE001 - a closed stderr: the status still says it
        pass


def exit_now(code: int) -> None:
    """Exit with ``code`` at once, the output written so far flushed, without the interpreter's shutdown."""
    for stream in (_sys.stdout, _sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - a closed pipe, or a flush a second Ctrl-C interrupted
            pass
    _os._exit(code)


def _end_on_interrupt(signum, frame) -> None:
    _interrupted()
    exit_now(130)


_SIGINT_SEEN: list = []  # a Ctrl-C the executable received after its import guard (see :func:`interrupted`)
_WAKE: list = []  # the read end of its signal wake-up pipe: Python writes each signal's number there


def _watch_interrupts() -> None:
    """Note every signal the executable receives from here on (``signal.set_wakeup_fd``), whatever its handler: the
    handler stays Python's own, which raises KeyboardInterrupt."""
    try:
        r, w = _os.pipe()
        _os.set_blocking(r, False)
        _os.set_blocking(w, False)
        _signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        _WAKE[:] = [r]
    except (ValueError, OSError):  # not the main thread, or no pipe: the exception's chain alone decides
        pass


def _sigint_seen() -> bool:
    if not _SIGINT_SEEN and _WAKE:
        try:
            if _signal.SIGINT in _os.read(_WAKE[0], 4096):
                _SIGINT_SEEN.append(_signal.SIGINT)
        except OSError:  # nothing written (BlockingIOError), or closed
            pass
    return bool(_SIGINT_SEEN)


def interrupted(e: BaseException | None = None) -> bool:
    """Whether ``e`` is, or comes of, a Ctrl-C. One that lands inside a C extension's import surfaces as another
    error (Triton's ``ImportError: initialization failed``), with or without the KeyboardInterrupt as its cause,
    perhaps wrapped again (an adapter that does not import): once the executable has received a Ctrl-C, any error
    is its outcome."""
    if _sigint_seen():
        return True
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def _install(handler) -> bool:
    try:
        _signal.signal(_signal.SIGINT, handler)
        return True
    except ValueError:  # not the main thread: the embedding program's own handling stands
        return False


def release_import_guard() -> None:
    """The imports are done: Ctrl-C is the command's again (KeyboardInterrupt; a search installs its own stop)."""
    if _signal.getsignal(_signal.SIGINT) is _end_on_interrupt:
        _install(_signal.default_int_handler)
        _watch_interrupts()


_EXIT: list = []  # the executable's exit status, once its command is done


def guard_shutdown(code) -> None:
    """The command is done (exit status ``code``): a Ctrl-C during the interpreter's shutdown (its threads joined,
    its atexit handlers run) ends the process as one at work would; after an interrupt already said, the
    shutdown says nothing more (a library a command was importing may fail in it). The shutdown ends with
    :func:`_end_of_shutdown`, so no moment is left where the interpreter has put Ctrl-C back to its default."""
    if not is_executable():
        return
    if code == 130:
        _sys.unraisablehook = lambda _: None
    _EXIT[:] = [code]
    _install(_end_on_interrupt)


def _end_of_shutdown() -> None:
    """The last atexit callback (registered first): the threads are joined and every other callback has run; the
    process ends here with its status, before the interpreter's finalization restores SIGINT's default (which
    would make a Ctrl-C in that last moment a silent death by signal)."""
    if _EXIT:
        code = _EXIT[0]
        exit_now(code if isinstance(code, int) else 0 if code is None else 1)


def _unraisable(u) -> None:
    """A KeyboardInterrupt that landed where Python cannot raise it (a weakref callback, a ``__del__``) is not printed
    as "Exception ignored in ...": the Ctrl-C is delivered again, to land where the command handles it. It is delivered
    from another thread, a moment later: raised here, it would land in this hook and be printed as ignored in it."""
    if isinstance(u.exc_value, KeyboardInterrupt):
        import threading

        again = threading.Timer(0.01, _signal.raise_signal, (_signal.SIGINT,))
        again.daemon = True
        again.start()
        return
    _sys.__unraisablehook__(u)


def guard_imports() -> None:
    """Until :func:`release_import_guard`, a Ctrl-C ends the process at once, with one line and exit status 130."""
    _install(_end_on_interrupt)


def drop_relative_pythonpath() -> None:
    """Takes off ``sys.path`` what ``$PYTHONPATH`` names relative to the working folder (``.``, ``lib``, an empty entry
    such as ``export PYTHONPATH=$PYTHONPATH:/x`` leaves), as :func:`sparse_mla_tuner.child_env` does for every process
    the tool starts: a ``json.py``, ``yaml.py`` or ``sqlalchemy.py`` where someone runs ``tuner`` is not imported by the
    command either, nor by a process it starts (``$PYTHONPATH`` keeps its absolute entries alone: multiprocessing's
    resource tracker and spawned workers inherit it). Only the entries ``$PYTHONPATH`` put on ``sys.path``, before the
    standard library's, go; ``sys.path[0]`` stays (the console script's folder; ``python -m`` puts the working folder
    there, ``python -P -m`` does not). The interpreter itself reads such an entry as it starts (its ``encodings``,
    ``site``), before this package: only an absolute ``$PYTHONPATH`` keeps those out."""
    text = _os.environ.get("PYTHONPATH", "")
    named = {_os.path.abspath(p) for p in text.split(_os.pathsep) if not _os.path.isabs(p)} if text else set()
    if not named:
        return
    kept = [p for p in text.split(_os.pathsep) if _os.path.isabs(p)]
    named -= {_os.path.abspath(p) for p in kept}  # a folder also named by its absolute path stays
    if kept:  # and off what every process it starts inherits (multiprocessing's own helpers included)
        _os.environ["PYTHONPATH"] = _os.pathsep.join(kept)
    else:
        del _os.environ["PYTHONPATH"]
    stdlib = _os.path.dirname(_os.__file__)
    ends = {stdlib, _os.path.join(_os.path.dirname(stdlib), f"python{_sys.version_info[0]}{_sys.version_info[1]}.zip")}
    first = 0 if getattr(_sys.flags, "safe_path", False) else 1
    head = []
    for i, p in enumerate(_sys.path[first:], first):
        if p in ends:
            head = _sys.path[first:i]
            break
    _sys.path[first : first + len(head)] = [p for p in head if p and _os.path.abspath(p) not in named]


if is_executable():
    import atexit as _atexit

    drop_relative_pythonpath()
    _atexit.register(_end_of_shutdown)
    _sys.unraisablehook = _unraisable
    guard_imports()
