"""The run-time autotune tables, written by ``tuner export`` and read when the kernel gets ``config=None``.

One file per device and workload, in the layout serving engines use for their tuned Triton configs
(vLLM's fused-MoE tables, SGLang's ``triton_<version>/`` folders)::

    kv_format=fp8_model1,heads=16,topk=512,device_name=NVIDIA_H200.json
    {"1": {"BLOCK_T": 32, "num_warps": 4, "num_stages": 1, "TARGET_CTAS": 128}, "8": {...}, ...}

Keys are batch sizes (concurrency) as strings; values hold the kernel's declared parameters
(:data:`kernels.config.PARAMS`; ``maxnreg`` may be left out). ``heads`` is the local head count
(after tensor parallelism); the device name is ``torch.cuda.get_device_name()`` with spaces as
underscores. A sidecar ``<same stem>.provenance.json`` holds where each entry came from (kernel
hash, Triton version, median and CI, verdict); it is optional.

Where: the folder named by ``$SPARSE_MLA_CONFIG_DIR`` first, then the package's ``kernels/configs/``.
The first folder that holds the file decides; a broken file there is not skipped for the next one.

Which entry: the nearest batch key, as vLLM does (``min(keys, key=lambda k: abs(k - B))`` over the
file's keys, which the export writes in ascending order). A tie goes to the smaller key, as ``min``
keeps the first: an engine reading the same file picks the same entry. (Under CUDA graphs a tie
does not arise: the engine pads B to a captured size, and the tables have a key per captured size.)

Failures never raise: a missing table, or a file that is not valid (not JSON, not a mapping of
positive-integer strings to parameter mappings, a parameter unknown, missing or out of its rule, a
sidecar verdict that is not ``ok``), gives :data:`kernels.config.DEFAULT_CONFIG` and one
:class:`TableWarning` per file (or per name looked for) saying what was looked for and what is wrong.
A file is read and validated once per modification time.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from dataclasses import dataclass
from dataclasses import field
from functools import lru_cache
from pathlib import Path

from kernels.config import DEFAULT_CONFIG
from kernels.config import PARAMS
from kernels.config import KernelConfig
from kernels.config import kernel_source_hash

CONFIG_DIR = Path(__file__).parent / "configs"
ENV_DIR = "SPARSE_MLA_CONFIG_DIR"
SIDECAR_SUFFIX = ".provenance.json"
# A sidecar entry must carry one of these trial verdicts (db.verdicts.Verdict.OK: passed the
# correctness gate and was timed); kernels/ does not import db/, so the word is spelled here.
ACCEPTED_VERDICTS = frozenset({"ok"})
REQUIRED = tuple(p.name for p in PARAMS if p.always_in_key)  # as KernelConfig.parse requires them
_BATCH_KEY = re.compile(r"[1-9][0-9]{0,8}")


class TableWarning(UserWarning):
    """The autotune table could not be used (or is stale); the kernel still runs."""


def device_slug(device_name: str) -> str:
    """The device part of a table name: spaces (and path separators) as underscores."""
    return re.sub(r"[\s/\\]", "_", device_name)


def table_name(device_name: str, kv_format: str, heads: int, topk: int) -> str:
    """File name of the table for a device and workload (``heads`` = local heads)."""
    return f"kv_format={kv_format},heads={heads},topk={topk},device_name={device_slug(device_name)}.json"


def sidecar_path(table_path: Path) -> Path:
    return table_path.with_name(table_path.name.removesuffix(".json") + SIDECAR_SUFFIX)


def nearest_key(keys, batch: int) -> int:
    """The nearest batch key; a tie goes to the smaller key, as an engine's ``min`` over the ascending keys."""
    return min(sorted(keys), key=lambda k: abs(k - batch))


def search_dirs(config_dir: Path | None = None) -> list[Path]:
    """Where tables are looked for, in order: ``config_dir`` alone when given, else the
    ``$SPARSE_MLA_CONFIG_DIR`` folder (when set) and then the package's tables."""
    if config_dir is not None:
        return [Path(config_dir)]
    user = os.environ.get(ENV_DIR)
    return ([Path(user)] if user else []) + [CONFIG_DIR]


