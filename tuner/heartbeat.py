"""Optuna heartbeats for a running trial, so that a dead host's trial is failed and retried."""

from __future__ import annotations

import threading

HEARTBEAT_S = 2.0  # a running trial beats every 2 s
GRACE_S = 10  # a trial silent for this long belongs to a dead host: Optuna fails it and it is retried


class Heartbeat:
    """Records a heartbeat for ``trial_id`` every ``interval_s`` on a thread, until :meth:`stop`."""

    def __init__(self, storage, trial_id: int, interval_s: float = HEARTBEAT_S) -> None:
        self._stop = threading.Event()
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
