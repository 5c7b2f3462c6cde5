"""Runs ``tuner search`` several times, each run killed with SIGKILL at a chosen moment (tests/test_faults.py).

Reads a JSON plan on stdin: ``{"argv": [...], "url": DB_URL, "marker": PATH, "runs": [KILL | null, ...]}``,
where a KILL is ``{"phase": P, "k": K, "where": "before" | "after"}``. Each run is ``tuner search ARGV``
(the executable's own entry point, :func:`tuner.cli.main`) in a child forked from this process, so the imports
are paid once. The child kills itself with SIGKILL at the K-th moment of phase P in that run:

- ``compile``: the feasibility verdicts (the replay backend's compile-only check): before or after them;
- ``aa``: the A/A of a level: before its measurement, or after its calibration is stored (the band not yet);
- ``screen``: a screening measurement: before it, or after its trial and samples are recorded (Optuna not told);
- ``finalist``: a finalist re-measurement: before it, or after its samples are stored (Optuna not told).

Prints one JSON line per run: its exit status, where it was killed (phase, level, where; null if it ran to the
end), every sample in the database afterwards and its Optuna trials by state. ``{"plans": [PLAN, ...]}`` runs
several such plans one after another (each its own database), from the one import.
"""

import json
import os
import signal
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# Only in the program itself: the surrogate's optimization worker, a spawned process, runs this file again as
# __mp_main__ and needs none of it (imported there, the tuner and torch cost every search a few CPU-seconds more)
if __name__ == "__main__":
    from sparse_mla_tuner.tuner import calibrate
    from sparse_mla_tuner.tuner import cli
    from sparse_mla_tuner.tuner import replay
    from sparse_mla_tuner.tuner import search  # noqa: F401 - imported before the fork, with everything a search imports
    from sparse_mla_tuner.tuner.protocol import CalibrateRequest
    from sparse_mla_tuner.tuner.recorder import StudyRecorder

    AFTER = {  # the write that follows each phase's measurement: the 'after' moment is when it returns
        "aa": (calibrate, "store_calibration"),
        "screen": (StudyRecorder, "trial"),
        "finalist": (StudyRecorder, "finalist"),
    }


def _arm(kill: dict, marker: str) -> None:
    """Patch the child so that it kills itself at ``kill``'s moment, after writing where to ``marker``."""
    seen = {"n": 0, "armed": False, "level": None}

    def die(level) -> None:
        with open(marker, "w") as f:
            json.dump({"phase": kill["phase"], "level": level, "where": kill["where"]}, f)
        os.kill(os.getpid(), signal.SIGKILL)

    def reached(phase: str, level) -> None:
        if phase != kill["phase"]:
            return
        seen["n"] += 1
        if seen["n"] == kill["k"]:
            if kill["where"] == "before":
                die(level)
            seen["armed"], seen["level"] = True, level

    measure = replay.ReplayProcess.measure

    def measure_hook(self, req, timeout_s):
        phase = "aa" if isinstance(req, CalibrateRequest) else "screen" if req.check else "finalist"
        reached(phase, req.batch)
        return measure(self, req, timeout_s)

    feasibility = replay.ReplaySource.feasibility

    def feasibility_hook(self, configs, wl, levels):
        reached("compile", None)
        out = feasibility(self, configs, wl, levels)
        if seen["armed"]:
            die(None)
        return out

    replay.ReplayProcess.measure = measure_hook
    replay.ReplaySource.feasibility = feasibility_hook
    if kill["phase"] in AFTER:
        owner, name = AFTER[kill["phase"]]
        write = getattr(owner, name)

        def after_hook(*args, **kwargs):
            out = write(*args, **kwargs)
            if seen["armed"]:
                die(seen["level"])
            return out

        setattr(owner, name, after_hook)


def _snapshot(url: str) -> tuple[list, dict]:
    """Every sample (study, config, phase, round, candidate, baseline) and the Optuna trials by state. The
    connection is closed before the next fork."""
    from sqlalchemy import create_engine
    from sqlalchemy import text
    from sqlalchemy.exc import SQLAlchemyError
    from sqlalchemy.pool import NullPool

    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as con:
            samples = con.execute(
                text(
                    "SELECT t.optuna_study, t.config_key, x.phase, x.round, x.candidate_us, x.baseline_us "
                    "FROM tuner_samples x JOIN tuner_trials t ON t.id = x.trial_id ORDER BY 1, 2, 3, 4"
                )
            ).all()
            states = dict(con.execute(text("SELECT state, COUNT(*) FROM trials GROUP BY state")).all())
        return [list(r) for r in samples], {str(k): v for k, v in states.items()}
    except SQLAlchemyError:  # killed before the tables were made
        return [], {}
    finally:
        engine.dispose()


def main() -> None:
    given = json.load(sys.stdin)
    for plan in given.get("plans", [given]):
        _run_plan(plan)


def _run_plan(plan: dict) -> None:
    marker = plan["marker"]
    for kill in plan["runs"]:
        if os.path.exists(marker):
            os.remove(marker)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:  # the child: one `tuner search`
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)  # its table would mix with this process's JSON lines
            if kill:
                _arm(kill, marker)
            sys.argv = ["tuner", *plan["argv"]]
            try:
                cli.main()
            except SystemExit as e:
                os._exit(e.code if isinstance(e.code, int) else 1)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        rc = os.waitstatus_to_exitcode(status)  # -N when killed by signal N
        where = json.load(open(marker)) if os.path.exists(marker) else None
        samples, states = _snapshot(plan["url"])
        print(json.dumps({"rc": rc, "killed": where, "samples": samples, "states": states}), flush=True)


if __name__ == "__main__":
    main()
