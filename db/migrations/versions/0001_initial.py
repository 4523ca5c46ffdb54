"""Initial schema: templates, jobs, trials, measurements.

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "porter_templates",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("source_hash", sa.String(64), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("version", sa.String(50), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("space_text", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_porter_templates"),
        sa.UniqueConstraint("source_hash", name="uq_porter_templates_source_hash"),
    )
    op.create_index("ix_porter_templates_name", "porter_templates", ["name"])

    op.create_table(
        "porter_jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("spec", JSON, nullable=False),
        sa.Column("template_name", sa.String(200), nullable=False),
        sa.Column("template_hash", sa.String(64), nullable=False),
        sa.Column("arch", sa.String(20), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("started_at", sa.Double(), nullable=True),
        sa.Column("finished_at", sa.Double(), nullable=True),
        sa.Column("study_name", sa.String(200), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("heartbeat_at", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(["template_hash"], ["porter_templates.source_hash"],
                                name="fk_porter_jobs_template_hash_porter_templates"),
        sa.PrimaryKeyConstraint("id", name="pk_porter_jobs"),
    )
    op.create_index("ix_porter_jobs_status", "porter_jobs", ["status"])
    op.create_index("ix_porter_jobs_template_name_arch", "porter_jobs",
                    ["template_name", "arch"])

    op.create_table(
        "porter_trials",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("params", JSON, nullable=False),
        sa.Column("config_key", sa.String(500), nullable=False),
        sa.Column("status", sa.String(30), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("backend", sa.String(30), nullable=False),
        sa.Column("objective", sa.Double(), nullable=True),
        sa.Column("compile_seconds", sa.Double(), nullable=True),
        sa.Column("compile_log", sa.Text(), nullable=False),
        sa.Column("registers", sa.Integer(), nullable=True),
        sa.Column("smem_bytes", sa.Integer(), nullable=True),
        sa.Column("spill_bytes", sa.Integer(), nullable=True),
        sa.Column("stack_frame", sa.Integer(), nullable=True),
        sa.Column("cubin_key", sa.String(200), nullable=True),
        sa.Column("device", JSON, nullable=False),
        sa.Column("started_at", sa.Double(), nullable=True),
        sa.Column("finished_at", sa.Double(), nullable=True),
        sa.Column("worker", sa.String(200), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["porter_jobs.id"], ondelete="CASCADE",
                                name="fk_porter_trials_job_id_porter_jobs"),
        sa.PrimaryKeyConstraint("id", name="pk_porter_trials"),
        sa.UniqueConstraint("job_id", "number", name="uq_porter_trials_job_id_number"),
    )
    op.create_index("ix_porter_trials_job_id_status", "porter_trials", ["job_id", "status"])
    op.create_index("ix_porter_trials_job_id_objective", "porter_trials",
                    ["job_id", "objective"])

    op.create_table(
        "porter_measurements",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("size", sa.String(100), nullable=False),
        sa.Column("ours_ms", sa.Double(), nullable=False),
        sa.Column("ours_spread", sa.Double(), nullable=False),
        sa.Column("baseline", sa.String(100), nullable=False),
        sa.Column("baseline_ms", sa.Double(), nullable=True),
        sa.Column("ratio", sa.Double(), nullable=True),
        sa.Column("error", sa.Double(), nullable=True),
        sa.Column("tflops", sa.Double(), nullable=True),
        sa.Column("gbps", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(["trial_id"], ["porter_trials.id"], ondelete="CASCADE",
                                name="fk_porter_measurements_trial_id_porter_trials"),
        sa.PrimaryKeyConstraint("id", name="pk_porter_measurements"),
    )
    op.create_index("ix_porter_measurements_trial_id", "porter_measurements", ["trial_id"])


def downgrade() -> None:
    op.drop_table("porter_measurements")
    op.drop_table("porter_trials")
    op.drop_table("porter_jobs")
    op.drop_table("porter_templates")
