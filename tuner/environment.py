"""Every environment variable the tool reads, checked in one place before a command runs (:func:`check_environment`):
one sentence naming the variable and what it allows, exit status 2. Each parser is also what its module reads the
variable through, so that a value is checked the same way wherever it is read. Light on purpose: nothing heavy (no
torch, no Triton) is imported here, so the check costs a command nothing."""

from __future__ import annotations

import math
import os
import re
import stat

from .errors import TunerError

JOBS_ENV = "TUNER_COMPILE_JOBS"  # compiles at once (default: every usable core)
JOBS_MAX = 4096
INTERVAL_ENV = "TUNER_PROGRESS_INTERVAL_S"  # seconds between progress lines off a terminal
CONFIG_DIR_ENV = "SPARSE_MLA_CONFIG_DIR"  # the kernel's tables (kernels/table.py ENV_DIR)
FAULT_ENV = "TUNER_FAULT"  # the tests' fault injection (measure_main._inject_fault): KIND@CONFIG, comma-separated
FAULT_KINDS = ("crash", "hang", "oor")


def _shown(text: str, limit: int = 40) -> str:
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} characters)"


def _digits(text: str) -> bool:
    """Whether ``text`` is a whole number of at most 9 ASCII digits (``str.isdigit`` also passes ``²`` and ``٣``, which
    ``int`` refuses or reads as another script's digit)."""
    return re.fullmatch(r"[0-9]{1,9}", text) is not None


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity, else the host's count)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # no affinity on this platform
        return os.cpu_count() or 1


def compile_jobs() -> int:
    """``$TUNER_COMPILE_JOBS`` (a whole number 1..4096) when set, else :func:`usable_cores`."""
    text = os.environ.get(JOBS_ENV, "").strip()
    if not text:
        return usable_cores()
    if not (_digits(text) and 1 <= int(text) <= JOBS_MAX):
        raise TunerError(
            f"${JOBS_ENV} must be a whole number of compile processes from 1 to {JOBS_MAX} (unset: one per usable "
            f"core, {usable_cores()} here), got {_shown(text)}"
        )
    return int(text)


def progress_interval(default: float) -> float:
    """``$TUNER_PROGRESS_INTERVAL_S``: a finite number of seconds >= 0 (unset: ``default``)."""
    text = os.environ.get(INTERVAL_ENV, "").strip()
    if not text:
        return default
    try:
        value = float(text) if len(text) <= 40 else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise TunerError(
            f"${INTERVAL_ENV} must be a finite number of seconds >= 0 between progress lines (default {default:g}), "
            f"got {_shown(text)}"
        )
    return value


def check_columns() -> None:
    """``$COLUMNS``, when set, is a whole number (0: the terminal's own width); a width that cannot be read would
    silently give another layout."""
    text = os.environ.get("COLUMNS", "").strip()
    if text and not _digits(text):
        raise TunerError(f"$COLUMNS must be a whole number of columns the tables are fitted to, got {_shown(text)}")


def check_config_dir() -> None:
    """``$SPARSE_MLA_CONFIG_DIR``, when set, names a directory (there, or to be made by an export)."""
    text = os.environ.get(CONFIG_DIR_ENV, "")
    if not text:
        return
    allowed = "a directory for the kernel's tables (there, or to be made by `tuner export`)"
    if "\x00" in text or len(text) > 4096:
        raise TunerError(f"${CONFIG_DIR_ENV} must name {allowed}, got {_shown(text, 80)}")
    try:
        st = os.stat(text)
    except FileNotFoundError:
        return
    except (OSError, ValueError) as e:
        why = getattr(e, "strerror", None) or e
        raise TunerError(f"${CONFIG_DIR_ENV} must name {allowed}, got {_shown(text, 80)} ({why})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise TunerError(f"${CONFIG_DIR_ENV} must name {allowed}, got {_shown(text, 80)}, which is not a directory")


def check_faults() -> None:
    """``$TUNER_FAULT``, when set, is a comma-separated list of ``KIND@CONFIG`` (KIND one of :data:`FAULT_KINDS`)."""
    for item in filter(None, os.environ.get(FAULT_ENV, "").split(",")):
        kind, at, target = item.partition("@")
        if kind not in FAULT_KINDS or not at or not re.fullmatch(r"[\w.=-]{1,200}", target):
            raise TunerError(
                f"${FAULT_ENV} (a test hook) must be a comma-separated list of KIND@CONFIG with KIND one of "
                f"{', '.join(FAULT_KINDS)}, e.g. crash@T32-w4-s1-c256; got {_shown(item)}"
            )


def check_environment() -> None:
    """Every environment variable the tool reads ($TUNER_DB is checked as --db is, where a command opens it; the
    measurement process's $TUNER_BACKEND and $TUNER_KERNEL are set by the tool itself)."""
    from .adapter import allowed_adapters
    from .heartbeat import grace_s

    compile_jobs()
    progress_interval(0.0)
    grace_s()
    allowed_adapters()
    check_config_dir()
    check_columns()
    check_faults()
