"""The ``replay`` backend: re-run a search on a CPU from the samples recorded in another database.

This is Kernel Tuner's simulation mode for this tuner: try a new policy, sampler or subset of a space
without a GPU. Each measurement draws ``rounds`` rounds from the samples recorded for the same
(workload, concurrency, config, device) by one kernel (``--replay-kernel HASH``; by default the newest kernel
measured at that concurrency), with replacement, keeping each round's (candidate, baseline) pairing. The draws
are seeded by the search's ``--seed``, the config and the phase, so a seed replays the same, and the
seeds of a benchmark differ. A config with no recorded samples is
``missing`` and never picked; a recorded ``infeasible``, ``wrong``, ``crashed`` or ``timeout`` verdict
is replayed as it was. A config that was not recorded
itself but launches exactly what a recorded one launches (same binary, same split count: TARGET_CTAS
values that clamp alike) replays that recording, as the live search would have measured it once.
The A/A comes from that kernel's calibrations (or, in databases older than calibrations, its per-study
A/A samples): another kernel's A/A measured other binaries.

The source is read with plain SQL on columns every schema version has, opened read-only, so any
results database, old or new, can be replayed without being migrated. It replays one kernel's recordings, through
its adapter (the space's): a stored workload is read back by :meth:`KernelAdapter.recorded_workload` and matched by
:meth:`KernelAdapter.replay_key`, a stored config by :meth:`KernelAdapter.parse_config`, and two configs of one
launch by :meth:`KernelAdapter.launch_identity`.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import warnings
from collections import defaultdict
from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np
from sqlalchemy import create_engine
from sqlalchemy import inspect
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from ..db.models import COLUMNS_ADAPTER
from ..db.models import WorkloadModel
from ..db.store import check_url
from ..db.verdicts import Verdict
from .adapter import KernelAdapter
from .adapter import default_adapter
from .errors import TunerError
from .feasibility import Feasibility
from .protocol import CalibrateRequest
from .protocol import MeasureReply
from .protocol import MeasureRequest


@dataclass
class _Recorded:
    verdict: str
    reason: str
    num_splits: int
    shared_bytes: int | None
    limit_bytes: int | None
    registers: int | None
    spill_bytes: int | None
    estimate_bytes: int | None
    duplicate_of: int | None
    samples: list[tuple[float, float]]
    trial_id: int = 0  # the recording's trial: a later one stands over an earlier one
    wall_s: float = 0.0  # the recorded trial's wall time (its screening rounds, on the GPU that measured it)
    screen_rounds: int = 0  # how many of ``samples`` are screening rounds

    def round_s(self) -> float | None:
        """One screening round's recorded wall time (capture, replays, timing), or None when unknown."""
        return self.wall_s / self.screen_rounds if self.wall_s and self.screen_rounds else None


def _engine(url: str):
    check_url(url, create=False, option="--replay-db")  # as --db is checked: one sentence, and never a FIFO opened
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        path = u.database
        return create_engine("sqlite://", creator=lambda: sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True))
    return create_engine(url)


def _pick_device(con, device: str | None) -> str:
    """The GPU whose recordings are replayed: ``device`` if the database has it, else its only GPU."""
    devices = [r[0] for r in con.execute(text("SELECT DISTINCT gpu_name FROM tuner_environments"))]
    devices = [d for d in devices if d != "cpu-interpreter"] or devices
    if not devices:
        raise TunerError("the replay database holds no recorded measurements; replay one that a search filled")
    if device is None:
        if len(devices) != 1:
            raise TunerError(f"the replay database holds several devices {devices}; pick one with --replay-device")
        return devices[0]
    if device not in devices:
        raise TunerError(f"--replay-device {device!r} is not in the replay database; it has {devices}")
    return device


def _pick_kernel(con, kernel: str | None) -> int | None:
    """The id of the kernel whose samples are replayed (``None``: the newest measured at each level)."""
    if kernel is None:
        return None
    hashes = {h: i for i, h in con.execute(text("SELECT id, source_hash FROM tuner_kernels"))}
    if kernel not in hashes:
        shown = ", ".join(sorted(hashes)[:20])
        raise TunerError(f"--replay-kernel {kernel[:80]!r} is not in the replay database; it has kernels {shown}")
    return hashes[kernel]


