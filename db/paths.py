"""Every file the tool reads or writes, opened one safe way.

- Only a regular file is read or replaced: a FIFO, a socket, a device or a directory where a file should be is
  refused with one sentence (:class:`PathError`), after an ``os.stat`` and never by opening it, so nothing
  waits on a FIFO; a file is read with ``O_NONBLOCK``, so a FIFO swapped in meanwhile gives no wait either.
- A write is atomic: the text goes to a new file beside the target (``O_EXCL | O_NOFOLLOW``), then
  ``os.replace`` puts it in place, so a reader sees the old file or the new one, never half of one, and a
  failed write leaves the old file as it was.
- A write never follows a link out of the folder the user chose: a symbolic link at a file's name is refused,
  and so is a folder inside the chosen one that leads outside it.

:class:`PathError` is the refusal; the callers turn it into their own error (``TunerError``,
``DatabaseError``), one sentence and exit status 2 at the command line.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from ..files import ReadProblem
from ..files import file_kind
from ..files import read_bounded

SHOWN_MAX = 200  # characters of a path a message shows


class PathError(Exception):
    """A path that cannot be used as asked: one sentence saying what is there and what is allowed."""


def shown(path) -> str:
    """A path as a message shows it: whole when of a sane length, else its start and end."""
    text = str(path)
    if not text.isprintable():
        text = ascii(text)[1:-1]
    return text if len(text) <= SHOWN_MAX else text[: SHOWN_MAX // 2 - 2] + "..." + text[-(SHOWN_MAX // 2 - 2) :]


kind = file_kind  # what a file of this mode is, in words (``a FIFO``, ``a directory``, ...)


def regular_or_missing(path, what: str = "file") -> os.stat_result | None:
    """The stat of the regular file at ``path`` (links followed), None when nothing is there; PathError when
    something else is (a FIFO, a directory, a device) or the path cannot be looked at."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError) as e:
        raise PathError(f"cannot use {shown(path)} as the {what}: {_why(e)}") from None
    if not stat.S_ISREG(st.st_mode):
        raise PathError(f"{shown(path)} is {kind(st.st_mode)}, not a regular file; the {what} must be a regular file")
    return st


STDIN = "-"  # an input's name for the standard input


def read_input(path, limit: int, what: str = "file") -> bytes:
    """An input read once, at most ``limit`` bytes of it: a regular file (:func:`read_bytes`), a FIFO or pipe
    (``tuner check <(cat space.yaml)``: read until its writer ends it, as ``cat`` would), or ``-``, the standard
    input. The FIFO rule of :func:`regular_or_missing` is for what is written and for databases: an input is read
    once, bounded. PathError for anything else (a directory, a device) and for more than ``limit`` bytes."""
    if str(path) == STDIN:
        return _read_stdin(limit, what)
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise PathError(f"no {what} at {shown(path)}") from None
    except (OSError, ValueError) as e:
        raise PathError(f"cannot use {shown(path)} as the {what}: {_why(e)}") from None
    if stat.S_ISREG(st.st_mode):
        return read_bytes(path, limit, what)
    if not stat.S_ISFIFO(st.st_mode):
        raise PathError(
            f"{shown(path)} is {kind(st.st_mode)}, not a regular file or a pipe; the {what} must be one "
            "(or `-`: the standard input)"
        )
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0))
    except OSError as e:
        raise PathError(f"cannot read {shown(path)}: {_why(e)}") from None
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):  # replaced between the look and the open
            raise PathError(f"{shown(path)} changed while it was opened; the {what} must be a file or a pipe")
        return _read_fd(fd, shown(path), limit, what)
    finally:
        os.close(fd)


def _read_stdin(limit: int, what: str) -> bytes:
    import sys

    if sys.stdin is None:  # closed when the process started (`<&-`): descriptor 0 may since be another file's
        raise PathError(f"the standard input is closed; give the {what} as a file, or on a pipe to `-`")
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:
        return _read_fd(0, "the standard input", limit, what)
    try:
        data = stream.read(limit + 1)
    except (OSError, ValueError) as e:  # closed, or not readable
        raise PathError(f"cannot read the standard input: {_why(e)}") from None
    if len(data) > limit:
        raise PathError(f"the standard input is more than {limit} bytes; the {what} may have at most {limit}")
    return data


