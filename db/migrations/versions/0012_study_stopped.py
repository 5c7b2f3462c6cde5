"""a study's finished state in the tuner's own table: why it stopped, and the --n-trials cap it ran under

Until now a finished level was known only from its Optuna study's ``stopped`` and ``n_trials`` attributes, so a
replay whose Optuna queue lives in memory (``--replay-queue memory``, the default) searched every finished level
again on a second run. ``tuner_studies.stopped`` and ``tuner_studies.stopped_n_trials`` keep it whatever the
queue. A study an older search finished keeps its state: both are copied from its Optuna study's attributes
where the database holds Optuna's tables.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04 17:00:00
"""

import json

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    con = op.get_bind()
    have = {c["name"] for c in sa.inspect(con).get_columns("tuner_studies")}
    # (a database this revision upgraded while it was numbered 0011 on its branch has them already)
    missing = [c for c in ("stopped", "stopped_n_trials") if c not in have]
    if missing:
        with op.batch_alter_table("tuner_studies") as batch:
            if "stopped" in missing:
                batch.add_column(sa.Column("stopped", sa.Text(), nullable=True))
            if "stopped_n_trials" in missing:
                batch.add_column(sa.Column("stopped_n_trials", sa.Integer(), nullable=True))
    tables = set(sa.inspect(con).get_table_names())
    if not {"studies", "study_user_attributes"} <= tables:  # no Optuna tables: nothing finished to copy
        return
    rows = con.execute(
        sa.text(
            "SELECT s.study_name, a.key, a.value_json FROM studies s JOIN study_user_attributes a "
            "ON a.study_id = s.study_id WHERE a.key IN ('stopped', 'n_trials')"
        )
    ).fetchall()
    attrs: dict = {}
    for name, key, value in rows:
        attrs.setdefault(name, {})[key] = json.loads(value)
    for name, a in attrs.items():
        if not a.get("stopped"):
            continue
        n = a.get("n_trials")
        con.execute(
            sa.text("UPDATE tuner_studies SET stopped = :s, stopped_n_trials = :n WHERE name = :name"),
            {"s": str(a["stopped"]), "n": int(n) if isinstance(n, int) else None, "name": name},
        )


def downgrade() -> None:
    with op.batch_alter_table("tuner_studies") as batch:
        batch.drop_column("stopped_n_trials")
        batch.drop_column("stopped")