def _environment_info(con, device: str) -> dict:
    """What a measurement process reports about its GPU, as the first recording on ``device`` said it."""
    env = (
        con.execute(text("SELECT * FROM tuner_environments WHERE gpu_name = :d ORDER BY id LIMIT 1"), {"d": device})
        .mappings()
        .one()
    )
    return {
        "backend": "replay",
        "gpu_name": device,
        "compute_capability": env["compute_capability"],
        "sm_count": env["sm_count"],
        "cuda": env["cuda"],
        "driver": env["driver"],
        "torch": env["torch"],
        "triton": env["triton"],
        "host": f"replay of {env['host']}",
        "copy_gbps": env.get("copy_gbps"),
        "l2_bytes": 0,
    }


_IN_CHUNK = 900  # trial ids per ``IN (...)`` list: under SQLite's oldest bound of 999 variables


def workload_keys(con, adapter: KernelAdapter) -> dict[int, Hashable]:
    """{workload id: :meth:`KernelAdapter.replay_key`} of the stored workloads of ``adapter``'s kernel (a database
    older than other adapters' records holds the built-in kernel's alone)."""
    known = set(WorkloadModel.__table__.columns.keys())
    cols = [c["name"] for c in inspect(con).get_columns("tuner_workloads") if c["name"] in known]
    out = {}
    for r in con.execute(text("SELECT * FROM tuner_workloads")).mappings():
        row = WorkloadModel(**{"adapter": COLUMNS_ADAPTER, "fields": "", "call": None, **{c: r[c] for c in cols}})
        if row.adapter != adapter.spec:
            continue
        try:
            out[r["id"]] = adapter.replay_key(adapter.recorded_workload(row))
        except (ValueError, TypeError, KeyError):  # stored by another version of the adapter: not replayed
            continue
    return out


