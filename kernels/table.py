"""The run-time autotune tables, written by ``tuner export`` and read when the kernel gets ``config=None``.

One file per device and workload, in the layout serving engines use for their tuned Triton configs
(vLLM's fused-MoE tables, SGLang's ``triton_<version>/`` folders)::

    kv_format=fp8_model1,heads=16,topk=512,device_name=NVIDIA_H200.json
    {"1": {"BLOCK_T": 32, "num_warps": 4, "num_stages": 1, "TARGET_CTAS": 128}, "8": {...}, ...}

Keys are batch sizes (concurrency) as strings; values hold the kernel's declared parameters
(:data:`kernels.config.PARAMS`; ``maxnreg`` may be left out). A ``"triton_version"`` key, which vLLM's
tuner writes and its loader pops, is allowed and says which Triton the table was tuned with. ``heads`` is
the local head count (after tensor parallelism). A sidecar ``<same stem>.provenance.json`` holds where
each entry came from (kernel hash, Triton version, median and CI, verdict); it is optional.

Device names (:func:`device_slug`) follow vLLM: ``torch.cuda.get_device_name()`` with spaces as
underscores, and every H200 variant (``NVIDIA H200 NVL``, ...) as ``NVIDIA_H200``. Characters that do
not belong in a file name become ``_``. The RTX PRO 6000 Blackwell editions (Workstation, Server,
Max-Q Workstation) are one chip: with no table of its own, an edition uses another edition's, with a warning.

Where: :func:`tables_dir` first (``$SPARSE_MLA_CONFIG_DIR``, else ``~/.local/share/sparse_mla_tuner/configs``),
then the package's ``kernels/configs/``. In a
folder, as SGLang looks: ``triton_<running version>/`` (``triton_3_9_0/``), then the flat file, then the
``triton_<version>/`` folders of older versions, newest first; a table tuned with another Triton version
than the running one is used with a warning. The first folder that holds the file decides; a broken file
there is not skipped for the next one. Only regular files are opened (a FIFO, device or directory where the
table should be is reported, never read), without blocking, and at most :data:`MAX_TABLE_BYTES` are read.
The table used is logged once at INFO (logger ``kernels.table``), as vLLM logs its tuned configs.

Which entry: the nearest batch key, as vLLM does (``min(keys, key=lambda k: abs(k - B))`` over the
file's keys, which the export writes in ascending order). A tie goes to the smaller key, as ``min``
keeps the first: an engine reading the same file picks the same entry. (Under CUDA graphs a tie
does not arise: the engine pads B to a captured size, and the tables have a key per captured size.)

Failures never raise: a missing table, or a file that is not valid (not a regular file, too large, not
JSON, not a mapping of batch keys to parameter mappings, no usable entry, a sidecar verdict that is not
``ok``), gives :data:`kernels.config.DEFAULT_CONFIG` and one :class:`TableWarning` per file (or per name
looked for) saying what was looked for and what is wrong. One bad entry (a key that is not a batch size of at
most :data:`MAX_BATCH`, a parameter unknown, missing or outside its bounds) is skipped with one warning for
the file; the other entries are used.
A file is read and validated once per modification time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
import warnings
from dataclasses import dataclass
from dataclasses import field
from functools import lru_cache
from pathlib import Path

from ..files import ReadProblem
from ..files import file_kind
from ..files import read_bounded
from .config import DEFAULT_CONFIG
from .config import PARAMS
from .config import KernelConfig
from .config import kernel_source_hash

logger = logging.getLogger(__name__)

CONFIG_DIR = Path(__file__).parent / "configs"
ENV_DIR = "SPARSE_MLA_CONFIG_DIR"
SIDECAR_SUFFIX = ".provenance.json"
VERSION_KEY = "triton_version"  # vLLM's key in a tuned table (its loader pops it)
MAX_TABLE_BYTES = 1 << 20  # a table of every batch size is a few kB; its sidecar some tens
# A sidecar entry must carry one of these trial verdicts (db.verdicts.Verdict.OK: passed the
# correctness gate and was timed); kernels/ does not import db/, so the word is spelled here.
ACCEPTED_VERDICTS = frozenset({"ok"})
REQUIRED = tuple(p.name for p in PARAMS if p.always_in_key)  # as KernelConfig.parse requires them
MAX_BATCH = 999_999_999  # the largest batch key a table holds (nine digits); the search space bounds levels by it
_BATCH_KEY = re.compile(r"[1-9][0-9]{0,8}")
_VERSION_FOLDER = re.compile(r"triton_([0-9]+(?:_[0-9]+)*)")

H200 = "NVIDIA_H200"
# One chip (GB202) sold in editions with other clocks and power limits; SGLang ships tables under each name.
RTX_PRO_6000_BLACKWELL = (
    "NVIDIA_RTX_PRO_6000_Blackwell_Workstation_Edition",
    "NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition",
    "NVIDIA_RTX_PRO_6000_Blackwell_Max-Q_Workstation_Edition",
)
FAMILIES = (RTX_PRO_6000_BLACKWELL,)
MAX_SLUG = 120  # a table name stays well inside a file name's 255 bytes


class TableWarning(UserWarning):
    """The autotune table could not be used (or is stale); the kernel still runs."""


def raw_slug(device_name: str) -> str:
    """``torch.cuda.get_device_name()`` as SGLang names its tables: spaces as underscores. Anything that does
    not belong in a file name (path separators, control characters, NUL, quotes, non-ASCII) also becomes ``_``,
    and a name longer than :data:`MAX_SLUG` is cut, with a hash of the whole name, so that any stored name gives a
    valid, distinct file name inside its folder."""
    name = str(device_name)
    slug = re.sub(r"[^0-9A-Za-z_.+()\-]", "_", name.replace(" ", "_"))
    if slug.strip("._") == "":
        slug = "unnamed_" + slug
    if len(slug) > MAX_SLUG:
        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:12]
        slug = slug[: MAX_SLUG - 13] + "-" + digest
    return slug


def device_slug(device_name: str) -> str:
    """The device part of a table name, as vLLM writes it: :func:`raw_slug`, and every H200 variant
    (``NVIDIA H200 NVL``, ``NVIDIA H200 141GB HBM3e``) as ``NVIDIA_H200``."""
    slug = raw_slug(device_name)
    return H200 if "H200" in slug.split("_") else slug


def family_of(slug: str) -> tuple[str, ...]:
    """The other names of the same chip (empty for most devices)."""
    for family in FAMILIES:
        if slug in family:
            return tuple(n for n in family if n != slug)
    return ()


def table_name(device_name: str, kv_format: str, heads: int, topk: int, *, slug: str | None = None) -> str:
    """File name of the table for a device and workload (``heads`` = local heads)."""
    return f"kv_format={kv_format},heads={heads},topk={topk},device_name={slug or device_slug(device_name)}.json"


def triton_folder(version: str) -> str:
    """SGLang's folder for a Triton version: ``3.6.0`` -> ``triton_3_6_0``."""
    return "triton_" + re.sub(r"[^0-9A-Za-z]+", "_", str(version)).strip("_")


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"[0-9]+", str(text))[:3])


