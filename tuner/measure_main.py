"""The measurement process: a long-lived child that runs the kernel for the search.

Isolation: an illegal memory access, a crash or a hang kills this process, not the search; the
parent's handle (:class:`tuner.measure.MeasurementProcess`) restarts it. It is reused between trials
so that importing torch, building inputs and compiling do not dominate. Protocol
(:mod:`tuner.protocol`): one message per line on stdin, one reply per line on the original stdout
(everything else the libraries print goes to stderr).

Backends: ``cuda`` (CUDA graphs, event timing, cold L2 by rotating request sets) and
``interpreter`` (``TRITON_INTERPRET=1``, wall-clock timing of one call; not GPU timings).

Each request names its kernel's adapter (:attr:`tuner.adapter.KernelAdapter.spec`); the process makes it once
and runs the request through it: its input sets, prepared launches, gate and launch size.
"""

from __future__ import annotations

import os
import platform
import signal
import socket
import sys
import time
import traceback

BACKEND = os.environ.get("TUNER_BACKEND", "cuda")
if BACKEND == "interpreter":
    os.environ["TRITON_INTERPRET"] = "1"  # before kernels.decode is imported

import torch  # noqa: E402

from ..db.verdicts import Verdict  # noqa: E402
from ..kernels import timing  # noqa: E402
from .adapter import DEFAULT  # noqa: E402
from .adapter import adapter_named  # noqa: E402
from .protocol import WARNING_AS_ERROR  # noqa: E402
from .protocol import CalibrateRequest  # noqa: E402
from .protocol import Exit  # noqa: E402
from .protocol import Hello  # noqa: E402
from .protocol import MeasureReply  # noqa: E402
from .protocol import MeasureRequest  # noqa: E402
from .protocol import decode as decode_message  # noqa: E402
from .protocol import encode  # noqa: E402

SAMPLE_MS = 2.0  # GPU: replays per sample are chosen so that one sample lasts at least this long
PREPARED_CONFIGS = 3  # configs whose prepared calls are kept (the candidate, the baseline, one more)


def environment() -> dict:
    import triton

    env = {"backend": BACKEND, "torch": torch.__version__, "triton": triton.__version__, "host": socket.gethostname()}
    if BACKEND == "cuda":
        p = torch.cuda.get_device_properties(0)
        env.update(
            gpu_name=p.name,
            compute_capability=f"{p.major}.{p.minor}",
            sm_count=p.multi_processor_count,
            cuda=str(torch.version.cuda),
            driver=_driver(),
            l2_bytes=int(getattr(p, "L2_cache_size", 0)),
        )
        env["copy_gbps"] = _copy_gbps()
    else:
        env.update(
            gpu_name="cpu-interpreter",
            compute_capability="-",
            sm_count=0,
            cuda="-",
            driver=platform.processor() or platform.machine(),
            l2_bytes=0,
        )
    return env


def _copy_gbps() -> float:
    """The memory roofline: an elementwise fp32 pass over 1 GiB (bytes read + written), median of 5."""
    x = torch.empty(1 << 28, dtype=torch.float32, device="cuda").uniform_()
    y = torch.empty_like(x)
    times = []
    for _ in range(6):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.add(x, 1.0, out=y)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    del x, y
    torch.cuda.empty_cache()
    return 2 * (1 << 30) / (sorted(times[1:])[2] * 1e-3) / 1e9


def _driver() -> str:
    try:
        import subprocess

        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, IndexError, Exception):
        return "unknown"


class Inputs:
    """The input sets of one (adapter, workload, batch) a timing rotates through
    (:meth:`~tuner.adapter.KernelAdapter.measure_inputs`: on a GPU enough of them for a cold L2)."""

    def __init__(self, adapter, wl, batch: int, l2_bytes: int, device: str, seed: int = 12345) -> None:
        self.parts = adapter.measure_inputs(wl, batch, device, l2_bytes, seed)
        self.sets = len(self.parts)


