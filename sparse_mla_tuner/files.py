"""Reading a file of bounded size without ever blocking: the one reader under ``db/paths.py`` (every file the tuner
reads) and ``kernels/table.py`` (the run-time tables), each of which words its own messages from a
:class:`ReadProblem`. It imports nothing of the package's, so the kernels' layer may use it too."""

from __future__ import annotations

import os
import stat


class ReadProblem(Exception):
    """Why a file could not be read: ``reason`` is ``kind`` (not a regular file: ``mode``), ``size`` (over the
    limit: ``size``, None when it grew past it while read) or ``os`` (``error``)."""

    def __init__(self, reason: str, mode: int | None = None, size: int | None = None, error: OSError | None = None):
        super().__init__(reason)
        self.reason, self.mode, self.size, self.error = reason, mode, size, error


def file_kind(mode: int) -> str:
    """What a file that is not a regular file is, in words (``a FIFO``)."""
    kinds = [(stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")]
    kinds += [(stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISLNK, "a symbolic link")]
    return next((word for test, word in kinds if test(mode)), "not a regular file")


def read_bounded(path, limit: int) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them, or a :class:`ReadProblem`.

    Opened non-blocking and checked once open (a FIFO swapped in after the caller's own check gives no wait), and
    read to one byte past the limit at most (a file that grows while read is refused, not read whole)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise ReadProblem("os", error=e) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ReadProblem("kind", mode=st.st_mode)
        if st.st_size > limit:
            raise ReadProblem("size", size=st.st_size)
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise ReadProblem("size")
        return b"".join(chunks)
    except OSError as e:
        raise ReadProblem("os", error=e) from None
    finally:
        os.close(fd)