def sidecar_path(table_path: Path) -> Path:
    return table_path.with_name(table_path.name.removesuffix(".json") + SIDECAR_SUFFIX)


def nearest_key(keys, batch: int) -> int:
    """The nearest batch key; a tie goes to the smaller key, as an engine's ``min`` over the ascending keys."""
    return min(sorted(keys), key=lambda k: abs(k - batch))


def tables_dir() -> Path:
    """The one folder where exported tables live, for every engine's plugin (SGLang's and vLLM's) and for ``tuner export
    --engine``: ``$SPARSE_MLA_CONFIG_DIR`` when set, else ``$XDG_DATA_HOME/sparse_mla_tuner/configs``
    (``~/.local/share/sparse_mla_tuner/configs`` when it is unset or relative, which the XDG rules ignore). Both layouts
    may lie in it side by side: SGLang's ``triton_<version>/`` folders and vLLM's flat files; :func:`lookup_config`
    reads both."""
    user = os.environ.get(ENV_DIR)
    if user:
        return Path(user)
    base = os.environ.get("XDG_DATA_HOME", "")
    if not os.path.isabs(base):  # unset, empty or relative: the XDG rule is to ignore a relative one
        base = os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "sparse_mla_tuner" / "configs"


def search_dirs(config_dir: Path | None = None) -> list[Path]:
    """Where tables are looked for, in order: ``config_dir`` alone when given, else :func:`tables_dir` and then
    the package's tables."""
    if config_dir is not None:
        return [Path(config_dir)]
    return [tables_dir(), CONFIG_DIR]