@dataclass(frozen=True)
class Table:
    """A validated table: its configs by batch, or why it cannot be used."""

    configs: dict[int, KernelConfig] = field(default_factory=dict)
    problem: str | None = None  # set: the whole file is rejected
    notes: tuple[str, ...] = ()  # entries dropped, stale kernel: worth a warning, not a rejection


def lookup_config(
    device_name: str, kv_format: str, heads: int, topk: int, batch: int, config_dir: Path | None = None
) -> KernelConfig:
    """The exported config for this device and workload at batch ``batch``, else :data:`DEFAULT_CONFIG`.

    Never raises: every failure is a :class:`TableWarning` (once per file or name) and the default.
    """
    try:
        return _lookup(device_name, kv_format, heads, topk, batch, config_dir)
    except Exception as e:  # the decode call must not fail because of a table
        _warn_once(("error", device_name, kv_format, heads, topk), f"autotune table lookup failed ({e!r}); {_FALLBACK}")
        return DEFAULT_CONFIG


_FALLBACK = f"using the default config {DEFAULT_CONFIG} (performance may be sub-optimal)"


def _lookup(device_name, kv_format, heads, topk, batch, config_dir) -> KernelConfig:
    name = table_name(device_name, kv_format, heads, topk)
    dirs = search_dirs(config_dir)
    path = next((d / name for d in dirs if (d / name).exists()), None)
    if path is None:
        where = " or ".join(str(d) for d in dirs)
        _warn_once(("missing", name, tuple(dirs)), f"no autotune table {name} in {where}; {_FALLBACK}")
        return DEFAULT_CONFIG
    stamp = _stamp(path)
    table = load_table(str(path), stamp, _stamp(sidecar_path(path)))
    for note in table.notes:
        _warn_once(("note", str(path), stamp, note), f"autotune table {path}: {note}")
    if table.problem:
        _warn_once(("bad", str(path), stamp), f"autotune table {path} is not usable: {table.problem}; {_FALLBACK}")
        return DEFAULT_CONFIG
    return table.configs[nearest_key(table.configs, batch)]


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=64)
def load_table(path: str, stamp, sidecar_stamp) -> Table:
    """Read and validate a table file (and its sidecar when present); cached per modification time."""
    try:
        configs = parse_table(_read_json(Path(path)))
    except ValueError as e:
        return Table(problem=str(e))
    if sidecar_stamp is None:
        return Table(configs)
    side = sidecar_path(Path(path))
    try:
        accepted, notes = _check_sidecar(_read_json(side), configs)
    except ValueError as e:
        return Table(problem=f"its provenance file {side.name}: {e}")
    if not accepted:
        return Table(problem=f"no entry has an accepted verdict ({sorted(ACCEPTED_VERDICTS)}) in {side.name}")
    return Table(accepted, notes=tuple(notes))


def _read_json(path: Path):
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ValueError(f"cannot be read ({e.strerror or e})") from None
    if not raw.strip():
        raise ValueError("the file is empty")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text (a binary file?)") from None
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"not valid JSON ({e})") from None


def parse_table(doc) -> dict[int, KernelConfig]:
    """``{"<batch>": {param: int}}`` -> ``{batch: KernelConfig}``; ValueError saying what is wrong."""
    if not isinstance(doc, dict):
        raise ValueError(f'the top level must be an object {{"<batch>": {{...}}}}, got {_kind(doc)}')
    if not doc:
        raise ValueError("it has no entries")
    out = {}
    for key, entry in doc.items():
        if not _BATCH_KEY.fullmatch(key):
            raise ValueError(f"key {key!r} is not a batch size (a positive integer string)")
        if not isinstance(entry, dict):
            raise ValueError(f"entry {key!r} must be an object of parameters, got {_kind(entry)}")
        missing = [p for p in REQUIRED if p not in entry]
        if missing:
            raise ValueError(f"entry {key!r} lacks {missing}")
        try:
            out[int(key)] = KernelConfig.from_dict(entry)
        except (TypeError, ValueError) as e:
            raise ValueError(f"entry {key!r}: {e}") from None
    return out


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


def _warn_once(key: tuple, message: str) -> None:
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(message, TableWarning, stacklevel=4)
