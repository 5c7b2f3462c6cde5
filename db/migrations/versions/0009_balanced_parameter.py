"""BALANCED becomes a declared kernel parameter (0 = every row split alike)

Every trial recorded before it ran the per-row split, so the column's default is 0.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 08:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tuner_trials") as batch:
        batch.add_column(sa.Column("BALANCED", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("tuner_trials") as batch:
        batch.drop_column("BALANCED")
