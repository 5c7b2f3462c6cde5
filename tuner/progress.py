"""How long work shows its progress on stderr: the one place that decides.

Three modes, picked once per :class:`Progress`:

- **bars** (stderr is a TTY): an overall bar across studies (when there are several) and the
  current task's bar below it; phase messages go through ``tqdm.write`` so they never tear a bar.
- **lines** (no TTY: logs, CI): never a carriage return. One plain line per task and phase
  (``v4_flash C=96: screening 87 launches``), and while a task counts, a progress line only when it
  passes a 10 % step and at least ``interval_s`` (10 s; ``$TUNER_PROGRESS_INTERVAL_S``) after the
  previous line: at most 10 per task, however many items; each says the time left at the rate so far
  (``compiled 40/126 (31 %), about 3 min left``), as the bars do.
- **off** (``quiet``): nothing at all, except :meth:`Progress.warn`.

API::

    with Progress(quiet, total_studies=len(plans)) as progress:
        with progress.compiling("v4_flash") as task:              # compile-only work
            check_many(..., on_progress=task)                     # task(done, total)
        for plan in plans:
            st = progress.study("v4_flash C=96", total=87, initial=0)
            st.phase("A/A 12 pairs")                              # one line, in every mode
            st.phase("screening 87 launches")
            st.advance(1, postfix="best T32-w4-s1-c512 48.4 µs")  # per finished trial (thread-safe)
            st.phase("finalists 3 x 30 rounds")
            st.close("best T32-w4-s1-c512 48.35 µs")              # 'v4_flash C=96: done in 23 s (...)'

A :class:`Task` is also a context manager (closed without a summary on the way out, so an
exception never leaves a bar behind) and a ``(done, total)`` callable, the shape of the
``on_progress`` callback of :func:`tuner.feasibility.check_many`.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

from tqdm import tqdm

INTERVAL_S = 10.0  # lines mode: the fewest seconds between two progress lines of one task
SLOW_S = 3.0  # Progress.slow: a quick step says nothing, a slow one what it is doing
STEPS = 10  # lines mode: a progress line only when the count passes another 1/STEPS of the total


def duration(seconds: float) -> str:
    """``23 s``, ``14 min``, ``2 h 05 min``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    h, m = divmod(round(seconds / 60), 60)
    return f"{h} h {m:02d} min"


