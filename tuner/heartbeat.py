"""Optuna heartbeats for a running trial, so that a dead host's trial is failed and retried; and the owner of a
running trial, so that a trial of a process of this host that has ended is failed and retried at once.

A heartbeat tells only after the grace period that a trial's process is gone. A trial asked by a process on this
host carries its owner (:func:`owner`: host, boot, PID namespace, PID and the process's start time), so a
resumed search knows at once which running trials nobody runs any more (:func:`owner_alive`)."""

from __future__ import annotations

import os
import re
import socket
import threading

from .errors import TunerError

HEARTBEAT_S = 2.0  # a running trial beats every 2 s
GRACE_S = 10  # a trial silent for this long belongs to a dead host: Optuna fails it and it is retried
GRACE_ENV = "TUNER_HEARTBEAT_GRACE_S"  # sets GRACE_S for one search (whole seconds, more than HEARTBEAT_S)
OWNER_ATTR = "tuner_owner"  # a running trial's system attribute: the process measuring it (see owner())


def grace_s() -> int:
    """The grace period of this search: ``$TUNER_HEARTBEAT_GRACE_S`` when set, else :data:`GRACE_S`. Whole seconds
    (Optuna's ``grace_period``), more than the heartbeat interval: a shorter grace would fail live trials."""
    text = os.environ.get(GRACE_ENV, "")
    if not text.strip():
        return GRACE_S
    if not re.fullmatch(r"\s*[0-9]{1,9}\s*", text) or int(text) <= HEARTBEAT_S:
        shown = repr(text) if len(text) <= 40 else repr(text[:40]) + f"... ({len(text)} characters)"
        raise TunerError(
            f"${GRACE_ENV} must be a whole number of seconds greater than the {HEARTBEAT_S:g} s heartbeat interval "
            f"(default {GRACE_S}), got {shown}"
        )
    return int(text)


class Heartbeat:
    """Records a heartbeat for ``trial_id`` every ``interval_s`` on a thread, until :meth:`stop` (the first at once,
    unless ``beaten``: the caller has just recorded one)."""

    def __init__(self, storage, trial_id: int, interval_s: float = HEARTBEAT_S, beaten: bool = False) -> None:
        self._stop = threading.Event()
        if not beaten:
            storage.record_heartbeat(trial_id)
        self._thread = threading.Thread(target=self._run, args=(storage, trial_id, interval_s), daemon=True)
        self._thread.start()

    def _run(self, storage, trial_id, interval_s) -> None:
        while not self._stop.wait(interval_s):
            try:
                storage.record_heartbeat(trial_id)
            except Exception:  # noqa: BLE001 - a missed beat only risks an early retry
                pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), or '' if it is gone
    (a zombie, killed and not yet reaped, is gone)."""
    fields = _read(f"/proc/{pid}/stat").rsplit(")", 1)[-1].split()  # the fields after the command name
    return fields[19] if len(fields) > 19 and fields[0] not in ("Z", "X") else ""


def _machine() -> str:
    """This host as far as PIDs mean the same process: host name, boot and PID namespace ('' if unknown)."""
    boot = _read("/proc/sys/kernel/random/boot_id")
    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pidns = ""
    return f"{socket.gethostname()}/{boot}/{pidns}" if boot and pidns else ""


def owner(pid: int | None = None) -> str:
    """The owner tag of process ``pid`` (default: this one): ``machine|pid|start time``; '' where PIDs cannot
    be checked (not Linux), and then only the heartbeat tells a dead owner."""
    pid = os.getpid() if pid is None else pid
    machine, start = _machine(), _start_time(pid)
    return f"{machine}|{pid}|{start}" if machine and start else ""


def owner_alive(tag: str | None) -> bool | None:
    """Whether the process of an owner tag still runs: True or False for a process of this machine (the same
    PID with another start time is another process), None for another machine or no tag (ask the heartbeat)."""
    if not tag:
        return None
    parts = tag.rsplit("|", 2)
    if len(parts) != 3 or parts[0] != _machine() or not (parts[1].isascii() and parts[1].isdigit()):
        return None
    return _start_time(int(parts[1])) == parts[2]
