"""maxnreg becomes a declared kernel parameter (0 = no register cap)

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29 13:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tuner_trials") as batch:
        batch.add_column(sa.Column("maxnreg", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("tuner_trials") as batch:
        batch.drop_column("maxnreg")