class Progress:
    """Progress of one command on ``file`` (default stderr): bars on a TTY, plain lines otherwise, or off.

    ``tty`` overrides the TTY test (tests); ``clock`` is the time source (seconds).
    """

    def __init__(
        self,
        quiet: bool = False,
        total_studies: int = 0,
        *,
        file: TextIO | None = None,
        tty: bool | None = None,
        interval_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.file = file if file is not None else sys.stderr
        if tty is None:
            isatty = getattr(self.file, "isatty", None)
            tty = bool(isatty and isatty())
        self.mode = "off" if quiet else "bars" if tty else "lines"
        if interval_s is None:
            from .environment import progress_interval

            interval_s = progress_interval(INTERVAL_S)
        self.interval_s, self.clock = interval_s, clock
        self.lock = threading.Lock()
        self.total_studies, self.studies_done = total_studies, 0
        self.overall: tqdm | None = None
        if self.mode == "bars" and total_studies > 1:
            self.overall = tqdm(total=total_studies, desc="studies", unit="study", file=self.file, position=0)

    # --- messages ---------------------------------------------------------------------------------

    def message(self, text: str) -> None:
        """One line of progress news (suppressed by ``quiet``)."""
        if self.mode != "off":
            self._line(text)

    @contextlib.contextmanager
    def slow(self, text: str, after_s: float = SLOW_S):
        """``text`` as a message only when the block is still running ``after_s`` seconds after it began: a step
        that is usually quick (reading the results) says what it does when it is not, and says nothing otherwise
        (so an error right after a quick read stays the only line on stderr)."""
        if self.mode == "off":
            yield
            return
        timer = threading.Timer(after_s, self.message, (text,))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    def warn(self, text: str) -> None:
        """A line that ``quiet`` does not suppress (warnings); never tears a bar."""
        self._line(text)

    def _line(self, text: str) -> None:
        if self.mode == "bars":
            tqdm.write(text, file=self.file)
        else:
            with self.lock:
                print(text, file=self.file, flush=True)

    # --- tasks ------------------------------------------------------------------------------------

    def study(self, name: str, total: int, initial: int = 0) -> Task:
        """One study's task: ``total`` items (trials), ``initial`` already done (a resumed study).
        Its :meth:`Task.close` advances the overall bar."""
        return Task(self, name, total, initial, counts_as_study=True)

    def task(self, name: str, total: int) -> Task:
        """A counted piece of work that is neither a study nor a compile (e.g. calibrate's levels);
        ``<name>: done in 23 s (<summary>)`` on close."""
        return Task(self, name, total, 0)

    def compiling(self, name: str, n: int | None = None) -> Task:
        """A compile task, used as ``on_progress``: says ``<name>: compile <total> configs ...`` at its first
        call (so nothing shows when every verdict is cached) and ``<name>: compiled <n> in 12 s`` on close."""
        return Task(self, name, n or 0, 0, label="compiled", start=lambda total: f"compile {total} configs ...")

    def close(self) -> None:
        if self.overall is not None:
            self.overall.close()
            self.overall = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Task:
    """A counted piece of work (a study, a compile) of a :class:`Progress`; see the module docstring."""

    def __init__(
        self,
        progress: Progress,
        name: str,
        total: int,
        initial: int = 0,
        *,
        label: str = "",
        start: Callable[[int], str] | None = None,
        counts_as_study: bool = False,
    ) -> None:
        self.progress, self.name, self.total, self.done, self.initial = progress, name, total, initial, initial
        self.label, self.start, self.counts_as_study = label, start, counts_as_study
        self.t0 = progress.clock()
        self.lock = threading.Lock()
        self.started = start is None  # a compile task starts at its first callback
        self.closed = False
        self.last_line = self.t0
        self.last_step = self._step(initial)
        self.bar: tqdm | None = None
        if self.started:
            self._open_bar()

    # --- counting ---------------------------------------------------------------------------------

    def phase(self, text: str) -> None:
        """``<name>: <text>``, one line in bars and lines modes."""
        self.progress.message(f"{self.name}: {text}")

    def advance(self, n: int = 1, postfix: str | None = None, total: int | None = None) -> None:
        """``n`` more items done; ``postfix`` (e.g. the best so far) shows on the bar and progress lines; ``total``
        revises the expected count (a search's strategy stops when it is sure, not at the end of the space)."""
        with self.lock:
            self._set(self.done + n, self.total if total is None else total, postfix)

    def __call__(self, done: int, total: int) -> None:
        """The ``on_progress(done, total)`` callback: absolute counts."""
        with self.lock:
            if not self.started:
                self.started = True
                self.total, self.t0 = total, self.progress.clock()
                self.last_line = self.t0
                self.progress.message(f"{self.name}: {self.start(total)}")
                self._open_bar()
            self._set(done, total, None)

    def close(self, summary: str | None = None) -> None:
        """``<name>: done in 23 s (<summary>)`` (a compile: ``<name>: compiled 90 in 23 s``); idempotent."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            if self.bar is not None:
                self.bar.close()
            if not self.started:
                return  # a compile task that never compiled
            took = duration(self.progress.clock() - self.t0)
            if self.label:
                text = f"{self.label} {self.done} in {took}"
            else:
                text = f"done in {took}"
            self.progress.message(f"{self.name}: {text}" + (f" ({summary})" if summary else ""))
        if self.counts_as_study:
            p = self.progress
            p.studies_done += 1
            if p.overall is not None:
                p.overall.update(1)
            elif p.mode == "lines" and p.total_studies > 1:
                p.message(f"studies: {p.studies_done}/{p.total_studies}")

    def __enter__(self) -> Task:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- inside -----------------------------------------------------------------------------------

    def _step(self, done: int) -> int:
        return done * STEPS // self.total if self.total > 0 else 0

    def _open_bar(self) -> None:
        p = self.progress
        if p.mode != "bars":
            return
        self.bar = tqdm(
            total=self.total or None,
            initial=min(self.done, self.total) if self.total else self.done,
            desc=self.name,
            file=p.file,
            position=1 if p.overall is not None else 0,
            leave=False,  # close() writes the summary line instead
            dynamic_ncols=True,
        )

    def _set(self, done: int, total: int, postfix: str | None) -> None:
        """Under ``self.lock``."""
        if self.closed:
            return
        self.done, self.total = done, total
        if self.bar is not None:
            if self.bar.total != total:
                self.bar.total = total
            if postfix is not None:
                self.bar.set_postfix_str(postfix, refresh=False)
            self.bar.update(done - self.bar.n)
            return
        if self.progress.mode != "lines" or done <= 0:
            return
        now, step = self.progress.clock(), self._step(done)
        if step > self.last_step and now - self.last_line >= self.progress.interval_s:
            self.last_step, self.last_line = step, now
            pct = f" ({100 * done // total} %)" if total else ""
            head = f"{self.label} " if self.label else ""
            tail = f", {postfix}" if postfix else ""
            eta = f", about {duration(self.eta_s(now))} left" if self.eta_s(now) is not None else ""
            self.progress.message(f"{self.name}: {head}{done}/{total}{pct}{eta}{tail}")

    def eta_s(self, now: float) -> float | None:
        """Seconds left at the rate so far (None before the first item or after the last)."""
        done = self.done - self.initial
        if done <= 0 or self.total <= self.done:
            return None
        return (now - self.t0) / done * (self.total - self.done)
