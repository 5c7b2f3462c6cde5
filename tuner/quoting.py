"""Stored strings as data in what the tuner writes: file names and Markdown.

A results database may come from someone else, so a device name (or any stored string) can hold a
newline, a NUL byte, path separators, Markdown or HTML. Python source gets ``ascii()`` literals and JSON
``json.dumps`` (:mod:`tuner.export`); file names and Markdown get these.
"""

from __future__ import annotations

import re

from sparse_mla_tuner.tuner.adapters.sparse_mla import raw_slug

_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()<>#+\-.!|~])")
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]+")


def file_stem(*parts: object) -> str:
    """One file-name stem from stored strings: only ``[0-9A-Za-z_.+()-]``, never empty, cut (with a hash)
    when long: no path separator, NUL or control character can reach the file system."""
    return raw_slug("_".join(str(p) for p in parts))


def md_text(value: object, limit: int = 200) -> str:
    """A stored string as inline Markdown text: control characters (newlines included) as one space, every
    Markdown and HTML special character escaped, cut to ``limit`` characters. It cannot start a heading,
    list, table row, link or tag, or end the line it is on."""
    text = _CONTROL.sub(" ", str(value))
    if len(text) > limit:
        text = text[:limit] + "…"
    return _MD_SPECIAL.sub(r"\\\1", text)