class ReplaySource:
    """Every trial and sample of one device in another results database, in memory, of one kernel (``adapter``:
    the space's; by default the one a space that names none gets)."""

    def __init__(
        self, url: str, device: str | None = None, kernel: str | None = None, adapter: KernelAdapter | None = None
    ) -> None:
        self.adapter = adapter or default_adapter()
        try:
            engine = _engine(url)
            with engine.connect() as con:
                tables = inspect(con).get_table_names()
                if "tuner_trials" not in tables:
                    raise TunerError("the replay database has no tuner results (run `tuner search` on a GPU first)")
                self.workloads = workload_keys(con, self.adapter)
                self.device = _pick_device(con, device)
                self.info = _environment_info(con, self.device)
                self.kernel_id = _pick_kernel(con, kernel)
                self.trials, self.kernel_at = self._recorded_trials(con, self.device, self.kernel_id)
                self.noise = self._noise(con, tables, self.device, self.kernel_at)
        except SQLAlchemyError as e:
            raise TunerError(f"cannot read the replay database: {str(getattr(e, 'orig', e)).splitlines()[0]}") from None
        self._by_launch: dict[tuple, dict[Hashable, _Recorded]] = {}  # (shape, batch) -> launch -> recording

    def _key(self, r) -> tuple | None:
        """A recorded trial's (workload key, concurrency); None: another kernel's workload."""
        w = self.workloads.get(r["workload_id"])
        return None if w is None else (w, r["concurrency"])

    def _recorded_trials(self, con, device: str, kernel_id: int | None) -> tuple[dict[tuple, _Recorded], dict]:
        """The recorded trials on ``device`` by (shape, concurrency, config), with their samples (a
        duplicate takes its original's samples and verdict): at each (shape, concurrency) only those of
        the newest kernel measured there, as ``tuner best`` reads them. A ratio is against the baseline
        measured with its own kernel, so an older kernel's ratio does not compare with a newer one's
        (kernel v6's masked combine slowed the V3.2 baseline at C=1 from 20.2 to 24.2 us, and the
        baseline-relative ratios of v5's recordings then beat every v6 config)."""
        cols = set(c["name"] for c in inspect(con).get_columns("tuner_trials"))
        dup = "t.duplicate_of" if "duplicate_of" in cols else "NULL"
        rows = con.execute(
            text(
                f"SELECT t.id, t.concurrency, t.config_key, t.verdict, t.reason, t.num_splits, t.shared_bytes, "
                f"t.limit_bytes, t.registers, t.spill_bytes, t.estimate_bytes, {dup} AS duplicate_of, t.wall_s, "
                "t.kernel_id, t.workload_id "
                "FROM tuner_trials t JOIN tuner_environments e ON t.environment_id = e.id WHERE e.gpu_name = :d "
                "ORDER BY t.id"
            ),
            {"d": device},
        ).mappings()
        rows = [r for r in rows if self._key(r) is not None]  # this kernel's workloads alone
        _key = self._key
        newest: dict[tuple, int] = {}  # (shape, concurrency) -> the replayed kernel: given, else the latest
        for r in rows:  # ordered by id
            if kernel_id is None or r["kernel_id"] == kernel_id:
                newest[_key(r)] = r["kernel_id"]
        # only what is replayed: the replayed kernel's trials at each (shape, concurrency), and the originals
        # their duplicates take their samples and verdicts from (of any kernel)
        dup_of = {r["id"]: r["duplicate_of"] for r in rows if r["duplicate_of"] is not None}
        originals: set[int] = set()
        for r in rows:
            if r["kernel_id"] == newest.get(_key(r)):
                d = r["duplicate_of"]
                while d is not None and d not in originals:  # an original may be a duplicate itself
                    originals.add(d)
                    d = dup_of.get(d)
        by_id: dict[int, _Recorded] = {}
        trials: dict[tuple, _Recorded] = {}
        skipped: set[str] = set()
        for r in rows:
            replayed = r["kernel_id"] == newest.get(_key(r))
            if not replayed and r["id"] not in originals:
                continue
            rec = _Recorded(
                r["verdict"],
                r["reason"] or "",
                r["num_splits"] or 0,
                r["shared_bytes"],
                r["limit_bytes"],
                r["registers"],
                r["spill_bytes"],
                r["estimate_bytes"],
                r["duplicate_of"],
                [],
                r["id"],
                float(r["wall_s"] or 0.0),
            )
            by_id[r["id"]] = rec  # a duplicate's original may be of any kernel
            if replayed:  # a config measured in several of its studies: the latest stands
                try:
                    cfg = self.adapter.parse_config(r["config_key"])
                except ValueError:  # stored by another version of the declaration: data, not a config here
                    skipped.add(str(r["config_key"])[:80])
                    continue
                trials[(*_key(r), cfg)] = rec
        wanted = sorted(by_id)
        for lo in range(0, len(wanted), _IN_CHUNK):  # the samples of those trials alone
            chunk = wanted[lo : lo + _IN_CHUNK]
            marks = ", ".join(f":t{i}" for i in range(len(chunk)))
            got = con.execute(
                text(
                    "SELECT trial_id, candidate_us, baseline_us, phase FROM tuner_samples "
                    f"WHERE trial_id IN ({marks}) ORDER BY id"
                ),
                {f"t{i}": t for i, t in enumerate(chunk)},
            )
            for trial_id, c, b, phase in got:
                by_id[trial_id].samples.append((c, b))
                by_id[trial_id].screen_rounds += phase == "screen"
        for rec in by_id.values():
            if rec.duplicate_of is not None and rec.duplicate_of in by_id:
                original = by_id[rec.duplicate_of]
                rec.samples, rec.verdict = original.samples, original.verdict
                rec.wall_s, rec.screen_rounds = original.wall_s, original.screen_rounds
        if skipped:
            warnings.warn(
                f"the replay database holds {len(skipped)} config keys this declaration does not allow "
                f"(e.g. {sorted(skipped)[0]!r}); they are not replayed",
                stacklevel=2,
            )
        return trials, newest

    def _noise(self, con, tables, device, kernel_at: dict) -> dict[tuple, list]:
        """A/A samples per (workload shape, concurrency), only of the kernel replayed there: its calibrations,
        else its studies' own A/A, else (the oldest databases) its baseline trials' rounds against themselves.
        Another kernel's A/A measured other binaries, so it never stands in."""
        found: dict[tuple, list] = {}
        cal = "tuner_calibrations" in tables and "kernel_id" in {
            c["name"] for c in inspect(con).get_columns("tuner_calibrations")
        }
        queries = []
        if cal:
            queries.append(
                "SELECT c.samples, c.concurrency, c.kernel_id, c.workload_id FROM tuner_calibrations c "
                "JOIN tuner_environments e ON c.environment_id = e.id WHERE e.gpu_name = :d"
            )
        if "tuner_noise" in tables:
            queries.append(
                "SELECT n.samples, c.concurrency, c.kernel_id, c.workload_id FROM tuner_noise n "
                "JOIN tuner_studies c ON n.study_id = c.id "
                "JOIN tuner_environments e ON c.environment_id = e.id WHERE e.gpu_name = :d"
            )
        for q in queries:  # each source only where the ones before it had nothing
            out: dict[tuple, list] = defaultdict(list)
            for r in con.execute(text(q), {"d": device}).mappings():
                key = self._key(r)
                if key is not None and key not in found and r["kernel_id"] == kernel_at.get(key):
                    out[key] += [tuple(x) for x in json.loads(r["samples"])]
            found.update(out)
        q = (
            "SELECT x.candidate_us, x.baseline_us, t.concurrency, t.kernel_id, t.workload_id "
            "FROM tuner_samples x JOIN tuner_trials t ON x.trial_id = t.id "
            "JOIN tuner_environments e ON t.environment_id = e.id "
            "WHERE e.gpu_name = :d AND t.is_baseline AND x.phase = 'screen'"
        )
        out = defaultdict(list)
        for r in con.execute(text(q), {"d": device}).mappings():
            key = self._key(r)
            if key is not None and key not in found and r["kernel_id"] == kernel_at.get(key):
                out[key].append((r["candidate_us"], r["baseline_us"]))
        found.update(out)
        return found

    def lookup(self, wl, batch: int, cfg) -> _Recorded | None:
        """The recording of ``cfg`` at ``batch``, else the latest of a config with the same launch (a bounded
        search measured one config of a launch; a replayed grid may ask for another of the same launch)."""
        shape = self.adapter.replay_key(wl)
        rec = self.trials.get((shape, batch, cfg))
        if rec is not None:
            return rec
        if (shape, batch) not in self._by_launch:
            latest: dict[Hashable, _Recorded] = {}
            for (s, c, recorded), r in self.trials.items():
                if (s, c) == (shape, batch):
                    launch = self.adapter.launch_identity(recorded, wl, batch)
                    if launch not in latest or r.trial_id > latest[launch].trial_id:
                        latest[launch] = r
            self._by_launch[(shape, batch)] = latest
        return self._by_launch[(shape, batch)].get(self.adapter.launch_identity(cfg, wl, batch))

    def feasibility(self, configs: list, wl, levels: list[int]) -> list[Feasibility]:
        """The recorded compile-only verdicts: a config recorded infeasible at any level stays infeasible."""
        out = []
        for cfg in configs:
            recs = [r for c in levels if (r := self.lookup(wl, c, cfg)) is not None]
            bad = next((r for r in recs if r.verdict == Verdict.INFEASIBLE), None)
            any_r = bad or (recs[0] if recs else None)
            nums = [getattr(any_r, f) or 0 if any_r else 0 for f in ("shared_bytes", "limit_bytes", "registers")]
            spill = (any_r.spill_bytes or 0) if any_r else 0
            est = (any_r.estimate_bytes or 0) if any_r else 0
            out.append(Feasibility(bad is None, nums[0], nums[1], nums[2], spill, est, bad.reason if bad else ""))
        return out


