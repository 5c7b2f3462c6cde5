"""Identities that survive comments: the kernel's (what the compiler sees) and a search space's (what it parses to)."""

from pathlib import Path

import kernels
from kernels import config as kc

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
