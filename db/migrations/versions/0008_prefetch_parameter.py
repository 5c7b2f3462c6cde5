"""PREFETCH becomes a declared kernel parameter (0 = the tile loop without register prefetch)

Every trial recorded before it ran the kernel without the prefetch, so the column's default is 0.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-29 18:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tuner_trials") as batch:
        batch.add_column(sa.Column("PREFETCH", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("tuner_trials") as batch:
        batch.drop_column("PREFETCH")
