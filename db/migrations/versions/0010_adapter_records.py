"""another kernel's records: the adapter of kernels, spaces and workloads, and a trial's parameters as JSON

The built-in kernel (``sparse_mla``) keeps its columns: its parameters in ``tuner_trials`` and its shape in
``tuner_workloads``. A kernel of another adapter (a space's ``kernel: module:Class``) records its trial's
parameters in ``tuner_trials.params`` and its workload's description in ``tuner_workloads.fields`` (JSON); its
rows leave the built-in kernel's columns at their defaults. Every row recorded before this ran the built-in
kernel, so ``adapter`` defaults to ``sparse_mla`` and ``params`` is NULL.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03 18:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

SHAPE = ["name", "kv_format", "heads", "tp", "topk", "page_size", "context"]


def upgrade() -> None:
    for table in ("tuner_kernels", "tuner_spaces"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("adapter", sa.String(200), nullable=False, server_default="sparse_mla"))
    with op.batch_alter_table("tuner_workloads") as batch:
        batch.add_column(sa.Column("adapter", sa.String(200), nullable=False, server_default="sparse_mla"))
        batch.add_column(sa.Column("fields", sa.Text(), nullable=False, server_default=""))
        batch.drop_constraint("uq_tuner_workloads_name", type_="unique")
        batch.create_unique_constraint("uq_tuner_workloads_name", [*SHAPE, "adapter", "fields"])
    with op.batch_alter_table("tuner_trials") as batch:
        batch.add_column(sa.Column("params", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tuner_trials") as batch:
        batch.drop_column("params")
    with op.batch_alter_table("tuner_workloads") as batch:
        batch.drop_constraint("uq_tuner_workloads_name", type_="unique")
        batch.create_unique_constraint("uq_tuner_workloads_name", SHAPE)
        batch.drop_column("fields")
        batch.drop_column("adapter")
    for table in ("tuner_spaces", "tuner_kernels"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("adapter")
