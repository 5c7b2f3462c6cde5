"""Typed messages between the search and a measurement process (one JSON object per line).

The parent sends :class:`MeasureRequest`, :class:`CalibrateRequest` or :class:`Exit`; the child
answers :class:`Hello` once at start and one :class:`MeasureReply` per request. A request names its kernel's
adapter (``kernel``: :attr:`tuner.adapter.KernelAdapter.spec`), whose config type and workload dict
(:meth:`~tuner.adapter.KernelAdapter.workload_dict`) carry its config and workload on the line.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import field
from dataclasses import fields

from ..db.verdicts import Verdict
from .adapter import DEFAULT
from .adapter import adapter_named

KernelConfig = Workload = object  # annotations: the adapter's config and workload types

# a reply's reason starts so when the config raised no error of its own, but Python's warnings filter
# (PYTHONWARNINGS=error..., -W error) turned a warning into one: the environment's failure, not the config's
WARNING_AS_ERROR = "a Python warning turned into an error by the warnings filter (PYTHONWARNINGS or -W)"


@dataclass(frozen=True)
class MeasureRequest:
    """Gate ``candidate`` (unless ``check`` is off), then time it against ``baseline`` in ``rounds`` pairs."""

    workload: Workload
    batch: int
    candidate: KernelConfig
    baseline: KernelConfig
    rounds: int
    seed: int = 0
    check: bool = True
    kernel: str = DEFAULT  # the adapter (tuner.adapter.KernelAdapter.spec)


@dataclass(frozen=True)
class CalibrateRequest:
    """A/A: ``pairs`` rounds of two independent captures of ``config`` on two independently built inputs."""

    workload: Workload
    batch: int
    config: KernelConfig
    pairs: int
    seed: int = 0  # the replay backend's draws; a GPU measures afresh whatever it is
    kernel: str = DEFAULT  # the adapter (tuner.adapter.KernelAdapter.spec)


@dataclass(frozen=True)
class Exit:
    """Close the measurement process."""


@dataclass(frozen=True)
class Hello:
    """The measurement process is ready; ``environment`` describes where it measures."""

    environment: dict


@dataclass(frozen=True)
class MeasureReply:
    verdict: Verdict
    reason: str = ""
    samples: list[tuple[float, float]] = field(default_factory=list)  # (candidate µs, baseline µs) per round
    replays: int = 1  # calls averaged into one sample
    num_splits: int = 0
    out_rel_err: float | None = None
    lse_abs_err: float | None = None


_TYPES = {cls.__name__: cls for cls in (MeasureRequest, CalibrateRequest, Exit, Hello, MeasureReply)}


def encode(msg) -> str:
    if isinstance(msg, (MeasureRequest, CalibrateRequest)):  # the adapter's config and workload, as it says
        adapter = adapter_named(msg.kernel)
        d = {f.name: getattr(msg, f.name) for f in fields(msg)}
        d["workload"] = adapter.workload_dict(msg.workload)
        for k in ("candidate", "baseline", "config"):
            if k in d:
                d[k] = d[k].as_dict()
        return json.dumps({"type": type(msg).__name__, **d})
    return json.dumps({"type": type(msg).__name__, **asdict(msg)})


def decode(line: str):
    """The message of one protocol line; ``ValueError`` on anything else."""
    try:
        d = json.loads(line)
        cls = _TYPES[d.pop("type")]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"not a protocol message: {line[:200]!r}") from e
    if cls in (MeasureRequest, CalibrateRequest):
        adapter = adapter_named(d.get("kernel", DEFAULT))
        d["workload"] = adapter.workload_from_dict(d["workload"])
        for k in ("candidate", "baseline", "config"):
            if k in d:
                d[k] = adapter.config_type.from_dict(d[k])
    elif cls is MeasureReply:
        d.update(verdict=Verdict(d["verdict"]), samples=[tuple(s) for s in d["samples"]])
    return cls(**d)