class SimulatedGPUs:
    """N simulated GPUs sharing one study, in virtual time: what ``--workers N`` does on N GPUs, replayed.

    Each replayed measurement costs its GPU the recorded wall time of its rounds (:meth:`_Recorded.round_s`)
    divided by the GPU's ``speeds[i]``. The study's measurement threads (one per GPU, as on a GPU host) run one at a
    time, in the order of virtual time: a thread that starts a measurement hands the turn on, and the next to run is
    a thread that has not started yet, then an idle one that has not looked at the study since the last measurement
    ended, then the measurement that ends first (ties: the lower GPU index), whose thread goes on at that moment. So
    a replay with N GPUs is deterministic, and the study's own code (proposals with trials running elsewhere, the
    stop rule, the queue) is what runs on a real multi-GPU host: only the measurement process is simulated.

    ``now`` is the virtual wall time so far; ``busy[i]`` each GPU's measuring time. A measurement outside a level's
    threads (the finalist rounds, measured by the first GPU after the level's threads end) runs without waiting.
    """

    NEW, READY, WORK, MEASURE, IDLE, DONE = range(6)
    DEFAULT_ROUND_S = 0.03  # a round's wall time where the recording has none (the H200's median is 0.03-0.1 s)

    def __init__(self, speeds: list[float]) -> None:
        if not speeds or any(not (s > 0) for s in speeds):
            raise TunerError(f"simulated GPU speeds must be positive numbers, got {speeds}")
        self.speeds = list(speeds)
        self.n = len(speeds)
        self.now = 0.0
        self.busy = [0.0] * self.n
        self._cond = threading.Condition()
        self._state = [self.NEW] * self.n
        self._until = [0.0] * self.n  # a measuring GPU's end, in virtual time
        self._seen = [0] * self.n  # an idle thread: the last event it saw
        self._event = 0  # measurements ended so far
        self._turn: int | None = None  # the thread that runs now
        self._stalled = False  # every thread idle, none measuring: they look again in real time

    def _grant(self) -> None:
        """Hand the turn to the next thread (see the class); the caller holds the lock and has given it up."""
        st = self._state
        if self._turn is not None or self.NEW in st:
            return  # a level's threads all start before any runs
        self._stalled = False
        nxt = next((i for i in range(self.n) if st[i] == self.READY), None)
        if nxt is None:
            nxt = next((i for i in range(self.n) if st[i] == self.IDLE and self._seen[i] < self._event), None)
        if nxt is None:
            measuring = [(self._until[i], i) for i in range(self.n) if st[i] == self.MEASURE]
            if measuring:
                t, nxt = min(measuring)
                self.now = max(self.now, t)
                self._event += 1
            elif self.IDLE in st:
                self._stalled = True  # nothing ends in virtual time: the idle threads look again after a real pause
        if nxt is not None:
            st[nxt], self._turn = self.WORK, nxt
            self._seen[nxt] = self._event
        self._cond.notify_all()

    def _wait_turn(self, i: int, patience_s: float | None = None) -> None:
        while self._turn != i:
            if not self._cond.wait(timeout=patience_s) and patience_s is not None and self._stalled:
                self._state[i], self._turn, self._seen[i], self._stalled = self.WORK, i, self._event, False
                return

    def begin(self, i: int) -> None:
        """GPU ``i``'s thread starts its part of a level: it runs when its turn comes."""
        with self._cond:
            self._state[i] = self.READY
            self._grant()
            self._wait_turn(i)

    def measure(self, i: int, seconds: float) -> None:
        """GPU ``i`` measures for ``seconds`` (at speed 1): returns when that measurement ends in virtual time."""
        with self._cond:
            took = seconds / self.speeds[i]
            self.busy[i] += took
            if self._state[i] != self.WORK:  # outside the level's threads (the finalists): no one to wait for
                self.now += took
                return
            self._state[i], self._until[i], self._turn = self.MEASURE, self.now + took, None
            self._grant()
            self._wait_turn(i)

    def idle(self, i: int) -> None:
        """GPU ``i``'s thread has nothing to do now: it looks again once a measurement has ended."""
        with self._cond:
            if self._state[i] != self.WORK:
                return
            self._state[i], self._turn = self.IDLE, None
            self._grant()
            self._wait_turn(i, patience_s=0.2)

    def end(self, i: int) -> None:
        """GPU ``i``'s thread is done with the level; when all are, the next level's threads start afresh."""
        with self._cond:
            self._state[i] = self.DONE
            if self._turn == i:
                self._turn = None
            if all(s == self.DONE for s in self._state):
                self._state = [self.NEW] * self.n
            self._grant()


