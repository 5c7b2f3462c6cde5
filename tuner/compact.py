"""``tuner db compact``: an SQLite results database kept lean, for committing it.

A kernel that is neither the newest at some level nor named to keep loses its raw samples and its Optuna
studies (their trials mirror the tuner's); its studies, trials, statistics, verdicts and noise bands stay, so
``best``, ``export`` and ``report`` read what they read before. Everything of a kept kernel stays, and so do the
samples a kept duplicate takes from its original. With ``unlaunched``, every study also loses the Optuna trials
of configs that launched nothing (verdict infeasible or duplicate: most of a level's Optuna rows, about three
quarters of a re-tune's new bytes); the tuner's own trials keep those verdicts and their reasons. The file is then
vacuumed. A dry run does the same to a temporary copy and prints what would go and the size it would have.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..db import queries
from ..db import record
from ..db.errors import DatabaseError
from ..db.store import Store
from ..db.store import check_optuna_schema
from ..db.store import redact_url
from .errors import TunerError


@dataclass
class Compaction:
    url: str  # shown (password masked)
    rows: list[dict]  # one per kernel: what it holds and what happened to it
    bytes_before: int
    bytes_after: int


def compact(url: str, keep: tuple[str, ...] = (), dry_run: bool = False, unlaunched: bool = False) -> Compaction:
    """Compact the SQLite database at ``url``, keeping every kernel hash in ``keep`` and each level's newest
    (``unlaunched``: and dropping the Optuna trials of configs that launched nothing)."""
    if url.split(":", 1)[0].split("+", 1)[0] == "postgresql":
        raise TunerError(
            f"tuner db compact works on SQLite files, not {redact_url(url)} (a server keeps its own space)"
        )
    # a dry run opens the file read-only, as the query commands do: it works on a read-only file, and never
    # checkpoints a write-ahead log left beside the file into it (a writer's last close would)
    store = Store(url, readonly=dry_run, create=False)
    check_optuna_schema(store.engine, store.shown_url)  # its Optuna rows are deleted as that schema lays them out
    before = store.file_bytes()
    if not dry_run:
        return Compaction(store.shown_url, _compact(store, keep, unlaunched), before, store.file_bytes())
    with tempfile.TemporaryDirectory(prefix="tuner-compact-") as tmp:
        try:
            copy = Store(store.copy_to(Path(tmp) / "copy.db"), create=False)
        finally:
            store.engine.dispose()
        try:
            rows = _compact(copy, keep, unlaunched)
            return Compaction(store.shown_url, rows, before, copy.file_bytes())
        except DatabaseError as e:  # said of the user's database, not of the passing copy it was found in
            raise type(e)(str(e).replace(copy.shown_url, store.shown_url)) from None
        finally:
            copy.engine.dispose()


def _compact(store: Store, keep: tuple[str, ...], unlaunched: bool = False) -> list[dict]:
    with store.session() as s:
        kernels = queries.kernel_holdings(s)
        known = {k.source_hash for k in kernels}
        unknown = [h for h in keep if h not in known]
        if unknown:
            shown = ", ".join(sorted(known)[:20]) or "none"
            raise TunerError(f"--keep-kernel {unknown[0][:80]!r} is not in {store.shown_url}; it has kernels {shown}")
        kept = {k.kernel_id for k in kernels if k.newest or k.source_hash in keep}
        record.drop_samples(s, queries.unused_sample_trials(s, kept))
        names = queries.study_names(s, {k.kernel_id for k in kernels} - kept)
    gone = _drop_optuna_studies(store.url, [n for ns in names.values() for n in ns])
    if unlaunched:
        with store.session() as s:
            every = queries.study_names(s, {k.kernel_id for k in kernels})
        unl = _drop_unlaunched(store.url, {n: k for k, ns in every.items() for n in ns})
    with store.session() as s:
        left = {k.kernel_id: k.samples for k in queries.kernel_holdings(s)}
    store.vacuum()
    rows = []
    for k in kernels:
        why = [w for w, yes in (("newest", k.newest), ("named", k.source_hash in keep)) if yes]
        rows.append(
            {
                "kernel": k.source_hash,
                "studies": k.studies,
                "trials": k.trials,
                "samples": k.samples,
                "kept": "all: " + ", ".join(why) if why else "trials, statistics",
                "samples_dropped": k.samples - left.get(k.kernel_id, 0),
                "optuna_studies_dropped": len(gone & set(names.get(k.kernel_id, ()))),
            }
        )
        if unlaunched:
            rows[-1]["optuna_unlaunched_dropped"] = unl.get(k.kernel_id, 0)
    return rows


UNLAUNCHED = ('"infeasible"', '"duplicate"')  # the JSON of the verdicts (user attribute "verdict") that launch nothing


def _drop_unlaunched(url: str, kernel_of: dict[str, int]) -> dict[int, int]:
    """Delete the Optuna trials whose ``verdict`` attribute says they launched nothing, in the studies named in
    ``kernel_of`` (study name -> kernel id), with their rows in Optuna's other trial tables; the count by kernel."""
    import sqlalchemy
    from optuna.storages._rdb import models as om

    engine = sqlalchemy.create_engine(url)
    dropped: dict[int, int] = {}
    try:
        with engine.begin() as con:
            if not sqlalchemy.inspect(con).has_table(om.TrialModel.__tablename__):
                return dropped  # no Optuna tables here (a replay kept its queue in memory)
            attrs, trials, studies = om.TrialUserAttributeModel, om.TrialModel, om.StudyModel
            q = (
                sqlalchemy.select(trials.trial_id, studies.study_name)
                .join(studies, studies.study_id == trials.study_id)
                .join(attrs, attrs.trial_id == trials.trial_id)
                .where(attrs.key == "verdict", attrs.value_json.in_(UNLAUNCHED))
            )
            ids = []
            for trial_id, name in con.execute(q):
                if name in kernel_of:
                    ids.append(trial_id)
                    dropped[kernel_of[name]] = dropped.get(kernel_of[name], 0) + 1
            children = (
                om.TrialParamModel,
                om.TrialUserAttributeModel,
                om.TrialSystemAttributeModel,
                om.TrialValueModel,
                om.TrialIntermediateValueModel,
                om.TrialHeartbeatModel,
            )
            for i in range(0, len(ids), 500):
                chunk = ids[i : i + 500]
                for model in children:
                    con.execute(sqlalchemy.delete(model).where(model.trial_id.in_(chunk)))
                con.execute(sqlalchemy.delete(trials).where(trials.trial_id.in_(chunk)))
    finally:
        engine.dispose()
    return dropped


def _drop_optuna_studies(url: str, names: list[str]) -> set[str]:
    """Delete these Optuna studies where they exist (with their trials); returns the names deleted."""
    if not names:
        return set()
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(url)
    gone = set()
    try:
        for n in names:
            try:
                storage.delete_study(storage.get_study_id_from_name(n))
            except KeyError:  # a study the tuner recorded while Optuna's was kept elsewhere (replay: in memory)
                continue
            gone.add(n)
    finally:
        storage.remove_session()
        storage.engine.dispose()
    return gone
