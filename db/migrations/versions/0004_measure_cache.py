"""The measurement cache across jobs (porter.job.cache): each trial's measurement identity, and
for a trial that reuses another job's measurement, that trial's job and number.

Trials recorded before this revision have no identity and are never reused.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-04
"""
import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("porter_trials") as b:
        b.add_column(sa.Column("measure_key", sa.String(64), nullable=True))
        b.add_column(sa.Column("reused_job", sa.Integer(), nullable=True))
        b.add_column(sa.Column("reused_number", sa.Integer(), nullable=True))
        b.create_index("ix_porter_trials_measure_key_config_key", ["measure_key", "config_key"])


def downgrade() -> None:
    with op.batch_alter_table("porter_trials") as b:
        b.drop_index("ix_porter_trials_measure_key_config_key")
        b.drop_column("reused_number")
        b.drop_column("reused_job")
        b.drop_column("measure_key")
