"""Template snapshots: every template row keeps the whole template folder a job was made from
(a zlib-compressed bundle, porter.spec.snapshot), so a job no longer needs its folder on disk.

Rows of earlier jobs get a bundle of what they kept (the source and the space file).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-04
"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from porter.spec.snapshot import from_record

    with op.batch_alter_table("porter_templates") as b:
        b.add_column(sa.Column("files", sa.LargeBinary(), nullable=True))
    t = sa.table("porter_templates", sa.column("id", sa.Integer), sa.column("source", sa.Text),
                 sa.column("space_text", sa.Text), sa.column("files", sa.LargeBinary))
    conn = op.get_bind()
    for row in conn.execute(sa.select(t.c.id, t.c.source, t.c.space_text)).all():
        blob = from_record(row.source, row.space_text).blob
        conn.execute(sa.update(t).where(t.c.id == row.id).values(files=blob))


def downgrade() -> None:
    with op.batch_alter_table("porter_templates") as b:
        b.drop_column("files")