class Runner:
    def __init__(self) -> None:
        self.env = environment()
        self.device = "cuda" if BACKEND == "cuda" else "cpu"
        self.inputs: dict = {}
        self.warmed: set = set()
        self.prepared: dict = {}  # (config, id(inputs)) -> its prepared calls, see _calls

    def _inputs(self, adapter, wl, batch: int, seed: int = 12345) -> Inputs:
        """The input pool of (workload, batch); ``seed`` builds an independent one (the A/A)."""
        key = (adapter.spec, wl, batch, seed)
        if key not in self.inputs:
            if not any(k[:3] == key[:3] for k in self.inputs):
                self.inputs.clear()
                self.prepared.clear()
                if self.device == "cuda":
                    torch.cuda.empty_cache()
            self.inputs[key] = Inputs(adapter, wl, batch, self.env["l2_bytes"], self.device, seed)
        return self.inputs[key]

    def _calls(self, adapter, inp: Inputs, cfg) -> tuple[list, bool]:
        """``cfg``'s prepared call on each request set of ``inp`` (:meth:`~tuner.adapter.KernelAdapter.prepare`),
        and whether they are new (not yet run). Kept for the last few configs: a round captures the candidate
        and the baseline afresh, and planning 512 calls each time would cost more than the GPU time measured at
        a small batch."""
        key = (cfg, id(inp))
        calls = self.prepared.pop(key, None)
        fresh = calls is None
        if fresh:
            calls = adapter.prepare(cfg, inp.parts)
        self.prepared[key] = calls  # most recently used last
        while len(self.prepared) > PREPARED_CONFIGS:
            del self.prepared[next(iter(self.prepared))]
        return calls, fresh

    def _capture(self, adapter, inp: Inputs, wl, cfg):
        """A fresh capture of ``cfg`` on ``inp``: a function returning one sample (µs per call, calls)."""

        if self.device != "cuda":

            def step(i):
                return adapter.launch(cfg, inp.parts[i])

            def wall() -> tuple[float, int]:
                t0 = time.perf_counter()
                step(0)
                return (time.perf_counter() - t0) * 1e6, 1

            key = (cfg, wl, inp.sets, id(inp))
            if key not in self.warmed:  # the interpreter has nothing to capture: warm once per config and inputs
                step(0)
                self.warmed.add(key)
            return wall
        calls, fresh = self._calls(adapter, inp, cfg)
        # the warm-up pass (compile, first touch) runs once per config and inputs, not before every capture
        graph = timing.capture(lambda i: calls[i](), inp.sets, warm=fresh)
        return timing.sampler(graph, inp.sets, SAMPLE_MS)

    def _pairs(self, first, second, rounds: int) -> tuple[list[tuple[float, float]], int]:
        """``rounds`` rounds, each with fresh captures (``first()``/``second()`` make one) timed back to back,
        the order alternating so that neither always runs second."""
        samples, reps = [], 1
        for r in range(rounds):
            a, b = first(), second()
            if r % 2 == 0:
                x, reps = a()
                y, _ = b()
            else:
                y, _ = b()
                x, reps = a()
            samples.append((x, y))
        return samples, reps

    def measure(self, req: MeasureRequest) -> MeasureReply:
        adapter = adapter_named(req.kernel)
        wl, batch, cand, base = req.workload, req.batch, req.candidate, req.baseline
        _inject_fault(cand)
        num_splits = adapter.launch_size(cand, wl, batch)
        errs = {}
        if req.check:
            why, errs = adapter.gate(cand, wl, batch, self.device, req.seed)
            if why:
                return MeasureReply(Verdict.WRONG, why, num_splits=num_splits, **errs)
        inp = self._inputs(adapter, wl, batch)
        samples, reps = self._pairs(
            lambda: self._capture(adapter, inp, wl, cand), lambda: self._capture(adapter, inp, wl, base), req.rounds
        )
        return MeasureReply(Verdict.OK, "", samples, reps, num_splits, **errs)

    def calibrate(self, req: CalibrateRequest) -> MeasureReply:
        """A/A: ``pairs`` independent captures of one config on two independently built input pools."""
        adapter = adapter_named(req.kernel)
        wl, batch, cfg = req.workload, req.batch, req.config
        pools = [self._inputs(adapter, wl, batch, seed) for seed in (12345, 54321)]
        for inp in pools:  # warm-up: compile, allocate, settle clocks
            self._capture(adapter, inp, wl, cfg)()
        samples, reps = self._pairs(
            lambda: self._capture(adapter, pools[0], wl, cfg),
            lambda: self._capture(adapter, pools[1], wl, cfg),
            req.pairs,
        )
        return MeasureReply(Verdict.OK, "", samples, reps, adapter.launch_size(cfg, wl, batch))


def _inject_fault(cfg) -> None:
    """Test hook: TUNER_FAULT=crash@T32-w4-s1-c4 (or hang@..., oor@...) makes this config crash, hang or
    fail its launch with OutOfResources."""
    fault = os.environ.get("TUNER_FAULT", "")
    for item in filter(None, fault.split(",")):
        kind, _, target = item.partition("@")
        if target == str(cfg):
            if kind == "crash":
                os._exit(17)
            if kind == "hang":
                time.sleep(10**6)
            if kind == "oor":  # what Triton raises when a launch needs more shared memory than the GPU has
                from triton.runtime.errors import OutOfResources

                raise OutOfResources(120_000, 101_376, "shared memory")


def _warning_in(e: BaseException) -> Warning | None:
    """The Python warning an error is, or was raised from (Triton's interpreter wraps it), if any."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, Warning):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def main() -> int:
    # Ctrl-C in the terminal reaches the whole process group: the parent finishes the running trial
    # and stops; this process must not die under it (it exits when the parent closes its stdin).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # so too a SIGTERM to the group (the parent kills with SIGKILL)
    proto = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints must not corrupt the protocol
    adapter_named(os.environ.get("TUNER_KERNEL") or DEFAULT)  # imported before the first request's clock starts
    runner = Runner()
    proto.write(encode(Hello(runner.env)) + "\n")
    for line in sys.stdin:
        req = decode_message(line)
        if isinstance(req, Exit):
            return 0
        try:
            reply = runner.calibrate(req) if isinstance(req, CalibrateRequest) else runner.measure(req)
        except Exception as e:  # noqa: BLE001 - a failing config is a verdict; the process lives on
            name = type(e).__name__
            tail = traceback.format_exc().strip().splitlines()[-1]
            warning = _warning_in(e)
            if name == "OutOfResources":
                reply = MeasureReply(Verdict.INFEASIBLE, f"OutOfResources at launch: {e}")
            elif warning is not None:
                reply = MeasureReply(Verdict.CRASHED, f"{WARNING_AS_ERROR}: {type(warning).__name__}: {warning}")
            else:
                reply = MeasureReply(Verdict.CRASHED, f"{name}: {tail[:500]}")
        proto.write(encode(reply) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