class ReplayProcess:
    """Stands in for a :class:`tuner.measure.MeasurementProcess`: answers from recorded samples. With ``gpus``
    (:class:`SimulatedGPUs`), it is GPU ``gpu_index`` of them, and each measurement takes its virtual time."""

    def __init__(self, source: ReplaySource, gpu_index: int = 0, gpus: SimulatedGPUs | None = None) -> None:
        self.source = source
        self.info = source.info
        self.gpu_index, self.gpus = gpu_index, gpus

    def start(self) -> dict:
        return self.info

    def close(self) -> None:
        pass

    def begin(self) -> None:
        if self.gpus is not None:
            self.gpus.begin(self.gpu_index)

    def idle(self) -> None:
        if self.gpus is not None:
            self.gpus.idle(self.gpu_index)
        else:
            time.sleep(0.2)

    def end(self) -> None:
        if self.gpus is not None:
            self.gpus.end(self.gpu_index)

    def measure(self, req: MeasureRequest | CalibrateRequest, timeout_s: float) -> MeasureReply:
        reply = self._reply(req)
        if self.gpus is not None:
            self.gpus.measure(self.gpu_index, self._seconds(req, reply))
        return reply

    def _seconds(self, req, reply: MeasureReply) -> float:
        """The recorded wall time of what ``req`` measured: its rounds at the recording's time per round."""
        if isinstance(req, CalibrateRequest):
            return 2 * req.pairs * SimulatedGPUs.DEFAULT_ROUND_S
        rec = self.source.lookup(req.workload, req.batch, req.candidate)
        per = rec.round_s() if rec is not None else None
        if reply.verdict != Verdict.OK:
            return per or SimulatedGPUs.DEFAULT_ROUND_S  # a failed launch: about one round
        return req.rounds * (per or SimulatedGPUs.DEFAULT_ROUND_S)

    def _reply(self, req: MeasureRequest | CalibrateRequest) -> MeasureReply:
        if isinstance(req, CalibrateRequest):
            pool = self.source.noise.get((self.source.adapter.replay_key(req.workload), req.batch), [])
            if len(pool) < 2:
                return MeasureReply(Verdict.MISSING, "no recorded A/A samples for this workload and concurrency")
            return MeasureReply(Verdict.OK, "", _draw(pool, req.pairs, seed=req.seed))
        rec = self.source.lookup(req.workload, req.batch, req.candidate)
        if rec is None:
            return MeasureReply(Verdict.MISSING, f"no recorded samples for {req.candidate} at C={req.batch}")
        if rec.verdict != Verdict.OK or not rec.samples:
            verdict = Verdict(rec.verdict) if rec.verdict in set(Verdict) else Verdict.MISSING
            if verdict == Verdict.OK:
                verdict = Verdict.MISSING
            return MeasureReply(verdict, rec.reason or "recorded without samples", num_splits=rec.num_splits)
        return MeasureReply(Verdict.OK, "", _draw(rec.samples, req.rounds, req.seed), 1, rec.num_splits)


def _draw(samples: list[tuple[float, float]], n: int, seed: int) -> list[tuple[float, float]]:
    """``n`` rounds drawn with replacement, each keeping its (candidate, baseline) pairing."""
    idx = np.random.default_rng(seed).integers(0, len(samples), n)
    return [tuple(samples[i]) for i in idx]