def running_triton() -> str:
    import triton  # the kernel's caller has it loaded; reading a table alone should not need it

    return triton.__version__


@dataclass(frozen=True)
class Table:
    """A validated table: its configs by batch, or why it cannot be used."""

    configs: dict[int, KernelConfig] = field(default_factory=dict)
    problem: str | None = None  # set: the whole file is rejected
    notes: tuple[str, ...] = ()  # entries dropped, stale kernel: worth a warning, not a rejection
    triton: str | None = None  # the Triton version it was tuned with (table key or sidecar), when known


@dataclass(frozen=True)
class Candidate:
    """Where a table may lie, and what using it means."""

    path: Path
    slug: str  # the device name it was tuned on
    folder_version: str | None  # the triton_<version> folder it lies in; None: the flat layout


def candidates(
    folder: Path, device_name: str, kv_format: str, heads: int, topk: int, triton_version: str
) -> list[Candidate]:
    """Every place in ``folder`` a table for this device and workload may lie, in the order they are tried:
    per device name (this device's, then its family's), ``triton_<running>/``, the flat file, then the
    folders of older Triton versions, newest first."""
    slugs = [device_slug(device_name)]
    if raw_slug(device_name) not in slugs:
        slugs.append(raw_slug(device_name))  # SGLang's name, without vLLM's H200 rule
    for slug in list(slugs):
        slugs += [n for n in family_of(slug) if n not in slugs]
    current = version_tuple(triton_version)
    older = []
    try:
        with os.scandir(folder) as it:
            for entry in it:
                m = _VERSION_FOLDER.fullmatch(entry.name)
                if m and entry.name != triton_folder(triton_version):
                    version = tuple(int(x) for x in m.group(1).split("_"))
                    if version < current:
                        older.append((version, entry.name))
    except (OSError, ValueError):  # no such folder, not a folder, a NUL in its name: nothing there
        pass
    older.sort(reverse=True)
    out = []
    for slug in slugs:
        name = table_name(device_name, kv_format, heads, topk, slug=slug)
        out.append(Candidate(folder / triton_folder(triton_version) / name, slug, triton_version))
        out.append(Candidate(folder / name, slug, None))
        out += [Candidate(folder / sub / name, slug, ".".join(map(str, v))) for v, sub in older]
    return out


def lookup_config(
    device_name: str,
    kv_format: str,
    heads: int,
    topk: int,
    batch: int,
    config_dir: Path | None = None,
    triton_version: str | None = None,
) -> KernelConfig:
    """The exported config for this device and workload at batch ``batch``, else :data:`DEFAULT_CONFIG`.

    ``triton_version``: the running Triton's by default. Never raises: every failure is a
    :class:`TableWarning` (once per file or name) and the default.
    """
    try:
        return _lookup(device_name, kv_format, heads, topk, batch, config_dir, triton_version or running_triton())
    except Exception as e:  # the decode call must not fail because of a table
        _warn_once(("error", device_name, kv_format, heads, topk), f"autotune table lookup failed ({e!r}); {_FALLBACK}")
        return DEFAULT_CONFIG


