"""Job names and notes, trial notes: what people write on the dashboard about a job.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-05
"""
import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("porter_jobs") as b:
        b.add_column(sa.Column("name", sa.String(200), nullable=False, server_default=""))
        b.add_column(sa.Column("notes", sa.Text(), nullable=False, server_default=""))
    with op.batch_alter_table("porter_trials") as b:
        b.add_column(sa.Column("note", sa.Text(), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("porter_trials") as b:
        b.drop_column("note")
    with op.batch_alter_table("porter_jobs") as b:
        b.drop_column("notes")
        b.drop_column("name")
