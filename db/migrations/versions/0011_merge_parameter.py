"""MERGE becomes a declared kernel parameter (0 = a separate combine launch merges the splits)

Every trial recorded before it merged a row's splits in the combine launch, so the column's default is 0.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04 17:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tuner_trials") as batch:
        batch.add_column(sa.Column("MERGE", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("tuner_trials") as batch:
        batch.drop_column("MERGE")
