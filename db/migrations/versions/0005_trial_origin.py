"""Each trial's origin: whether the search proposed its configuration or the warm start did,
and from what (the vendor library's kernel, the nearest tuned sizes, a source job, ...).

Trials recorded before this revision have an empty origin.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-07
"""
import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("porter_trials") as b:
        b.add_column(sa.Column("origin", sa.String(300), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("porter_trials") as b:
        b.drop_column("origin")
