"""Bad input of every kind gets one sentence on stderr and exit status 2, never a traceback; no
database password is ever shown; read-only commands never create or write a database."""

import os
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

from sparse_mla_tuner.tuner.cli import cli
from tests.test_space import GOOD

SMOKE = "search_spaces/smoke.yaml"


def _set(key, value):
    """GOOD with top-level ``key`` set to ``value``."""
    import yaml

    return yaml.safe_dump({**yaml.safe_load(GOOD), key: value})


def _sub(old, new):
    assert old in GOOD, old
    return GOOD.replace(old, new)


# (id, file content (str or bytes), a fragment the message must contain)
SPACES = [
    ("empty-file", "", "must be a YAML mapping"),
    ("only-comment", "# nothing\n", "must be a YAML mapping"),
    ("top-level-list", "- a\n- b\n", "must be a YAML mapping"),
    ("top-level-scalar", "42\n", "must be a YAML mapping"),
    ("binary", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe", "is not UTF-8 text"),
    ("latin-1", GOOD.replace("name: t", "name: caf\xe9").encode("latin-1"), "is not UTF-8 text"),
    ("nul-char", GOOD.replace("name: t", "name: t\x00"), "not valid YAML"),
    ("two-documents", GOOD + "---\n" + GOOD, "not valid YAML"),
    ("python-tag", GOOD.replace("name: t", "name: !!python/object:os.system x"), "not valid YAML"),
    ("deep-nesting", "a: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
    ("huge-file", "# " + "x" * 1_100_000 + "\n", "at most 1000000"),
    ("duplicate-top-key", GOOD + "name: u\n", "duplicate key `name` (first at line 1)"),
    ("duplicate-nested-key", _sub("num_warps: [4]", "num_warps: [4]\n  num_warps: [8]"), "duplicate key `num_warps`"),
    ("unhashable-key", "? [a, b]\n: 1\n", "a mapping key must be a plain value"),
    ("target-list", _sub("target: sm_120", "target: [sm_120]"), "`target`: must be one of"),
    ("target-null", _sub("target: sm_120", "target: null"), "`target`: must be one of"),
    ("target-int", _sub("target: sm_120", "target: 120"), "`target`: must be one of"),
    ("kv-format-list", _sub("kv_format: fp8_model1", "kv_format: [fp8_model1]"), "`workloads[0].kv_format`"),
    ("kv-format-map", _sub("kv_format: fp8_model1", "kv_format: {a: 1}"), "`workloads[0].kv_format`"),
    ("name-list", _sub("name: t\n", "name: [t]\n"), "`name`: must be letters"),
    ("name-long", _sub("name: t\n", "name: " + "t" * 5000 + "\n"), "`name`: must be letters"),
    ("name-date", _sub("name: t\n", "name: 2024-01-01\n"), "`name`: must be letters"),
    ("workload-name-list", _sub("{name: w,", "{name: [w],"), "`workloads[0].name`"),
    ("workload-name-newline", _sub("{name: w,", '{name: "a\\nb",'), "`workloads[0].name`"),
    ("workloads-null", _set("workloads", None), "`workloads`"),
    ("workloads-string", _set("workloads", "w"), "`workloads`"),
    ("workload-null", _sub("  - {name: w,", "  - null\n  - {name: w,"), "`workloads[0]`: must be a mapping"),
    ("heads-bool", _sub("heads: 64", "heads: true"), "`workloads[0].heads`: must be an integer"),
    ("heads-float", _sub("heads: 64", "heads: 64.0"), "`workloads[0].heads`: must be an integer"),
    ("heads-string", _sub("heads: 64", "heads: '64'"), "`workloads[0].heads`: must be an integer"),
    ("heads-null", _sub("heads: 64", "heads: null"), "`workloads[0].heads`: must be an integer"),
    ("topk-negative", _sub("topk: 64", "topk: -64"), "`workloads[0].topk`: must be an integer >= 1"),
    ("context-huge", _sub("context: 256", "context: 99999999999999999999999"), "`workloads[0].context`"),
    ("tp-zero", _sub("tp: 4", "tp: 0"), "`workloads[0].tp`"),
    ("concurrency-map", _sub("concurrency: [1, 4]", "concurrency: {a: 1}"), "`concurrency`"),
    ("concurrency-nested", _sub("concurrency: [1, 4]", "concurrency: [[1], 4]"), "`concurrency[0]`"),
    ("concurrency-float", _sub("concurrency: [1, 4]", "concurrency: [1, 4.5]"), "`concurrency[1]`"),
    ("concurrency-inf", _sub("concurrency: [1, 4]", "concurrency: [1, .inf]"), "`concurrency[1]`"),
    ("parameters-list", _set("parameters", []), "`parameters`: must be a mapping"),
    ("choices-nested", _sub("choices: [16, 32]", "choices: [[16], 32]"), "`parameters.BLOCK_T.choices[0]`"),
    ("choices-map", _sub("choices: [16, 32]", "choices: {16: 32}"), "`parameters.BLOCK_T.choices`"),
    ("choices-null", _sub("num_warps: [4]", "num_warps: [null]"), "`parameters.num_warps.choices[0]`"),
    ("choices-bool", _sub("num_warps: [4]", "num_warps: [true]"), "`parameters.num_warps.choices[0]`"),
    ("choices-huge", _sub("TARGET_CTAS: [4]", "TARGET_CTAS: [4, 10000000000000000000000]"), "choices[1]"),
    ("type-list", _sub("{type: categorical,", "{type: [categorical],"), "`parameters.BLOCK_T.type`"),
    ("int-range-huge", _sub("TARGET_CTAS: [4]", "TARGET_CTAS: {type: int, low: 1, high: 1000000000}"), "at most"),
    ("int-range-float", _sub("low: 1, high: 2", "low: 1.5, high: 2"), "`parameters.num_stages.low`"),
    ("int-step-zero", _sub("low: 1, high: 2", "low: 1, high: 2, step: 0"), "`parameters.num_stages.step`"),
    ("int-low-null", _sub("low: 1, high: 2", "low: null, high: 2"), "`parameters.num_stages.low`"),
    ("product-too-large", _sub("TARGET_CTAS: [4]", "TARGET_CTAS: {type: int, low: 1, high: 60000}"), "240000"),
    ("constraint-div-zero", _sub('"BLOCK_T * num_stages <= 32"', '"BLOCK_T / (num_stages - 1) < 99"'), "Zero"),
    ("constraint-mod-zero", _sub('"BLOCK_T * num_stages <= 32"', '"BLOCK_T % (num_warps - 4) < 9"'), "Zero"),
    ("constraint-overflow", _sub('"BLOCK_T * num_stages <= 32"', '"1e300 * 1e300 * BLOCK_T > 0"'), "constraint"),
    ("constraint-pow-var", _sub('"BLOCK_T * num_stages <= 32"', '"BLOCK_T ** TARGET_CTAS > 0"'), "`**` needs"),
    ("constraint-pow-big", _sub('"BLOCK_T * num_stages <= 32"', '"2 ** 99999999 > BLOCK_T"'), "`**` needs"),
    ("constraint-pow-nested", _sub('"BLOCK_T * num_stages <= 32"', '"(BLOCK_T ** 16) ** 16 > 0"'), "nested"),
    ("constraint-float-pow", _sub('"BLOCK_T * num_stages <= 32"', '"10.0 ** 16 ** 1 > 0"'), "`**` needs"),
    ("constraint-big-const", _sub('"BLOCK_T * num_stages <= 32"', '"BLOCK_T < 1' + "0" * 40 + '"'), "1e18"),
    ("constraint-long", _sub('"BLOCK_T * num_stages <= 32"', '"' + "BLOCK_T + " * 100 + '1 > 0"'), "at most 500"),
    ("constraint-parens", _sub('"BLOCK_T * num_stages <= 32"', '"' + "(" * 240 + "1" + ")" * 240 + '"'), "`constr"),
    ("constraint-call", _sub('"BLOCK_T * num_stages <= 32"', '"abs(BLOCK_T) > 0"'), "may use only"),
    ("constraint-attr", _sub('"BLOCK_T * num_stages <= 32"', '"BLOCK_T.real > 0"'), "may use only"),
    ("constraint-string", _sub('"BLOCK_T * num_stages <= 32"', "\"BLOCK_T > 'a'\""), "only numeric constants"),
    ("constraint-int", _sub('"BLOCK_T * num_stages <= 32"', "42"), "`constraints[0]`: must be an expression"),
    ("constraint-null-byte", _sub('"BLOCK_T * num_stages <= 32"', '"BLOCK_T\\0 > 1"'), "`constraints[0]`"),
    ("constraints-map", _sub('constraints: ["BLOCK_T * num_stages <= 32"]', "constraints: {a: 1}"), "`constraints`"),
    ("baseline-list", _set("baseline", [16, 4, 2, 4]), "`baseline`"),
    ("baseline-value-list", _sub("baseline: {BLOCK_T: 16,", "baseline: {BLOCK_T: [16],"), "`baseline.BLOCK_T`"),
    ("baseline-value-float", _sub("baseline: {BLOCK_T: 16,", "baseline: {BLOCK_T: 16.0,"), "`baseline.BLOCK_T`"),
    ("baseline-null", _sub("baseline: {BLOCK_T: 16,", "baseline: {BLOCK_T: null,"), "`baseline.BLOCK_T`"),
    ("baseline-unknown", _sub("baseline: {BLOCK_T: 16,", "baseline: {7: 1, BLOCK_T: 16,"), "`baseline.7`"),
    ("measurement-list", _set("measurement", [5]), "`measurement`"),
    ("rounds-string", _sub("rounds: 5", "rounds: five"), "`measurement.rounds`"),
    ("rounds-huge", _sub("rounds: 5", "rounds: 100000000"), "`measurement.rounds`"),
    ("timeout-float", _sub("trial_timeout_s: 60", "trial_timeout_s: 1e9"), "`measurement.trial_timeout_s`"),
    ("min-effect-negative", _sub("rounds: 5", "rounds: 5, min_effect: -0.1"), "`measurement.min_effect`"),
    ("min-effect-string", _sub("rounds: 5", "rounds: 5, min_effect: lots"), "`measurement.min_effect`"),
    ("sampler-name-list", _sub("name: grid", "name: [grid]"), "`sampler.name`"),
    ("sampler-seed-negative", _sub("seed: 0", "seed: -1"), "`sampler.seed`"),
    ("sampler-seed-float", _sub("seed: 0", "seed: 0.5"), "`sampler.seed`"),
    ("spill-bool", GOOD + "max_spill_bytes: false\n", "`max_spill_bytes`"),
    ("unknown-key-newline", GOOD + '"a\\nb": 1\n', "unknown key"),
    ("unknown-key-int", GOOD + "1: 1\n", "`1`: unknown key"),
]


def _one_sentence(result, fragment=None):
    """Exit 2, one stderr line that starts with `error:`, no traceback."""
    err = result.stderr
    assert result.exit_code == 2, (result.exit_code, err, result.exception)
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    if fragment:
        assert fragment in lines[0], lines[0]


@pytest.mark.parametrize("text, fragment", [c[1:] for c in SPACES], ids=[c[0] for c in SPACES])
def test_bad_space_is_one_sentence(tmp_path, text, fragment):
    path = tmp_path / "space.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    result = CliRunner().invoke(cli, ["check", str(path), "--db", f"sqlite:///{tmp_path / 'x.db'}"])
    _one_sentence(result, fragment)
    assert str(path) in result.stderr
    assert not (tmp_path / "x.db").exists()  # rejected before anything is opened


@pytest.mark.parametrize(
    "first, fragment",
    [
        ("T16-w4", "--first: config 'T16-w4' is not of the form"),
        ("T16-w4-s2-c4,T64-w4-s1-c4", "--first: T64-w4-s1-c4 is not a config of search_spaces/smoke.yaml"),
    ],
    ids=["not-a-key", "not-in-space"],
)
def test_bad_first_config_is_one_sentence(tmp_path, first, fragment):
    result = CliRunner().invoke(cli, ["search", SMOKE, "--first", first, "--db", f"sqlite:///{tmp_path / 'x.db'}"])
    _one_sentence(result, fragment)
    assert not (tmp_path / "x.db").exists()  # rejected before anything is opened or measured


def test_unreadable_space_is_one_sentence(tmp_path):
    _one_sentence(CliRunner().invoke(cli, ["check", str(tmp_path / "nope.yaml")]), "cannot read the search space")


class _Proc:
    def __init__(self, proc):
        self.exit_code, self.stdout, self.stderr, self.exception = proc.returncode, proc.stdout, proc.stderr, None


USAGE_ERRORS = {
    "space-is-dir": (["check", "{tmp}"], "is a directory"),
    "bad-int": (["best", "--concurrency", "x"], "'x' is not a valid integer"),
    "bad-choice": (["trials", "--verdict", "great"], "'great' is not one of"),
    "bad-command": (["nosuch"], "No such command 'nosuch'"),
}
BIG = "9" * 20  # past SQLite's signed 64-bit INTEGER
OUT_OF_RANGE = {
    "cmd0": ["best", "--concurrency", BIG],
    "cmd1": ["show", BIG],
    "cmd2": ["search", SMOKE, "--timeout", "nan"],
}


@pytest.fixture(scope="module")
def from_the_executable(tmp_path_factory):
    """The command lines of the two tests below, each run as the executable runs it (its entry point,
    tuner.cli.main, in a process of its own: conftest.py's tuner_processes, one import for them all), by name."""
    from tests.conftest import tuner_processes

    tmp = tmp_path_factory.mktemp("usage")
    runs = {name: [a.format(tmp=tmp) for a in args] for name, (args, _) in USAGE_ERRORS.items()}
    runs |= OUT_OF_RANGE
    return dict(zip(runs, tuner_processes(runs.values()), strict=True))


@pytest.mark.parametrize("name", USAGE_ERRORS)
def test_usage_errors_of_the_executable_are_one_line(from_the_executable, name):
    _one_sentence(_Proc(from_the_executable[name]), USAGE_ERRORS[name][1])


def test_int_range_is_counted_not_built():
    """A billion-value range is refused from its size; building the list would take minutes and GBs."""
    import time

    from sparse_mla_tuner.tuner.errors import SpaceError
    from sparse_mla_tuner.tuner.space import load_space
    from tests.test_space import _write

    path = _write(_sub("TARGET_CTAS: [4]", "TARGET_CTAS: {type: int, low: 1, high: 1000000000}"))
    t0 = time.monotonic()
    with pytest.raises(SpaceError, match="span 4000000000 configs"):
        load_space(path)
    assert time.monotonic() - t0 < 5


PASSWORDS = ("SECRET", "hunter2", "pa55word")
URLS = [
    "postgresql+psycopg://u:SECRET@127.0.0.1:1/db",  # refused connection
    "mysql://bob:hunter2@x/db",  # unsupported scheme
    "postgresql+asyncpg://u:SECRET@127.0.0.1:1/db",  # driver not installed
    "postgresql+nodriver://u:SECRET@127.0.0.1:1/db",  # no such dialect
    "postgresql://u@127.0.0.1:1/db?password=pa55word",  # password as a query argument
    "garbage u:SECRET@x",  # not a URL at all
]
COMMANDS = [
    ["check", SMOKE],
    ["search", SMOKE, "--backend", "interpreter", "-q"],
    ["best", "--concurrency", "1"],
    ["trials"],
    ["show", "1"],
    ["compare", "T16-w4-s2-c4", "T32-w4-s1-c4"],
    ["studies"],
    ["report"],
    ["export"],
    ["db", "upgrade"],
]


@pytest.mark.parametrize("url", URLS, ids=["pg-refused", "mysql", "asyncpg", "no-dialect", "query", "garbage"])
@pytest.mark.parametrize("via", ["--db", "TUNER_DB"])
def test_no_command_shows_a_password(url, via):
    runner = CliRunner()
    for args in COMMANDS:
        if via == "--db":
            result = runner.invoke(cli, [*args, "--db", url])
        else:
            result = runner.invoke(cli, args, env={"TUNER_DB": url})
        _one_sentence(result)
        for secret in PASSWORDS:
            assert secret not in result.stdout + result.stderr, (args, result.stderr)


@pytest.mark.parametrize(
    "url, fragment",
    [
        ("postgresql+asyncpg://u:SECRET@h/db", "pip install 'asyncpg'"),
        ("postgresql+psycopg2://u:SECRET@h/db", "pip install 'psycopg2-binary'"),
        ("postgresql+nodriver://u:SECRET@h/db", "no dialect or driver 'postgresql+nodriver'"),
    ],
)
def test_missing_driver_names_the_package(url, fragment):
    _one_sentence(CliRunner().invoke(cli, ["trials", "--db", url]), fragment)


def test_redact_url():
    from sparse_mla_tuner.db.store import redact_url

    assert redact_url("postgresql+psycopg://u:SECRET@h:5/db") == "postgresql+psycopg://u:***@h:5/db"
    assert redact_url("postgresql://u:p@ss@h/db") == "postgresql://u:***@h/db"
    assert redact_url("postgresql://u@h/db?sslmode=x&password=SECRET") == "postgresql://u@h/db?sslmode=x&password=***"
    assert redact_url("no url u:SECRET@x") == "no url u:***@x"
    assert redact_url("sqlite:////tmp/a.db") == "sqlite:////tmp/a.db"


@pytest.mark.parametrize("cmd", [c for c in COMMANDS if c[0] not in ("check", "search")], ids=lambda c: c[0])
def test_read_only_commands_never_create_a_database(tmp_path, cmd):
    path = tmp_path / "none.db"
    result = CliRunner().invoke(cli, [*cmd, "--db", f"sqlite:///{path}"])
    _one_sentence(result, f"no database at {path}; run `tuner search` first")
    assert not path.exists()


def test_write_failures_are_one_sentence(tmp_path):
    """`report -o`, `report --plots` and `export --out` into places that cannot be written."""
    from sparse_mla_tuner.db.store import Store

    url = f"sqlite:///{tmp_path / 'r.db'}"
    Store(url)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for args in (
        ["report", "-o", str(tmp_path / "no" / "dir" / "R.md")],
        ["export", "--out", str(blocker / "sub")],
        ["export", "--format", "triton", "--out", str(tmp_path / "no" / "t.py")],
    ):
        result = CliRunner().invoke(cli, [*args, "--db", url])
        _one_sentence(result)  # an empty database: "nothing to ..." or "cannot write ..."


def _ro_runs(directory, runs):
    """Run the CLI where ``directory`` is read-only, also as root: a read-only bind mount in a private
    mount namespace (root ignores permission bits), else permission bits for other users. Each ``tuner ARGS``
    of ``runs`` is a process of its own, one after another, forked from one that imported the tuner once
    (conftest.py's tuner_processes, started under the mount)."""
    from tests.conftest import tuner_processes

    prefix = []
    if os.geteuid() == 0:
        if not shutil.which("unshare"):
            pytest.skip("needs unshare(1) to make a read-only mount as root")
        script = 'mount --bind -o ro "$0" "$0" && exec "$@"'
        prefix = ["unshare", "-m", "sh", "-c", script, str(directory)]
    return tuner_processes(runs, prefix=prefix, timeout=300)


def _ro_run(directory, args):
    """One ``tuner ARGS`` where ``directory`` is read-only (as :func:`_ro_runs`)."""
    return _ro_runs(directory, [args])[0]


def test_database_on_a_read_only_directory_is_readable(tmp_path):
    from sparse_mla_tuner.db.store import Store

    ro = tmp_path / "ro"
    ro.mkdir()
    url = f"sqlite:///{ro / 'tuner.db'}"
    Store(url).engine.dispose()  # a WAL database whose -wal and -shm files are gone: they cannot be made here
    assert sorted(p.name for p in ro.iterdir()) == ["tuner.db"]
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True) if os.geteuid() == 0 else None
    if probe is not None and probe.returncode != 0:
        pytest.skip("cannot make a private mount namespace here")
    if os.geteuid() != 0:
        ro.chmod(0o555)
    try:
        runs = [["studies"], ["trials", "-f", "json"], ["check", SMOKE], ["studies"]]
        urls = [url, url, url, f"sqlite:///{ro / 'other.db'}"]
        *reads, check, other = _ro_runs(ro, [[*cmd, "--db", u] for cmd, u in zip(runs, urls, strict=True)])
        for proc in reads:
            assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        assert check.returncode == 2 and len(check.stderr.strip().splitlines()) == 1, check.stderr  # a writer
        assert "is read-only" in check.stderr
        assert other.returncode == 2 and "no database at" in other.stderr
    finally:
        ro.chmod(0o755)
    assert sorted(p.name for p in ro.iterdir()) == ["tuner.db"]


# --- configs outside the declaration's bounds, wherever they enter (kernels/config.py PARAMS) -----------------

BOUNDS = [
    ("block-t-4096", _sub("choices: [16, 32]", "choices: [16, 4096]"), "BLOCK_T must be a power of two >= 16, at most"),
    ("block-t-2**40", _sub("choices: [16, 32]", "choices: [16, 1099511627776]"), "BLOCK_T"),
    ("ctas-2**40", _sub("TARGET_CTAS: [4]", "TARGET_CTAS: [4, 1099511627776]"), "TARGET_CTAS"),
    ("warps-64", _sub("num_warps: [4]", "num_warps: [4, 64]"), "num_warps must be a power of two in 1..32"),
    ("baseline-2**40", _sub("baseline: {BLOCK_T: 16,", "baseline: {BLOCK_T: 1099511627776,"), "`baseline.BLOCK_T`"),
]


@pytest.mark.parametrize("text, fragment", [c[1:] for c in BOUNDS], ids=[c[0] for c in BOUNDS])
def test_a_space_outside_the_bounds_is_one_sentence(tmp_path, text, fragment):
    path = tmp_path / "space.yaml"
    path.write_text(text)
    result = CliRunner().invoke(cli, ["check", str(path), "--db", f"sqlite:///{tmp_path / 'x.db'}"])
    _one_sentence(result, fragment)
    assert not (tmp_path / "x.db").exists()


@pytest.mark.parametrize(
    "first, fragment",
    [
        ("T4096-w4-s1-c4", "BLOCK_T must be a power of two >= 16, at most 2048, got 4096"),
        ("T1099511627776-w4-s1-c4", "BLOCK_T must be a power of two >= 16, at most 2048"),
        ("T16-w4-s1-c" + "9" * 40, "TARGET_CTAS must be"),
        ("T16-w4-s1-c4-r999", "maxnreg must be 0 (no cap) or an integer in 16..255"),
        ("T16-w4-s1-c4-p" + "1" * 100_000, "is not a config key of the form"),
    ],
    ids=["block-t-4096", "block-t-2**40", "ctas-40-digits", "maxnreg-999", "100000-digits"],
)
def test_a_first_config_outside_the_bounds_is_one_short_sentence(tmp_path, first, fragment):
    result = CliRunner().invoke(cli, ["search", SMOKE, "--first", first, "--db", f"sqlite:///{tmp_path / 'x.db'}"])
    _one_sentence(result, fragment)
    assert len(result.stderr) < 600  # the input is quoted cut, never whole
    assert not (tmp_path / "x.db").exists()


def test_a_stored_config_outside_the_bounds_is_never_exported(tmp_path):
    """A results database from elsewhere with BLOCK_T 2**40 in an ok trial: export leaves that row out."""
    import json
    import sqlite3

    from sparse_mla_tuner.db.store import Store
    from tests.recorded import make_results

    path = make_results(tmp_path / "bounds.db")  # three workloads' results, two levels each
    Store(f"sqlite:///{path}", upgrade=True).engine.dispose()
    con = sqlite3.connect(path)
    con.execute("UPDATE tuner_trials SET BLOCK_T = ? WHERE verdict = 'ok' AND workload_id = 1", (2**40,))
    con.execute("UPDATE tuner_trials SET TARGET_CTAS = ? WHERE workload_id = 2 AND concurrency = 1", (-3,))
    con.commit()
    con.close()
    result = CliRunner().invoke(cli, ["export", "--out", str(tmp_path / "t"), "--db", f"sqlite:///{path}"])
    assert result.exit_code == 0 and "Traceback" not in result.stderr, result.stderr
    tables = [f for f in (tmp_path / "t").glob("*.json") if not f.name.endswith(".provenance.json")]
    assert len(tables) == 2  # workload 1's table is gone (every ok trial out of bounds), the others stay
    for f in tables:
        entries = json.loads(f.read_text())
        assert all(16 <= e["BLOCK_T"] <= 2048 and e["TARGET_CTAS"] > 0 for e in entries.values()), f.name


def test_decode_with_a_table_outside_the_bounds_or_a_fifo_falls_back(tmp_path, monkeypatch):
    """sparse_mla_decode(config=None) over a table with BLOCK_T 2**40, or a FIFO where the table should be:
    one TableWarning each, the default config, and the call returns (in a subprocess, with a time limit)."""
    import json

    import sparse_mla_tuner.kernels.table as kt

    name = kt.table_name("cpu-interpreter", "fp8_v32", 16, 32)
    bad, fifo = tmp_path / "bad", tmp_path / "fifo"
    bad.mkdir(), fifo.mkdir()
    entry = {"BLOCK_T": 2**40, "num_warps": 4, "num_stages": 1, "TARGET_CTAS": 4}
    (bad / name).write_text(json.dumps({"1": entry}))
    os.mkfifo(fifo / name)
    script = (  # the call with each folder in turn, in one process (the table's folder is read at each call)
        "import os, sys, warnings, torch\n"
        "from sparse_mla_tuner.kernels import Workload, make_batch, sparse_mla_decode\n"
        "bt = make_batch(Workload('fp8_v32', 16, 32, page_size=64, context=64), 1, device='cpu', seed=1)\n"
        "for folder in sys.argv[1:]:\n"
        "    os.environ['SPARSE_MLA_CONFIG_DIR'] = folder\n"
        "    with warnings.catch_warnings(record=True) as w:\n"
        "        warnings.simplefilter('always')\n"
        "        out, lse = sparse_mla_decode(*bt.args(), kv_format='fp8_v32')\n"
        "    assert torch.isfinite(out.float()).all()\n"
        "    print(sum(x.category.__name__ == 'TableWarning' for x in w), flush=True)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": root}
    cmd = [sys.executable, "-c", script, str(bad), str(fifo)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout.split() == ["1", "1"], proc.stdout  # one warning per folder


# --- numbers and strings at the command line -------------------------------------------------------


class _Exit:
    def __init__(self, code, out, err):
        self.exit_code, self.stdout, self.stderr, self.exception = code, out, err, None


def _main(args, capsys, monkeypatch):
    """``tuner ARGS`` in this process, through the executable's own entry point."""
    from sparse_mla_tuner.tuner.cli import main

    monkeypatch.setattr(sys, "argv", ["tuner", *args])
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main()
    out, err = capsys.readouterr()
    return _Exit(e.value.code, out, err)


HUGE = "x" * 100_000
LONG_NAME = "a" * 300  # one path component past NAME_MAX (Errno 36)


def _db_cases():
    """(id, args, fragment): every numeric option out of what the database stores or of its range."""
    return [
        ("best-concurrency-20-digits", ["best", "--concurrency", BIG], "is not in the range 1<=x<="),
        ("best-concurrency-zero", ["best", "--concurrency", "0"], "is not in the range"),
        ("best-concurrency-negative", ["best", "--concurrency", "-5"], "is not in the range"),
        ("best-concurrency-float", ["best", "--concurrency", "1.5"], "is not a valid integer"),
        ("best-concurrency-huge", ["best", "--concurrency", "9" * 100_000], "is not a valid integer"),
        ("trials-concurrency-20-digits", ["trials", "--concurrency", BIG], "is not in the range"),
        ("show-20-digits", ["show", BIG], "is not in the range"),
        ("show-negative", ["show", "--", "-1"], "is not in the range"),
        ("show-not-a-number", ["show", "one"], "is not a valid integer"),
        ("search-n-trials-20-digits", ["search", SMOKE, "--n-trials", BIG], "is not in the range"),
        ("search-workers-20-digits", ["search", SMOKE, "--workers", BIG], "is not in the range"),
        ("search-workers-zero", ["search", SMOKE, "--workers", "0"], "is not in the range"),
        ("search-concurrency-20-digits", ["search", SMOKE, "--concurrency", f"1,{BIG}"], "--concurrency must be"),
        ("search-concurrency-text", ["search", SMOKE, "--concurrency", "1,x"], "--concurrency must be"),
        ("search-concurrency-zero", ["search", SMOKE, "--concurrency", "0"], "--concurrency must be"),
        ("calibrate-pairs-20-digits", ["calibrate", SMOKE, "--pairs", BIG], "is not in the range"),
        ("calibrate-concurrency-20-digits", ["calibrate", SMOKE, "--concurrency", BIG], "--concurrency must be"),
        ("timeout-nan", ["search", SMOKE, "--timeout", "nan"], "is not a finite number of seconds > 0"),
        ("timeout-inf", ["search", SMOKE, "--timeout", "inf"], "is not a finite number of seconds > 0"),
        ("timeout-minus-inf", ["search", SMOKE, "--timeout", "-inf"], "is not a finite number of seconds > 0"),
        ("timeout-zero", ["search", SMOKE, "--timeout", "0"], "is not a finite number of seconds > 0"),
        ("timeout-negative", ["search", SMOKE, "--timeout", "-3"], "is not a finite number of seconds > 0"),
        ("timeout-text", ["search", SMOKE, "--timeout", "soon"], "is not a number of seconds"),
        ("timeout-1e400", ["search", SMOKE, "--timeout", "1e400"], "is not a finite number of seconds > 0"),
        ("workers-past-the-cores", ["search", SMOKE, "--backend", "interpreter", "--workers", "100000"], "cores"),
        ("first-100k", ["search", SMOKE, "--first", HUGE], "--first: 'xxxx"),
        ("first-100k-in-a-list", ["search", SMOKE, "--first", "T16-w4-s2-c4," + HUGE], "--first: 'xxxx"),
        ("first-100k-key-like", ["search", SMOKE, "--first", "T16-" + "w" * 100_000], "--first: 'T16-www"),
        ("choice-100k", ["trials", "--verdict", HUGE], "is not one of"),
        ("compare-100k", ["compare", HUGE, "T16-w4-s2-c4"], "is not of the form"),
        ("space-100k", ["best", "--concurrency", "1", "--space", HUGE], ""),
    ]


@pytest.mark.parametrize("args, fragment", [c[1:] for c in _db_cases()], ids=[c[0] for c in _db_cases()])
def test_bad_numbers_and_long_strings_are_one_short_sentence(tmp_path, args, fragment, capsys, monkeypatch):
    """Out-of-range numbers never reach the database (OverflowError) and no message echoes a long input whole.
    Run through ``tuner.cli.main``, the executable's entry point (usage errors are one line there)."""
    from sparse_mla_tuner.db.store import Store

    url = f"sqlite:///{tmp_path / 'x.db'}"
    Store(url).engine.dispose()  # an empty database: the query commands get as far as they can
    result = _main([*args, "--db", url], capsys, monkeypatch)
    _one_sentence(result, fragment)
    assert len(result.stderr) < 700, result.stderr[:300]


@pytest.mark.parametrize("args", [c for c in COMMANDS], ids=lambda c: c[0] + ("-" + c[1] if c[0] == "db" else ""))
def test_an_overlong_database_file_name_is_one_sentence_in_every_command(tmp_path, args):
    url = f"sqlite:///{tmp_path / (LONG_NAME + '.db')}"
    result = CliRunner().invoke(cli, [*args, "--db", url])
    _one_sentence(result, "File name too long")
    assert len(result.stderr) < 700


@pytest.mark.parametrize("name", OUT_OF_RANGE)
def test_out_of_range_numbers_from_the_executable_are_one_line(from_the_executable, name):
    _one_sentence(_Proc(from_the_executable[name]))


def test_workers_within_the_cores_pass_the_check():
    from sparse_mla_tuner.tuner.cli import _check_workers
    from sparse_mla_tuner.tuner.errors import TunerError

    cores = os.cpu_count()
    _check_workers(None, "interpreter")
    _check_workers(cores, "interpreter")
    with pytest.raises(TunerError, match=f"more than the {cores} cores"):
        _check_workers(cores + 1, "interpreter")
    _check_workers(cores + 7, "replay")  # simulated GPUs: threads that run one at a time, not one per core
    with pytest.raises(TunerError, match="simulates 1..64 GPUs"):
        _check_workers(65, "replay")


def test_a_fine_timeout_and_concurrency_are_accepted():
    from sparse_mla_tuner.tuner.cli import Seconds
    from sparse_mla_tuner.tuner.cli import _levels

    assert Seconds().convert("0.5", None, None) == 0.5 and Seconds().convert("3600", None, None) == 3600.0
    assert _levels("1, 96") == [1, 96] and _levels(str(2**63 - 1)) == [2**63 - 1]


# --- YAML aliases: a bounded prefix of any value, a bounded expansion -------------------------------


def _bomb(levels: int = 9) -> str:
    """A "billion laughs" of under 1 kB: each anchor a list of nine aliases of the one before (9**levels values)."""
    lines = ['  l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"  l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines)


@pytest.mark.parametrize("where", ["sampler.name", "measurement.screen_rounds"])
def test_a_yaml_alias_bomb_is_one_sentence_at_once(tmp_path, where):
    top, key = where.split(".")
    text = "x-anchors:\n" + _bomb() + "\n" + GOOD
    if top == "sampler":
        text = text.replace("sampler: {name: grid, seed: 0}", "sampler: {name: *l8, seed: 0}")
    else:
        text = text.replace("rounds: 5,", "rounds: 5, screen_rounds: *l8,")
    assert len(text.encode()) < len(GOOD) + 1024
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    # in a subprocess with an address-space limit far below what rendering the value would take
    script = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
        "from sparse_mla_tuner.tuner.space import load_space\n"
        "from sparse_mla_tuner.tuner.errors import SpaceError\n"
        "try:\n"
        "    load_space(sys.argv[1])\n"
        "except SpaceError as e:\n"
        "    print(e)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(
        [sys.executable, "-c", script, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": root},
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    msg = proc.stdout.strip()
    assert len(msg.splitlines()) == 1 and len(msg) < 400, msg
    assert "expands to more than" in msg and "aliases" in msg


def test_a_small_alias_is_still_allowed_and_messages_show_a_bounded_prefix(tmp_path):
    from sparse_mla_tuner.tuner.space import _show
    from sparse_mla_tuner.tuner.space import load_space

    path = tmp_path / "alias.yaml"
    path.write_text(GOOD.replace("num_warps: [4]", "num_warps: &w [4]").replace("num_warps: 4,", "num_warps: 4,"))
    assert load_space(str(path)).parameters["num_warps"] == [4]
    shared = ["x" * 1000]
    for _ in range(40):  # 2**40 strings when written out
        shared = [shared, shared]
    shown = _show(shared)
    assert len(shown) <= 60 and shown.startswith("[[")
    assert len(_show("y" * 10**7, 80)) <= 80


def test_a_level_beyond_what_a_table_holds_is_one_sentence(tmp_path):
    from sparse_mla_tuner.kernels.table import MAX_BATCH

    path = tmp_path / "big.yaml"
    path.write_text(GOOD.replace("concurrency: [1, 4]", f"concurrency: [1, {2**31 - 1}]"))
    result = CliRunner().invoke(cli, ["check", str(path), "--db", f"sqlite:///{tmp_path / 'x.db'}"])
    _one_sentence(result, f"<= {MAX_BATCH}")


# --- priors of an older kernel ----------------------------------------------------------------------


def test_an_older_kernels_record_with_an_unknown_parameter_is_no_prior(tmp_path):
    """A record of another kernel whose config names a parameter this version does not know is skipped as a
    prior; the search of the current kernel runs (no ValueError traceback)."""
    import sqlite3

    from sparse_mla_tuner.kernels.config import kernel_source_hash
    from tests.conftest import tuner_in_process
    from tests.recorded import SMALL_SPACE
    from tests.recorded import make_recorded

    recorded, space, db = make_recorded(tmp_path / "recorded.db"), tmp_path / "small.yaml", tmp_path / "r.db"
    space.write_text(SMALL_SPACE)
    cmd = ["search", str(space), "-q", "--backend", "replay", "--concurrency", "1"]
    cmd += ["--replay-db", f"sqlite:///{recorded}", "--db", f"sqlite:///{db}"]
    first = tuner_in_process(*cmd)  # the entry point in this process: one import for both searches
    assert first.returncode == 0, first.stderr
    old, current = "0ld0ld0ld0ld", kernel_source_hash()
    con = sqlite3.connect(db)
    with con:  # what was measured becomes an older kernel's, one of its best configs with an unknown parameter
        con.execute("UPDATE tuner_kernels SET source_hash = ?", (old,))
        con.execute("UPDATE tuner_studies SET name = replace(name, ?, ?)", (current, old))
        (best,) = con.execute(
            "SELECT t.id FROM tuner_trials t JOIN tuner_statistics s ON s.trial_id = t.id "
            "WHERE t.verdict = 'ok' ORDER BY s.ratio LIMIT 1"
        ).fetchone()
        con.execute("UPDATE tuner_trials SET config_key = config_key || '-x1' WHERE id = ?", (best,))
    con.close()
    again = tuner_in_process(*cmd)
    assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr
    con = sqlite3.connect(db)
    kernels = con.execute("SELECT COUNT(DISTINCT kernel_id) FROM tuner_trials").fetchone()
    assert kernels == (2,)  # the current kernel measured the level


# --- FIFOs, directories and links: one safe opener for every path ------------------------------------


@pytest.fixture(scope="module")
def h200_copy(tmp_path_factory):
    """A copy of the committed H200 results at the current schema (the original is never written)."""
    from sparse_mla_tuner.db.store import Store

    path = tmp_path_factory.mktemp("h200") / "h200.db"
    shutil.copy(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results", "h200.db"), path)
    Store(f"sqlite:///{path}", upgrade=True)
    return f"sqlite:///{path}"


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Results to export and report (tests/recorded.py's make_results: three workloads, two levels each): what is
    tested below is where and how the files are written, which does not depend on how much was measured."""
    from sparse_mla_tuner.db.store import Store
    from tests.recorded import make_results

    path = make_results(tmp_path_factory.mktemp("results") / "results.db")
    Store(f"sqlite:///{path}", upgrade=True).engine.dispose()
    return f"sqlite:///{path}"


def _run_main(args):
    """``tuner ARGS`` as the executable runs it (tuner.cli.main: usage errors too are one line), in this process."""
    from sparse_mla_tuner.tuner.cli import main

    runner = CliRunner()
    old_argv = sys.argv
    sys.argv = ["tuner", *args]
    try:
        with runner.isolation() as streams:
            try:
                main()
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            out, err = streams[0].getvalue().decode(), streams[1].getvalue().decode()
    finally:
        sys.argv = old_argv

    class Result:
        exit_code, stdout, stderr, exception = code, out, err, None

    return Result()


def _tuner(*args, cwd=None, timeout=120):
    """The command line in this process, with a time limit (SIGALRM): a hang fails the test instead of stalling it."""
    import signal

    class Hung(Exception):
        pass

    def _alarm(signum, frame):
        raise Hung

    old_cwd, old_env = os.getcwd(), os.environ.pop("SPARSE_MLA_CONFIG_DIR", None)
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout)
    try:
        if cwd is not None:
            os.chdir(cwd)
        result = _run_main(list(args))
    except Hung:
        pytest.fail(f"`tuner {' '.join(args)}` hung")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        os.chdir(old_cwd)
        if old_env is not None:
            os.environ["SPARSE_MLA_CONFIG_DIR"] = old_env
    if isinstance(result.exception, Hung):
        pytest.fail(f"`tuner {' '.join(args)}` hung")
    return result


@pytest.mark.parametrize("what", ["fifo", "directory"])
@pytest.mark.parametrize(
    "cmd",
    [["db", "upgrade"], ["best", "--concurrency", "1"], ["trials"], ["export"], ["report"]],
    ids=lambda c: "-".join(c[:2]),
)
def test_a_database_that_is_a_fifo_or_a_directory_is_one_sentence(tmp_path, cmd, what):
    path = tmp_path / "x.db"
    os.mkfifo(path) if what == "fifo" else path.mkdir()
    result = _tuner(*cmd, "--db", f"sqlite:///{path}", cwd=tmp_path)
    _one_sentence(result, "FIFO" if what == "fifo" else "directory")
    assert "disk I/O error" not in result.stderr


@pytest.mark.parametrize(
    "url, fragment",
    [
        ("sqlite:///{tmp}/fifo.db", "is a FIFO"),
        ("sqlite:///{tmp}", "is a directory"),
        ("sqlite:///{tmp}/none.db", "no database at"),
        ("postgresql://host:99999/db", "port"),
        ("postgresql://host:port/db", "is not a database URL"),
        ("mysql://host/db", "unsupported database URL scheme"),
        ("sqlite+aiosqlite:///{tmp}/x.db", "aiosqlite"),  # refused as async, or named as a package to install
        ("postgresql+asyncpg://host/db", "asyncpg"),
    ],
    ids=["fifo", "directory", "missing", "bad-port", "port-word", "mysql", "aiosqlite", "asyncpg"],
)
@pytest.mark.parametrize("option", ["--db", "--replay-db"])
def test_db_and_replay_db_share_one_url_check(tmp_path, url, fragment, option, results):
    os.mkfifo(tmp_path / "fifo.db")
    url = url.format(tmp=tmp_path)
    if option == "--db" and "none.db" in url:
        pytest.skip("a search creates its --db")
    out = f"sqlite:///{tmp_path / 'out.db'}"
    args = ["search", os.path.abspath(SMOKE), "--backend", "replay", "-q"]
    args += ["--db", url, "--replay-db", results] if option == "--db" else ["--db", out, "--replay-db", url]
    result = _tuner(*args, cwd=tmp_path)
    _one_sentence(result, fragment)
    assert not (tmp_path / "out.db").exists()  # nothing is created


def test_export_refuses_a_fifo_or_a_link_at_a_tables_name_and_writes_nothing_outside(tmp_path, results):
    import json

    out = tmp_path / "out"
    first = _tuner("export", "--db", results, "--out", str(out), cwd=tmp_path)
    assert first.exit_code == 0, first.stderr
    tables = sorted(p for p in out.iterdir() if not p.name.endswith(".provenance.json"))
    assert tables
    again = _tuner("export", "--db", results, "--out", str(out), cwd=tmp_path)  # replaced whole, at once
    assert again.exit_code == 0, again.stderr
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary file left
    assert all(json.loads(p.read_text()) for p in out.iterdir())  # whole files only
    # a link planted at a table's name, pointing outside --out: refused, the file outside untouched
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me")
    tables[0].unlink()
    tables[0].symlink_to(outside)
    result = _tuner("export", "--db", results, "--out", str(out), cwd=tmp_path)
    _one_sentence(result, "symbolic link")
    assert outside.read_text() == "keep me" and tables[0].is_symlink()
    # a FIFO there: refused at once, never opened
    tables[0].unlink()
    os.mkfifo(tables[0])
    _one_sentence(_tuner("export", "--db", results, "--out", str(out), cwd=tmp_path), "FIFO")
    # an SGLang version folder that is a link out of --out
    sg = tmp_path / "sg"
    sg.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    first_sg = _tuner("export", "--db", results, "--out", str(tmp_path / "probe"), "--format", "sglang")
    assert first_sg.exit_code == 0, first_sg.stderr
    for sub in (tmp_path / "probe").iterdir():
        (sg / sub.name).symlink_to(elsewhere, target_is_directory=True)
    _one_sentence(_tuner("export", "--db", results, "--out", str(sg), "--format", "sglang"), "leads outside")
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("what", ["fifo", "directory", "link"])
@pytest.mark.parametrize("cmd", [["export", "--format", "triton", "--out"], ["report", "-o"]], ids=["triton", "report"])
def test_a_single_output_file_that_is_a_fifo_directory_or_link_is_one_sentence(tmp_path, results, cmd, what):
    target = tmp_path / "target.out"
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    if what == "fifo":
        os.mkfifo(target)
    elif what == "directory":
        target.mkdir()
    else:
        target.symlink_to(outside)
    result = _tuner(*cmd, str(target), "--db", results, cwd=tmp_path)
    _one_sentence(result, {"fifo": "FIFO", "directory": "directory", "link": "symbolic link"}[what])
    assert outside.read_text() == "keep me"


def test_export_without_out_never_writes_into_the_package(tmp_path, results):
    import sparse_mla_tuner.kernels.table as kt

    before = sorted(p.name for p in kt.CONFIG_DIR.iterdir())
    stamps = {p.name: p.stat().st_mtime_ns for p in kt.CONFIG_DIR.iterdir()}
    result = _tuner("export", "--db", results, cwd=tmp_path)
    assert result.exit_code == 0, result.stderr
    written = [line for line in result.stdout.splitlines() if line.strip()]
    assert written and all(os.path.abspath(os.path.join(tmp_path, w)).startswith(str(tmp_path)) for w in written)
    assert (tmp_path / "tuned_configs").is_dir()
    assert sorted(p.name for p in kt.CONFIG_DIR.iterdir()) == before
    assert {p.name: p.stat().st_mtime_ns for p in kt.CONFIG_DIR.iterdir()} == stamps


# --- SIGTERM is Ctrl-C -------------------------------------------------------------------------------


def test_sigterm_asks_the_search_to_stop_as_ctrl_c_does():
    import signal

    from sparse_mla_tuner.tuner.search import Stop

    before = signal.getsignal(signal.SIGTERM)
    with Stop() as stop:
        os.kill(os.getpid(), signal.SIGTERM)  # handled at once, in this thread: the test process lives on
        assert stop.requested and stop.signalled and stop.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before


def test_sigterm_stops_a_search_after_the_running_trial(tmp_path, h200_copy):
    """`kill PID` of a running search: it finishes the trial it is measuring, records it, leaves no Optuna trial
    RUNNING and exits 143 (128 + SIGTERM), as Ctrl-C gives 130."""
    import signal
    import sqlite3
    import time

    db = tmp_path / "t.db"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = [
        sys.executable,
        "-m",
        "sparse_mla_tuner.tuner",
        "search",
        "search_spaces/v4_flash_tp4.yaml",
        "-q",
        "--backend",
        "replay",
    ]
    cmd += ["--replay-db", h200_copy, "--replay-queue", "database", "--db", f"sqlite:///{db}"]
    proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": root})  # fmt: skip

    def trials():
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
                return con.execute("SELECT COUNT(*) FROM tuner_trials").fetchone()[0]
        except sqlite3.Error:
            return 0

    deadline = time.monotonic() + 600  # guards against a hang only; a loaded machine is slow, never wrong
    while time.monotonic() < deadline and trials() < 1 and proc.poll() is None:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 143, err[-2000:]
    assert "SIGTERM: stopping after the current trial" in err and "Traceback" not in err
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT COUNT(*) FROM trials WHERE state = 'RUNNING'").fetchone() == (0,)
        assert con.execute("SELECT COUNT(*) FROM tuner_trials").fetchone()[0] >= 1


# --- a table holds what a space allows; one bad entry costs only itself ------------------------------


def test_one_bad_entry_is_skipped_with_one_warning_and_the_rest_is_used(tmp_path):
    import json
    import warnings

    import sparse_mla_tuner.kernels.table as kt

    entry = {"BLOCK_T": 32, "num_warps": 4, "num_stages": 1, "TARGET_CTAS": 7}
    name = kt.table_name("dev X", "fp8_v32", 16, 64)
    doc = {"1": entry, "8": {**entry, "TARGET_CTAS": 11}, str(2**31 - 1): entry, "16": {**entry, "BLOCK_T": 17}}
    (tmp_path / name).write_text(json.dumps(doc))
    kt._warned.clear()
    kt.load_table.cache_clear()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        picks = {b: kt.lookup_config("dev X", "fp8_v32", 16, 64, b, config_dir=tmp_path) for b in (1, 8, 16, 10**6)}
    w = [x for x in w if issubclass(x.category, kt.TableWarning)]
    assert len(w) == 1, [str(x.message) for x in w]
    assert "2 bad entries are skipped" in str(w[0].message) and str(2**31 - 1) in str(w[0].message)
    assert picks[1].TARGET_CTAS == 7 and picks[8].TARGET_CTAS == 11
    assert picks[16].TARGET_CTAS == 11 and picks[10**6].TARGET_CTAS == 11  # the nearest usable key


def test_the_largest_level_a_space_allows_is_a_key_the_loader_takes():
    import sparse_mla_tuner.kernels.table as kt
    from sparse_mla_tuner.tuner.space import MAX_CONCURRENCY

    entry = {"BLOCK_T": 32, "num_warps": 4, "num_stages": 1, "TARGET_CTAS": 7}
    assert list(kt.parse_table({str(MAX_CONCURRENCY): entry})) == [MAX_CONCURRENCY]
    with pytest.raises(ValueError):
        kt.parse_table({str(MAX_CONCURRENCY + 1): entry})


# --- two searches on one database agree with Optuna --------------------------------------------------


def test_two_replay_searches_on_one_database_agree_with_optuna_about_the_best(tmp_path):
    """Two searches at once, sharing each study's queue: every value Optuna holds in a study is on one scale
    (the study's one reference, the baseline as its baseline trial recorded it), so Optuna's best trial is
    the config `tuner best` names, at every level."""
    import json
    import sqlite3
    import statistics

    import optuna

    from tests.recorded import SMALL_SPACE
    from tests.recorded import make_recorded

    recorded, space, db = make_recorded(tmp_path / "recorded.db"), tmp_path / "small.yaml", tmp_path / "two.db"
    space.write_text(SMALL_SPACE.replace("rounds: 10,", "rounds: 10, screen_rounds: 3,"))
    url = f"sqlite:///{db}"
    argv = ["search", str(space), "-q", "--backend", "replay", "--replay-db", f"sqlite:///{recorded}"]
    argv += ["--replay-queue", "database", "--db", url]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(
        [sys.executable, os.path.join(root, "tests", "many_searches.py")],
        input=json.dumps({"argv": argv, "n": 2}), capture_output=True, text=True, cwd=root, timeout=1800,
    )  # fmt: skip  # the limit only guards against a hang
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads(proc.stdout.splitlines()[-1])
    assert [r["rc"] for r in runs] == [0, 0], [r["stderr"][-2000:] for r in runs]
    con = sqlite3.connect(db)
    names = optuna.study.get_all_study_names(storage=url)
    assert len(names) == 2
    for name in names:
        study = optuna.load_study(study_name=name, storage=url)
        ref = study.user_attrs["reference_us"]
        base = [b for (b,) in con.execute(
            "SELECT x.baseline_us FROM tuner_samples x JOIN tuner_trials t ON t.id = x.trial_id "
            "WHERE t.is_baseline AND t.optuna_study = ? AND x.phase = 'screen'", (name,))]  # fmt: skip
        assert ref == pytest.approx(statistics.median(base), rel=1e-9)  # the baseline as its own trial measured it
        complete = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
        for t in complete:  # every value is the tuner's final median of its config, whichever process told it
            ua = t.user_attrs
            assert t.value == ua.get("finalist_median_us", ua["screening_median_us"]), (name, t.number)
        (c,) = con.execute("SELECT DISTINCT concurrency FROM tuner_trials WHERE optuna_study = ?", (name,)).fetchone()
        best = _run_main(["best", "--db", url, "--concurrency", str(c), "-f", "json"])
        assert best.exit_code == 0, best.stderr
        (row,) = json.loads(best.stdout)
        (key,) = con.execute(
            "SELECT config_key FROM tuner_trials WHERE id = ?", (study.best_trial.user_attrs["tuner_trial_id"],)
        ).fetchone()
        assert key == row["config"] or key in (row.get("tied_with") or ""), (name, key, row)


def test_a_space_file_that_is_a_device_is_one_sentence(tmp_path):
    """A space is an input read once: a FIFO is read (tests/test_reliability5.py), a device is refused."""
    _one_sentence(
        _tuner("check", "/dev/null", "--db", f"sqlite:///{tmp_path / 'x.db'}"), "not a regular file or a pipe"
    )
