"""The search's handle to one measurement process: start, ask with a timeout, restart after a crash or hang."""

from __future__ import annotations

import os
import selectors
import subprocess
import tempfile
import time

from .. import child_argv
from .. import child_env
from ..db.verdicts import Verdict
from .errors import TunerError
from .protocol import CalibrateRequest
from .protocol import Exit
from .protocol import MeasureReply
from .protocol import MeasureRequest
from .protocol import decode
from .protocol import encode


class ProcessDied(Exception):
    def __init__(self, verdict: Verdict, reason: str) -> None:
        super().__init__(reason)
        self.verdict = verdict  # CRASHED | TIMEOUT
        self.reason = reason


class MeasurementProcess:
    """One ``python -m tuner.measure_main`` child; :meth:`measure` returns its reply, or a ``crashed`` /
    ``timeout`` reply when the child died or hung (it is restarted at the next request)."""

    def __init__(
        self,
        backend: str,
        env: dict | None = None,
        start_timeout_s: float = 300.0,
        gpu_index: int = 0,
        kernel: str | None = None,
    ) -> None:
        self.backend = backend
        self.kernel = kernel  # the adapter the process imports before it answers (default: the built-in one)
        self.gpu_index = gpu_index  # recorded with every sample (CPU workers are numbered the same way)
        self.extra_env = env or {}
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen | None = None
        self.info: dict = {}
        self._stderr = None  # the child's stderr, a temporary file (a new one per start)

    def begin(self) -> None:
        """A study's measurement thread for this process starts (simulated GPUs order their threads here)."""

    def idle(self) -> None:
        """The study has nothing for this process now (others run the last trials): a pause before it looks again."""
        time.sleep(0.2)

    def end(self) -> None:
        """A study's measurement thread for this process is done with its level."""

    def start(self) -> dict:
        env = child_env({**os.environ, **self.extra_env, "TUNER_BACKEND": self.backend, "PYTHONUNBUFFERED": "1"})
        env.pop("TUNER_KERNEL", None)  # the tool's own message to its child: never one from the caller's environment
        if self.kernel:
            env["TUNER_KERNEL"] = self.kernel
        if self.backend != "interpreter":
            env.pop("TRITON_INTERPRET", None)
        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            child_argv("sparse_mla_tuner.tuner.measure_main"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
            text=True,
            bufsize=1,
        )
        try:
            hello = self._read(self.start_timeout_s)
        except ProcessDied as e:
            raise TunerError(f"the measurement process did not start ({e.reason})") from None
        self.info = hello.environment
        return self.info

    def stderr_tail(self, lines: int = 8) -> str:
        self._stderr.seek(0)
        text = self._stderr.read().decode(errors="replace").strip().splitlines()
        return " | ".join(text[-lines:])

    def _read(self, timeout_s: float):
        assert self.proc is not None and self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.kill()
                    raise ProcessDied(Verdict.TIMEOUT, f"no answer within {timeout_s:.0f} s; the process was killed")
                if sel.select(timeout=min(left, 1.0)):
                    line = self.proc.stdout.readline()
                    if not line:
                        code = self.proc.wait()
                        raise ProcessDied(Verdict.CRASHED, f"exited with status {code}: {self.stderr_tail()}")
                    return decode(line)
                if self.proc.poll() is not None:
                    raise ProcessDied(
                        Verdict.CRASHED, f"exited with status {self.proc.returncode}: {self.stderr_tail()}"
                    )
        finally:
            sel.close()

    def measure(self, req: MeasureRequest | CalibrateRequest, timeout_s: float) -> MeasureReply:
        try:
            return self._request(req, timeout_s)
        except ProcessDied as e:
            return MeasureReply(e.verdict, e.reason[-2000:])

    def _request(self, req, timeout_s: float) -> MeasureReply:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(encode(req) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise ProcessDied(Verdict.CRASHED, f"the measurement process is gone: {self.stderr_tail()}") from None
        try:
            return self._read(timeout_s)
        except ProcessDied:
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.stdin.write(encode(Exit()) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()
