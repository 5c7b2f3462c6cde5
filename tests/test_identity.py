"""Identities that survive comments: the kernel's (what the compiler sees) and a search space's (what it parses to)."""

from pathlib import Path

from sparse_mla_tuner import kernels
from sparse_mla_tuner.kernels import config as kc

DECODE = Path(kernels.__file__).parent / "decode.py"


def _hash_with(decode_text: str) -> str:
    here = Path(kc.__file__).parent
    texts = {name: (here / name).read_text() for name in kc.KERNEL_FILES}
    texts["decode.py"] = decode_text
    return kc.sources_hash(texts)


def test_the_kernel_hash_is_the_hash_of_its_sources():
    here = Path(kc.__file__).parent
    assert kc.kernel_source_hash() == kc.sources_hash({n: (here / n).read_text() for n in kc.KERNEL_FILES})


def test_a_comment_docstring_or_formatting_edit_keeps_the_kernel_hash():
    text = DECODE.read_text()
    base = _hash_with(text)
    # a comment line, an end-of-line comment, a blank line
    lines = text.splitlines(keepends=True)
    i = next(n for n, line in enumerate(lines) if line.startswith("def "))
    edited = "".join(lines[:i] + ["# a note for readers\n", "\n"] + lines[i:])
    edited = edited.replace("\nimport ", "\nimport  ", 1).replace(":\n", ":  # why\n", 1)
    assert edited != text and _hash_with(edited) == base
    # a docstring: changed, added to a function without one, and the module's
    tree_doc = text.index('"""') + 3
    assert _hash_with(text[:tree_doc] + "Reworded. " + text[tree_doc:]) == base
    n = next(
        n
        for n, line in enumerate(lines)
        if line.lstrip().startswith("def ") and line.rstrip().endswith(":") and '"""' not in lines[n + 1]
    )
    indent = " " * (len(lines[n + 1]) - len(lines[n + 1].lstrip()))
    documented = "".join(lines[: n + 1] + [indent + '"""A new docstring."""\n'] + lines[n + 1 :])
    assert _hash_with(documented) == base
    # a line re-wrapped inside brackets
    assert _hash_with(text.replace("(", "(\n", 1)) == base


def test_a_code_edit_changes_the_kernel_hash():
    text = DECODE.read_text()
    base = _hash_with(text)
    assert _hash_with(text + "\nEXTRA = 1\n") != base
    lines = text.splitlines(keepends=True)
    func = next(line for line in lines if line.startswith("def ") and line.rstrip().endswith(":"))
    assert _hash_with(text.replace(func, func + "    pass\n", 1)) != base
    # a constant in the code
    assert "0" in text
    assert _hash_with(text.replace(" 1)", " 2)", 1)) != base


# --- the space: a comment keeps its studies, a changed baseline is refused --------------------------


def _replay(tmp_path, space_text, db):
    """A replay search of ``space_text`` at C=1, through the command's entry point in this process (one import)."""
    from tests.conftest import tuner_in_process
    from tests.recorded import make_recorded

    recorded = tmp_path / "recorded.db"
    if not recorded.exists():
        make_recorded(recorded)
    space = tmp_path / "small.yaml"
    space.write_text(space_text)
    args = ["search", str(space), "-q", "--backend", "replay", "--replay-db", f"sqlite:///{recorded}"]
    return tuner_in_process(*args, "--db", f"sqlite:///{db}", "--concurrency", "1")


def test_the_space_identity_ignores_comments_and_formatting():
    from sparse_mla_tuner.tuner.space import identity
    from tests.recorded import SMALL_SPACE

    base = identity(SMALL_SPACE)
    assert identity("# tuned on the H200\n" + SMALL_SPACE.replace("\n", "  # note\n", 3)) == base
    assert identity(SMALL_SPACE.replace("BLOCK_T: [16, 32]", "BLOCK_T:\n    - 16\n    - 32")) == base
    assert identity(SMALL_SPACE.replace("BLOCK_T: [16, 32]", "BLOCK_T: [16, 64]")) != base


def test_a_commented_space_resumes_and_a_changed_baseline_is_one_sentence(tmp_path):
    import sqlite3

    from tests.recorded import SMALL_SPACE

    db = tmp_path / "r.db"
    first = _replay(tmp_path, SMALL_SPACE, db)
    assert first.returncode == 0, first.stderr
    commented = "# a comment added after the first run\n" + SMALL_SPACE.replace(
        "concurrency:", "# levels\nconcurrency:"
    )
    again = _replay(tmp_path, commented, db)
    assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr
    con = sqlite3.connect(db)
    assert con.execute("SELECT COUNT(*) FROM tuner_studies").fetchone() == (1,)
    # a real change that keeps the baseline (one more TARGET_CTAS choice) goes on in the same study
    wider = SMALL_SPACE.replace("TARGET_CTAS: [128, 256]", "TARGET_CTAS: [128, 256, 512]")
    more = _replay(tmp_path, wider, db)
    assert more.returncode == 0 and "Traceback" not in more.stderr, more.stderr
    assert con.execute("SELECT COUNT(*) FROM tuner_studies").fetchone() == (1,)
    before = con.execute("SELECT COUNT(*) FROM tuner_trials").fetchone()
    moved = SMALL_SPACE.replace(
        "baseline: {BLOCK_T: 16, num_warps: 4, num_stages: 2,", "baseline: {BLOCK_T: 32, num_warps: 4, num_stages: 1,"
    )
    assert moved != SMALL_SPACE
    refused = _replay(tmp_path, moved, db)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "baseline" in lines[0] and "T16-w4-s2-c256" in lines[0], lines
    assert con.execute("SELECT COUNT(*) FROM tuner_trials").fetchone() == before  # nothing measured, nothing lost


def test_the_kernel_hash_is_the_same_whether_imported_from_the_checkout_or_the_installed_namespace():
    text = DECODE.read_text()
    assert "from kernels." in text or "from sparse_mla_tuner.kernels." in text
    checkout = text.replace("from sparse_mla_tuner.kernels.", "from kernels.")
    installed = checkout.replace("from kernels.", "from sparse_mla_tuner.kernels.")
    assert installed != checkout and _hash_with(installed) == _hash_with(checkout)
    # another package's name is still code
    assert _hash_with(checkout.replace("from kernels.", "from other.", 1)) != _hash_with(checkout)
