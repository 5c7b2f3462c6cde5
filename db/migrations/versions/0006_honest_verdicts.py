"""honest verdicts: launch identity and duplicates, p-values, calibrations

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-29 14:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tuner_trials") as batch:
        batch.add_column(sa.Column("launch_key", sa.String(length=128), nullable=True))
        batch.add_column(sa.Column("duplicate_of", sa.Integer(), nullable=True))
    with op.batch_alter_table("tuner_statistics") as batch:
        batch.add_column(sa.Column("p_value", sa.Float(), nullable=True))
    with op.batch_alter_table("tuner_studies") as batch:
        batch.add_column(sa.Column("min_effect", sa.Float(), nullable=True))
        batch.add_column(sa.Column("spread", sa.Float(), nullable=True))
        batch.add_column(sa.Column("baseline_multimodal", sa.Boolean(), nullable=True))
    op.create_table(
        "tuner_calibrations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("environment_id", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("kernel_id", sa.Integer(), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("backend", sa.String(length=16), nullable=False),
        sa.Column("config_key", sa.String(length=64), nullable=False),
        sa.Column("pairs", sa.Integer(), nullable=False),
        sa.Column("rounds", sa.Integer(), nullable=False),
        sa.Column("spread", sa.Float(), nullable=False),
        sa.Column("min_effect", sa.Float(), nullable=False),
        sa.Column("band", sa.Float(), nullable=False),
        sa.Column("mde", sa.Float(), nullable=False),
        sa.Column("false_rate", sa.Float(), nullable=False),
        sa.Column("multimodal", sa.Boolean(), nullable=False),
        sa.Column("samples", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["environment_id"],
            ["tuner_environments.id"],
            name=op.f("fk_tuner_calibrations_environment_id_tuner_environments"),
        ),
        sa.ForeignKeyConstraint(
            ["workload_id"], ["tuner_workloads.id"], name=op.f("fk_tuner_calibrations_workload_id_tuner_workloads")
        ),
        sa.ForeignKeyConstraint(
            ["kernel_id"], ["tuner_kernels.id"], name=op.f("fk_tuner_calibrations_kernel_id_tuner_kernels")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tuner_calibrations")),
    )


def downgrade() -> None:
    op.drop_table("tuner_calibrations")
    with op.batch_alter_table("tuner_studies") as batch:
        batch.drop_column("baseline_multimodal")
        batch.drop_column("spread")
        batch.drop_column("min_effect")
    with op.batch_alter_table("tuner_statistics") as batch:
        batch.drop_column("p_value")
    with op.batch_alter_table("tuner_trials") as batch:
        batch.drop_column("duplicate_of")
        batch.drop_column("launch_key")
