"""Where a search's time goes: compile, GPU measurement, model, database, and the rest.

A :class:`Clock` sums ``time.perf_counter`` spans by kind. Sections nest and count exclusively (a measurement
inside a database section counts as GPU time only); each thread keeps its own stack, and the sums are shared.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

KINDS = ("compile", "gpu", "model", "database")


class Clock:
    def __init__(self) -> None:
        self.spent = dict.fromkeys(KINDS, 0.0)
        self._local = threading.local()
        self._lock = threading.Lock()

    @contextmanager
    def section(self, kind: str):
        stack = self._local.__dict__.setdefault("stack", [])
        t0 = time.perf_counter()
        stack.append(0.0)
        try:
            yield
        finally:
            took = time.perf_counter() - t0
            inner = stack.pop()
            with self._lock:
                self.spent[kind] += took - inner
            if stack:
                stack[-1] += took

    def add(self, kind: str, seconds: float) -> None:
        with self._lock:
            self.spent[kind] += seconds

    def split(self, wall_s: float) -> dict[str, float]:
        """``{compile_s, gpu_s, model_s, database_s, other_s, wall_s}``: ``other`` is the wall time that no
        section counted (with several measurement threads the sections may sum past the wall: then 0)."""
        out = {f"{k}_s": round(v, 3) for k, v in self.spent.items()}
        out["other_s"] = round(max(0.0, wall_s - sum(self.spent.values())), 3)
        out["wall_s"] = round(wall_s, 3)
        return out


class TimedStore:
    """A :class:`db.store.Store` whose sessions count as database time on ``clock``."""

    def __init__(self, store, clock: Clock) -> None:
        self._store, self._clock = store, clock

    def __getattr__(self, name):
        return getattr(self._store, name)

    @contextmanager
    def session(self, *args, **kwargs):
        with self._clock.section("database"), self._store.session(*args, **kwargs) as s:
            yield s