_FALLBACK = f"using the default config {DEFAULT_CONFIG} (performance may be sub-optimal)"


def _exists(path: Path) -> bool:
    """Whether anything is there (a FIFO or a directory counts: it is reported, not skipped); never opens it."""
    try:
        os.stat(path)
    except (OSError, ValueError):
        return False
    return True


def _lookup(device_name, kv_format, heads, topk, batch, config_dir, triton_version) -> KernelConfig:
    dirs = search_dirs(config_dir)
    found = None
    for d in dirs:
        found = next(
            (c for c in candidates(d, device_name, kv_format, heads, topk, triton_version) if _exists(c.path)), None
        )
        if found is not None:
            break
    if found is None:
        name = table_name(device_name, kv_format, heads, topk)
        where = " or ".join(f"{d} (and its {triton_folder(triton_version)}/)" for d in dirs)
        _warn_once(("missing", name, tuple(dirs), triton_version), f"no autotune table {name} in {where}; {_FALLBACK}")
        return DEFAULT_CONFIG
    path = found.path
    stamp = _stamp(path)
    table = load_table(str(path), stamp, _stamp(sidecar_path(path)))
    for note in table.notes:
        _warn_once(("note", str(path), stamp, note), f"autotune table {path}: {note}")
    if table.problem:
        _warn_once(("bad", str(path), stamp), f"autotune table {path} is not usable: {table.problem}; {_FALLBACK}")
        return DEFAULT_CONFIG
    own = device_slug(device_name)
    if found.slug not in (own, raw_slug(device_name)):
        _warn_once(
            ("family", str(path), own),
            f"autotune table {path} was tuned on {found.slug}, this GPU is {own}: the same chip in another edition "
            "(other clocks and power limit); using it (re-tune on this GPU for its own best configs)",
        )
    tuned = found.folder_version or table.triton
    if tuned and version_tuple(tuned) != version_tuple(triton_version):
        _warn_once(
            ("version", str(path), triton_version),
            f"no autotune table for Triton {triton_version} ({triton_folder(triton_version)}/); using {path}, tuned "
            f"with Triton {tuned} (performance may be sub-optimal: re-tune with this Triton)",
        )
    if ("used", str(path), stamp) not in _logged:
        _logged.add(("used", str(path), stamp))
        logger.info("sparse-MLA decode: using the autotune table %s", path)
    return table.configs[nearest_key(table.configs, batch)]


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=64)
def load_table(path: str, stamp, sidecar_stamp) -> Table:
    """Read and validate a table file (and its sidecar when present); cached per modification time."""
    try:
        doc = _read_json(Path(path))
        version = None
        if isinstance(doc, dict) and VERSION_KEY in doc:
            doc = dict(doc)
            version = doc.pop(VERSION_KEY)
            if not isinstance(version, str):
                raise ValueError(f"{VERSION_KEY!r} must be a version string, got {_kind(version)}")
        configs = parse_table(doc)
    except ValueError as e:
        return Table(problem=str(e))
    skipped = tuple(getattr(configs, "skipped", ()))
    configs = dict(configs)
    if skipped:
        shown = "; ".join(skipped[:3]) + (f"; and {len(skipped) - 3} more" if len(skipped) > 3 else "")
        skipped = (f"{len(skipped)} bad {'entry is' if len(skipped) == 1 else 'entries are'} skipped ({shown})",)
    if sidecar_stamp is None:
        return Table(configs, notes=skipped, triton=version)
    side = sidecar_path(Path(path))
    try:
        side_doc = _read_json(side)
        accepted, notes = _check_sidecar(side_doc, configs)
    except ValueError as e:
        return Table(problem=f"its provenance file {side.name}: {e}")
    if not accepted:
        return Table(problem=f"no entry has an accepted verdict ({sorted(ACCEPTED_VERDICTS)}) in {side.name}")
    tuned = side_doc.get("triton")
    return Table(accepted, notes=skipped + tuple(notes), triton=version or (tuned if isinstance(tuned, str) else None))


