"""The surrogate's hyperparameter optimization, off the proposal path.

Optimizing a Gaussian process's hyperparameters (L-BFGS-B over some thirty length scales, amplitudes and a
noise level) takes seconds; a fit with fixed hyperparameters takes milliseconds. :class:`Refitter` runs the
optimizations in one worker process while the strategy goes on proposing with the last hyperparameters,
and hands the new ones over when they are ready. Three modes:

- ``background`` (a search on a GPU): the new hyperparameters swap in at the first model fit after the
  worker finished; the proposal path never waits. Which proposal that is depends on timing.
- ``deterministic`` (a replay, the benchmark and the tests): an optimization started at a level's ``n``-th
  measurement swaps in at its ``n + lag``-th (or when the next one is due, or at the next level), waiting
  for the worker if it is not done, so a seed's search is the same on any machine load.
- ``inline``: optimized on the spot and swapped in at once (no worker).

The optimization itself is capped (:func:`optimize`): single-threaded BLAS, at most :data:`MAXITER`
L-BFGS-B iterations, warm-started from the last optimum; the caller subsamples the training set.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import multiprocessing.util
import os
import signal
import threading
import time
import warnings

MODES = ("background", "deterministic", "inline")
MAXITER = 100  # L-BFGS-B iterations per start: warm-started fits converge in 20-40, random starts in about 90


def optimize(X, y, alpha, kernel, restarts: int, seed: int, maxiter: int = MAXITER):
    """``kernel`` with its hyperparameters optimized on ``(X, y)`` (log marginal likelihood, L-BFGS-B from
    ``kernel``'s values plus ``restarts`` random starts), and the seconds it took."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.gaussian_process import GaussianProcessRegressor
    from threadpoolctl import threadpool_limits

    t0 = time.perf_counter()
    gp = GaussianProcessRegressor(
        kernel=kernel,
        alpha=alpha,
        normalize_y=True,
        optimizer=_Lbfgsb(maxiter),
        n_restarts_optimizer=restarts,
        random_state=seed,
    )
    # one BLAS thread: the matrices are small, and threads contend with the search's own (2-4x slower on 2 cores)
    with threadpool_limits(1), warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        gp.fit(X, y)
    return gp.kernel_, time.perf_counter() - t0


class _Lbfgsb:
    """scikit-learn's optimizer with an iteration cap (a class, so the worker can unpickle it)."""

    def __init__(self, maxiter: int) -> None:
        self.maxiter = maxiter

    def __call__(self, obj_func, initial_theta, bounds):
        from scipy.optimize import minimize

        res = minimize(
            obj_func, initial_theta, method="L-BFGS-B", jac=True, bounds=bounds, options={"maxiter": self.maxiter}
        )
        return res.x, res.fun


_POOLS: set = set()  # every worker pool not yet ended: ended before the interpreter waits for its children


def _end(pool) -> None:
    """End a pool's worker now, an optimization in flight included."""
    _POOLS.discard(pool)
    workers = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for w in workers:
        w.terminate()


def _end_all() -> None:
    for pool in list(_POOLS):
        _end(pool)


class _Forked:
    """What multiprocessing's after-fork hook is registered on (it keeps its objects by weak reference)."""


_FORKED = _Forked()


def _in_forked_child(_) -> None:
    """In a process multiprocessing forked: the parent's pools are not this one's, and multiprocessing has
    cleared the exit hooks this module registered in the parent (the search benchmark's runs import it first
    there): register them again, or the child's exit would wait for its workers forever."""
    _POOLS.clear()
    multiprocessing.util.Finalize(None, _end_all, exitpriority=100)


# at exit, before anything waits for the workers: concurrent.futures' own hook (in the main process; these run
# last registered first) and multiprocessing's join of a forked process's children (the search benchmark's runs)
if hasattr(threading, "_register_atexit"):
    threading._register_atexit(_end_all)
multiprocessing.util.Finalize(None, _end_all, exitpriority=100)
multiprocessing.util.register_after_fork(_FORKED, _in_forked_child)


def _ready() -> None:
    """Import what :func:`optimize` needs (in the worker, before the first optimization)."""
    import sklearn.gaussian_process  # noqa: F401
    import threadpoolctl  # noqa: F401


@contextlib.contextmanager
def _spawning():
    """What a worker process started in here inherits, this process left as it was after: ``PYTHONSAFEPATH=1`` (the
    spawned interpreter starts as ``python -c``, with the working folder first on sys.path; that keeps a json.py or
    torch.py there from running in it), and SIGINT blocked (a thread's signal mask survives fork and exec), so that a
    Ctrl-C at the terminal, which reaches every process of the group, interrupts the search alone (which ends its
    worker) and never prints a traceback of the worker's, however early in its start it comes. Blocked, not
    ignored: one that comes meanwhile reaches this process once the worker has started."""
    safe = os.environ.get("PYTHONSAFEPATH")
    os.environ["PYTHONSAFEPATH"] = "1"
    # multiprocessing's resource tracker first: starting it (at the first spawn) unblocks SIGINT in this thread
    import multiprocessing.resource_tracker

    multiprocessing.resource_tracker.ensure_running()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if hasattr(signal, "pthread_sigmask") else None
    try:
        yield
    finally:
        if mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if safe is None:
            os.environ.pop("PYTHONSAFEPATH", None)
        else:
            os.environ["PYTHONSAFEPATH"] = safe


def _watch_parent(pid: int) -> None:
    """In the worker: end when the search's process does, however it ended (a killed parent leaves its pool's
    worker waiting for work forever). A Ctrl-C at the terminal is the search's to handle, which ends this worker:
    ignored here (also when the worker was started off the main thread, where it could not be inherited)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch():
        while os.getppid() == pid:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


class Refitter:
    """At most one hyperparameter optimization in flight, and when its result swaps in (see the module)."""

    def __init__(self, mode: str = "background", lag: int = 2) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown refit mode {mode!r}; allowed: {', '.join(MODES)}")
        self.mode, self.lag = mode, lag
        self.fits = 0  # optimizations started
        self.seconds = 0.0  # their own time (in the worker: off the proposal path)
        self.wait_seconds = 0.0  # time the proposal path waited for one
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._job = None  # (future, tag, due): tag names the level; due: the measurement count it swaps in at

    def start(self) -> None:
        """Start the worker now (it imports scikit-learn: a second or two), so the first optimization does not
        wait for it."""
        if self.mode != "inline" and self._pool is None:
            try:
                with _spawning():  # the first submit starts the worker process
                    self._worker().submit(_ready)
            except Exception:  # noqa: BLE001 - no worker process here: optimizations run on the spot
                self.mode = "inline"

    @property
    def pending(self) -> bool:
        return self._job is not None

    def submit(self, args: tuple, tag, here: int, lag: int | None = None) -> None:
        """Start an optimization (``optimize(*args)``) for level ``tag`` at its ``here``-th measurement."""
        assert self._job is None, "one optimization at a time"
        lag = self.lag if lag is None else lag
        self.fits += 1
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if self.mode != "inline":
            try:
                with _spawning():
                    fut = self._worker().submit(optimize, *args)
            except Exception:  # noqa: BLE001 - no worker process here: optimize on the spot
                self.mode = "inline"
        if self.mode == "inline":
            fut.set_result(optimize(*args))
            lag = 0
        self._job = (fut, tag, here + lag)

    def take(self, tag, here: int, due: bool = False, wait: bool = False):
        """The optimized kernel when it swaps in now, else None. ``due``: a new optimization is due, so the worker
        must be free (deterministic mode then waits for it, background mode does not); ``wait``: wait in any mode."""
        if self._job is None:
            return None
        fut, job_tag, swap_at = self._job
        if self.mode == "background":
            if not (wait or fut.done()):
                return None
        elif not (wait or due or job_tag != tag or here >= swap_at):
            return None
        t0 = time.perf_counter()
        try:
            kernel, seconds = fut.result()
        except Exception:  # noqa: BLE001 - a worker that died: optimize here from now on
            self._job = None
            self.mode = "inline"
            self.close()
            return None
        finally:
            self.wait_seconds += time.perf_counter() - t0
        self._job = None
        self.seconds += seconds
        return kernel

    def _worker(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            # spawn: the search runs threads, and a forked child of a threaded process may deadlock (the worker
            # process itself starts at the first submit: see _spawning)
            self._pool = concurrent.futures.ProcessPoolExecutor(
                1, mp_context=multiprocessing.get_context("spawn"), initializer=_watch_parent, initargs=(os.getpid(),)
            )
            _POOLS.add(self._pool)
        return self._pool

    def close(self) -> None:
        """End the worker now, an optimization in flight included: a pool left to end at the interpreter's exit
        kept a forked process (the search benchmark's runs) from exiting."""
        if self._pool is not None:
            _end(self._pool)
            self._pool = None
