"""whole-call workloads: the extra cache, the attention sink and the query tokens of a decode call

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-29 15:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tuner_workloads") as batch:
        batch.add_column(sa.Column("call", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tuner_workloads") as batch:
        batch.drop_column("call")