def read_regular(path: Path, limit: int = MAX_TABLE_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; ValueError saying what is wrong otherwise.

    Never blocks: anything but a regular file (a FIFO, a socket, a device, a directory) is refused before it
    is opened, and the file is opened non-blocking, so a FIFO swapped in meanwhile gives no wait either."""
    try:
        st = os.stat(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot be read ({getattr(e, 'strerror', None) or e})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"cannot be read: it is {file_kind(st.st_mode)}, not a regular file")
    try:
        return read_bounded(path, limit)
    except ReadProblem as p:
        if p.reason == "kind":
            raise ValueError(f"cannot be read: it is {file_kind(p.mode)}, not a regular file") from None
        if p.reason == "size":
            if p.size is not None:
                raise ValueError(f"it is {p.size} bytes, more than a table's limit of {limit}") from None
            raise ValueError(f"it is more than a table's limit of {limit} bytes") from None
        raise ValueError(f"cannot be read ({p.error.strerror or p.error})") from None


def _read_json(path: Path):
    raw = read_regular(path)
    if not raw.strip():
        raise ValueError("the file is empty")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text (a binary file?)") from None
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, and an integer past Python's digit limit
        raise ValueError(f"not valid JSON ({str(e)[:200]})") from None


class Entries(dict):
    """A table's usable entries (``{batch: KernelConfig}``) and, in :attr:`skipped`, why each other one is not."""

    skipped: tuple[str, ...] = ()


def parse_table(doc) -> Entries:
    """``{"<batch>": {param: int}}`` -> ``{batch: KernelConfig}``.

    One bad entry (a key that is not a batch size, a parameter unknown, missing or out of its bounds) is
    skipped and said in :attr:`Entries.skipped`, the rest of the table stays usable; ValueError saying what
    is wrong when the whole file is (not a mapping, no entries, no usable entry)."""
    if not isinstance(doc, dict):
        raise ValueError(f'the top level must be an object {{"<batch>": {{...}}}}, got {_kind(doc)}')
    if not doc:
        raise ValueError("it has no entries")
    out, skipped = Entries(), []
    for key, entry in doc.items():
        try:
            out[int(key)] = _entry(key, entry)
        except ValueError as e:
            skipped.append(str(e))
    if not out:
        more = f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""
        raise ValueError(f"no usable entry: {skipped[0]}{more}")
    out.skipped = tuple(skipped)
    return out


def _entry(key, entry) -> KernelConfig:
    if not _BATCH_KEY.fullmatch(key):
        raise ValueError(f"key {_cut(key)} is not a batch size (a positive integer string of at most 9 digits)")
    if not isinstance(entry, dict):
        raise ValueError(f"entry {key!r} must be an object of parameters, got {_kind(entry)}")
    missing = [p for p in REQUIRED if p not in entry]
    if missing:
        raise ValueError(f"entry {key!r} lacks {missing}")
    try:
        return KernelConfig.from_dict(entry)
    except (TypeError, ValueError) as e:
        raise ValueError(f"entry {key!r}: {str(e)[:300]}") from None


def _cut(value, limit: int = 100) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _check_sidecar(doc, configs: dict[int, KernelConfig]) -> tuple[dict[int, KernelConfig], list[str]]:
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), dict):
        raise ValueError('it must be an object with "entries"')
    entries = doc["entries"]
    accepted, dropped = {}, []
    for b, cfg in configs.items():
        e = entries.get(str(b))
        verdict = e.get("verdict") if isinstance(e, dict) else None
        if verdict in ACCEPTED_VERDICTS:
            accepted[b] = cfg
        else:
            dropped.append(f"{b} ({verdict or 'no provenance'})")
    notes = []
    if dropped:
        notes.append(f"entries without an accepted verdict are ignored: {', '.join(dropped)}")
    tuned, current = doc.get("kernel_hash"), kernel_source_hash()
    if tuned and tuned != current:
        notes.append(
            f"tuned for kernel {tuned}, the current kernel is {current}; using it anyway "
            "(re-run `tuner search` and `tuner export` to refresh)"
        )
    return accepted, notes