def _read_fd(fd: int, name: str, limit: int, what: str) -> bytes:
    """At most ``limit`` bytes from ``fd`` up to its end; PathError when there are more."""
    chunks, size = [], 0
    try:
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise PathError(f"cannot read {name}: {_why(e)}") from None
    if size > limit:
        raise PathError(f"{name} is more than {limit} bytes; the {what} may have at most {limit}")
    return b"".join(chunks)


def read_bytes(path, limit: int, what: str = "file") -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them; PathError otherwise. Never blocks."""
    if regular_or_missing(path, what) is None:
        raise PathError(f"no {what} at {shown(path)}")
    try:
        return read_bounded(path, limit)
    except ReadProblem as p:
        if p.reason == "kind":
            raise PathError(f"{shown(path)} is {kind(p.mode)}, not a regular file; the {what} must be one") from None
        if p.reason == "size" and p.size is not None:
            raise PathError(f"{shown(path)} is {p.size} bytes; the {what} may have at most {limit}") from None
        if p.reason == "size":
            raise PathError(f"{shown(path)} is more than {limit} bytes; the {what} may have at most {limit}") from None
        raise PathError(f"cannot read {shown(path)}: {_why(p.error)}") from None


def folder(path, root=None, create: bool = True) -> Path:
    """The directory ``path`` (created with its parents when missing and ``create``), checked to be a directory
    and, when ``root`` is given, to lie inside ``root`` once links are resolved; PathError otherwise."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except (OSError, ValueError) as e:
        raise PathError(f"cannot use the folder {shown(path)}: {_why(e)}") from None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise PathError(f"{shown(path)} is {kind(st.st_mode)}, not a folder; choose a folder to write into")
    if root is not None:
        _inside(path, root)
    if st is None:
        if not create:
            raise PathError(f"no folder {shown(path)}")
        try:
            path.mkdir(parents=True, exist_ok=True)
        except (OSError, ValueError) as e:
            raise PathError(f"cannot create the folder {shown(path)}: {_why(e)}") from None
        if root is not None:
            _inside(path, root)
    return path


def _inside(path: Path, root) -> None:
    try:
        real, top = Path(path).resolve(), Path(root).resolve()
    except (OSError, RuntimeError, ValueError) as e:
        raise PathError(f"cannot use {shown(path)}: {_why(e)}") from None
    if real != top and top not in real.parents:
        raise PathError(
            f"{shown(path)} leads outside {shown(root)} (to {shown(real)}, through a symbolic link); "
            "refusing to write there: remove the link or choose another folder"
        )


def check_target(path) -> None:
    """PathError unless ``path`` can be replaced by a written file: nothing there, or a regular file. A FIFO, a
    device, a directory or a symbolic link there is refused (a link is never written through)."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except (OSError, ValueError) as e:
        raise PathError(f"cannot write {shown(path)}: {_why(e)}") from None
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        raise PathError(
            f"{shown(path)} is a symbolic link (to {shown(target)}); refusing to write through it: "
            "remove the link or choose another output"
        )
    if not stat.S_ISREG(st.st_mode):
        raise PathError(f"{shown(path)} is {kind(st.st_mode)}, not a regular file; refusing to replace it")


def write_atomic(path, data: bytes | str, root=None) -> Path:
    """Write ``data`` to the file ``path`` at once (a new file beside it, then ``os.replace``); returns ``path``.

    ``path``'s folder is created when missing (inside ``root`` when given, which defaults to that folder).
    What is at ``path`` now must be nothing or a regular file: a FIFO, a device, a directory or a symbolic
    link there is refused (a link is never written through). PathError says what is wrong."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    folder(parent, root)
    check_target(path)
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    tmp = parent / f".{path.name[:200]}.{secrets.token_hex(6)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(tmp, flags, 0o666)  # the umask decides, as for any file the user writes
    except (OSError, ValueError) as e:
        raise PathError(f"cannot write {shown(path)}: {_why(e)}") from None
    try:
        try:
            view = memoryview(raw)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise PathError(f"cannot write {shown(path)}: {_why(e)}") from None
    return path


def _why(e: BaseException) -> str:
    return (getattr(e, "strerror", None) or str(e) or type(e).__name__)[:200]
