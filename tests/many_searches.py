"""Starts several ``tuner search`` on one database (tests/test_db.py, tests/test_workers.py, tests/test_verdicts.py).

Reads a JSON plan on stdin: ``{"argv": [...], "n": N}`` (N copies of one search, started together) or
``{"runs": [[...], [...]], "together": false}`` (different searches, each started when the one before it has
ended; ``"together": true`` starts them at once). Each search is ``tuner ARGV`` (the executable's own entry point,
:func:`tuner.cli.main`) in a child forked from this process once everything a search imports is imported, so the
imports are paid once. Prints one JSON line: per search, in order, ``{"rc": its exit status, "stderr": what it
wrote there, "stdout": what it wrote there}``. ARGV may be any tuner command, not only a search (tests/test_search.py
and tests/test_hardening.py run command lines of the executable this way, one process each after one import).
"""

import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main() -> None:
    # imported here, not when the surrogate's optimization worker (a spawned process) runs this file as __mp_main__
    from sparse_mla_tuner.tuner import cli

    plan = json.load(sys.stdin)
    runs = plan["runs"] if "runs" in plan else [plan["argv"]] * plan["n"]
    if any(argv[:1] == ["search"] for argv in runs):  # imported before the forks, with everything a search imports
        from sparse_mla_tuner.tuner import search  # noqa: F401
    together = plan.get("together", True)
    folder = tempfile.mkdtemp(prefix="many-searches-")
    sys.stdout.flush()
    sys.stderr.flush()
    pids, statuses = [], {}
    for i, argv in enumerate(runs):
        pid = os.fork()
        if pid == 0:  # the child: one `tuner search`
            try:
                out = os.open(os.path.join(folder, f"{i}.out"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(out, 1)  # its table would mix with this process's JSON line
                err = os.open(os.path.join(folder, f"{i}.err"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(err, 2)
                sys.argv = ["tuner", *argv]
                try:
                    cli.main()
                except SystemExit as e:
                    code = e.code if isinstance(e.code, int) else 1
                else:
                    code = 0
            except BaseException:  # a traceback goes to its stderr, as from an executable of its own
                import traceback

                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        pids.append(pid)
        if not together:  # the next one starts when this one has ended
            statuses[pid] = os.waitpid(pid, 0)[1]
    out = []
    for i, pid in enumerate(pids):
        status = statuses[pid] if pid in statuses else os.waitpid(pid, 0)[1]
        rc = os.waitstatus_to_exitcode(status)  # -N when killed by signal N
        with open(os.path.join(folder, f"{i}.err")) as err, open(os.path.join(folder, f"{i}.out")) as stdout:
            out.append({"rc": rc, "stderr": err.read(), "stdout": stdout.read()})
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