def _kind(x) -> str:
    return "null" if x is None else type(x).__name__


_warned: set[tuple] = set()
_logged: set[tuple] = set()


def _warn_once(key: tuple, message: str) -> None:
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(message, TableWarning, stacklevel=4)


# --- shapes without a table of their own (an engine's heads and top-k) -----------------------------------

_TABLE_FILE = re.compile(
    r"kv_format=([0-9A-Za-z_]+),heads=([1-9][0-9]{0,5}),topk=([1-9][0-9]{0,8}),device_name=(.+)\.json"
)


def tuned_shapes(device_name: str, kv_format: str, config_dir: Path | None = None) -> list[tuple[int, int]]:
    """``(heads, topk)`` of every table this device may read for ``kv_format``: in the folders
    :func:`lookup_config` searches (and their ``triton_<version>/`` folders), under this device's names
    (its own, SGLang's, its family's). Only the names are read; a broken file is still reported by
    :func:`lookup_config` when it is used."""
    slugs = {device_slug(device_name), raw_slug(device_name)}
    for slug in list(slugs):
        slugs.update(family_of(slug))
    found = set()
    for d in search_dirs(config_dir):
        folders = [Path(d)]
        try:
            with os.scandir(d) as it:
                folders += [Path(e.path) for e in it if _VERSION_FOLDER.fullmatch(e.name) and e.is_dir()]
        except (OSError, ValueError):
            continue
        for folder in folders:
            try:
                with os.scandir(folder) as it:
                    names = [e.name for e in it]
            except (OSError, ValueError):
                continue
            for name in names:
                m = _TABLE_FILE.fullmatch(name)
                if m and m.group(1) == kv_format and m.group(4) in slugs:
                    found.add((int(m.group(2)), int(m.group(3))))
    return sorted(found)


def nearest_shape(shapes, heads: int, topk: int) -> tuple[int, int] | None:
    """The tuned ``(heads, topk)`` whose table serves a shape without one (None when ``shapes`` is empty).

    Heads first: the same count; else the nearest count (by ratio; a tie goes to the larger) among those
    whose programs take at least as many heads (``block_h_for``: 16 for up to 16 heads, 32 above), since
    a config that compiles for a larger head block fits a smaller one; else the largest count tuned.
    Then top-k, among that head count's tables: the same width; else the largest tuned width below it
    (rounded down: the config's tiles and splits were chosen for no more tokens than the call has); else
    the smallest above, whose config :func:`fit_config` then fits to the call's width.
    """
    import math

    from .config import block_h_for

    shapes = sorted(set(shapes))
    if not shapes:
        return None
    counts = sorted({h for h, _ in shapes})
    if heads in counts:
        h = heads
    else:
        wider = [c for c in counts if block_h_for(c) >= block_h_for(heads)]
        if wider:
            h = min(wider, key=lambda c: (abs(math.log2(c / heads)), -c))
        else:
            h = counts[-1]
    widths = sorted(k for c, k in shapes if c == h)
    below = [k for k in widths if k <= topk]
    return (h, below[-1] if below else widths[0])


def fit_config(config: KernelConfig, topk: int) -> KernelConfig:
    """A config tuned for a wider top-k, fitted to ``topk`` tokens: its tile is at most ``topk`` rounded up to a
    power of two (at least 16), so no tile is mostly masked and the footprint only shrinks."""
    cap = max(16, 1 << max(0, topk - 1).bit_length())
    return config if config.BLOCK_T <= cap else config.replace(BLOCK_T=cap)
