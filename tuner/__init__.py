"""sparse-mla-tuner: feasibility, search, measurement and queries for the sparse MLA decode kernel."""

__version__ = "0.1.0"


def main() -> None:
    """The ``tuner`` executable: :func:`tuner.cli.main` behind a Ctrl-C guard that covers what the CLI's own
    handling cannot, so that an interrupt at any moment is one line and exit status 130, never a traceback: while
    the CLI and its libraries are imported (seconds: torch, Triton, SQLAlchemy), and after the command, while the
    interpreter shuts down (its threads joined, its atexit handlers run)."""
    import signal
    import sys

    code = 0
    # while the libraries import, a Ctrl-C ends the process at once: raised as KeyboardInterrupt inside an
    # extension's initialization it can abort the interpreter from C++ (pybind11: "terminate called after throwing
    # an instance of 'pybind11::error_already_set'") or leave a half-made module that fails later
    try:
        previous = signal.signal(signal.SIGINT, _interrupt_at_exit)
    except ValueError:  # not the main thread (an embedding caller): its own handling stands
        previous = None
    try:
        from .cli import main as cli_main

        if previous is not None:
            signal.signal(signal.SIGINT, previous)  # the command's own: KeyboardInterrupt, a search's stop
        cli_main()
    except KeyboardInterrupt:  # while importing: the CLI's own handling is not there yet
        _interrupted()
        _exit_now(130)
    except SystemExit as e:
        code = e.code
    except Exception as e:
        if not interrupted(e):
            raise
        _interrupted()  # a Ctrl-C inside an extension module's initialization: "ImportError: initialization failed"
        _exit_now(130)
    if code == 130:  # interrupted, and said so: a library interrupted while a command imported it may fail in the
        sys.unraisablehook = lambda _: None  # shutdown's atexit callbacks; the line said is the one line there is
    # the command is done: a Ctrl-C from here on (a slow shutdown) ends the process as one at work would
    try:
        signal.signal(signal.SIGINT, _interrupt_at_exit)
    except ValueError:  # not the main thread (an embedding caller): its own handling stands
        pass
    sys.exit(code)


def interrupted(e: BaseException) -> bool:
    """Whether ``e`` is, or comes of, a Ctrl-C: one that lands inside a C extension's import surfaces as another
    error (Triton's ``ImportError: initialization failed``) whose cause is the KeyboardInterrupt."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def _interrupted() -> int:
    import sys

    try:
        sys.stderr.write("interrupted\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a closed stderr: the status still says it
        pass
    return 130


def _interrupt_at_exit(signum, frame) -> None:
    _interrupted()
    _exit_now(130)


def _exit_now(code: int) -> None:
    """Exit with ``code`` at once, the output written so far flushed, without the interpreter's shutdown."""
    import os
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - a closed pipe, or a flush a second Ctrl-C interrupted
            pass
    os._exit(code)
