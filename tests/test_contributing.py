"""CONTRIBUTING.md says who lives where: every file and folder it names exists, and every module and folder of
kernels/, db/ and tuner/ is named there.

A mention is a backticked path (``tuner/study.py``, ``results/``, ``search_spaces/*.yaml``, ``kernels/config.py:
split_grid``) or a backticked file name (``study.py``). It is read from the repository's root or, inside a section
whose heading names folders (``## tuner/ — ...``), from those folders and the folders below them (``grid.py`` is
``tuner/strategies/grid.py``).
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEXT = (ROOT / "CONTRIBUTING.md").read_text()
LAYERS = ("kernels", "db", "tuner")
# what CONTRIBUTING.md names that a checkout does not hold, and why
ELSEWHERE = {
    "tuner/search_spaces/": "where the wheel installs search_spaces/ (pyproject.toml)",
    ".sglang-site/": "the side folder .ci/run installs SGLang into",
    ".vllm-site/": "the side folder .ci/run installs vLLM into",
}
# folders whose files CONTRIBUTING.md names as a whole (the folder), not one by one
AS_A_WHOLE = ("db/migrations/versions",)
FILE = re.compile(r"[\w.*-]+\.(?:py|md|yaml|sh|toml|json|db)")
PATH = re.compile(r"[\w.*-]*/[\w./*-]*")


def _sections() -> list[tuple[list[str], str]]:
    """(the folders a section's heading names, its text) per section; the text before the first heading: []."""
    parts = re.split(r"^## (.*)$", TEXT, flags=re.M)
    out = [([], parts[0])]
    for heading, body in zip(parts[1::2], parts[2::2], strict=True):
        out.append((re.findall(r"([\w.-]+)/", heading.split(" — ")[0]), body))
    return out


def _mentions() -> list[tuple[list[str], str]]:
    """Every backticked path or file name, with the folders of its section (code blocks left out)."""
    out = []
    for folders, body in _sections():
        body = re.sub(r"^```.*?^```", "", body, flags=re.M | re.S)
        for token in re.findall(r"`([^`\n]+)`", body):
            token = token.split(":")[0].strip()  # `kernels/config.py: split_grid`
            if " " not in token and (PATH.fullmatch(token) or FILE.fullmatch(token)):
                out.append((folders, token))
    return out


def _where(folders: list[str], token: str) -> list[Path]:
    """What a mention names: the paths it matches from the root, else from its section's folders (a bare
    file name also in the folders below them)."""
    found = sorted(ROOT.glob(token.rstrip("/")))
    for folder in folders if not found else []:
        found += sorted((ROOT / folder).glob(token.rstrip("/")))
        if "/" not in token:
            found += sorted((ROOT / folder).rglob(token))
    return [p for p in found if p.is_dir() == token.endswith("/") or not token.endswith("/")]


MENTIONS = _mentions()


def test_every_named_file_and_folder_exists():
    assert len(MENTIONS) > 50  # the parser still reads the file
    missing = [token for folders, token in MENTIONS if token not in ELSEWHERE and not _where(folders, token)]
    assert not missing, f"CONTRIBUTING.md names what the checkout does not hold: {missing}"


@pytest.mark.parametrize("token", sorted(ELSEWHERE))
def test_what_it_names_outside_a_checkout_is_still_named_and_still_outside(token):
    assert token in {t for _, t in MENTIONS} and not (ROOT / token).exists(), ELSEWHERE[token]


def _named() -> set[Path]:
    """Every path a mention or a section's heading names."""
    named = {p.resolve() for folders, token in MENTIONS if token not in ELSEWHERE for p in _where(folders, token)}
    return named | {(ROOT / folder).resolve() for folders, _ in _sections() for folder in folders}


@pytest.mark.parametrize("layer", LAYERS)
def test_every_module_and_folder_of_a_layer_is_named(layer):
    """A module counts as named by its path or, in its layer's section, by its name; a package's
    ``__init__.py`` by its folder; the files of :data:`AS_A_WHOLE` by theirs."""
    named = _named()
    folders = [p for p in (ROOT / layer).rglob("*") if p.is_dir() and p.name != "__pycache__"]
    modules = [p for p in (ROOT / layer).rglob("*.py") if not str(p.parent.relative_to(ROOT)).startswith(AS_A_WHOLE)]
    assert modules and (ROOT / layer).resolve() in named
    unnamed = [p for p in folders if p.resolve() not in named]
    package = [p for p in modules if p.name == "__init__.py" and p.parent.resolve() in named]  # by its folder
    unnamed += [p for p in modules if p.resolve() not in named and p not in package]
    assert not unnamed, f"CONTRIBUTING.md does not say what these hold: {[str(p.relative_to(ROOT)) for p in unnamed]}"


def test_a_bare_name_means_one_file():
    """A file name without its folder must not stand for two files of its section's folders."""
    ambiguous = {}
    for folders, token in MENTIONS:
        if "/" not in token and token not in ELSEWHERE and not (ROOT / token).exists():
            found = {p for folder in folders for p in (ROOT / folder).rglob(token) if "__pycache__" not in p.parts}
            if len(found) > 1:
                ambiguous[token] = sorted(str(p.relative_to(ROOT)) for p in found)
    assert not ambiguous, ambiguous
