"""Fair claims across companies.

When each company was last served, the index the claim walks companies and their pending jobs by
(it replaces the global oldest-first one), and a small index of running jobs for the claim's
live-lease check.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 19:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PENDING = sa.text("status IN ('queued', 'retrying', 'running')")
RUNNING = sa.text("status = 'running'")


def upgrade() -> None:
    op.create_table(
        "job_company_claims",
        sa.Column("company_id", sa.String(length=128), nullable=False),
        sa.Column("last_claimed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("company_id", name=op.f("pk_job_company_claims")),
    )
    op.create_index(
        "ix_jobs_pending_company",
        "jobs",
        ["company_id", "created_at", "id"],
        unique=False,
        postgresql_where=PENDING,
    )
    op.drop_index("ix_jobs_pending_created", table_name="jobs", postgresql_where=PENDING)
    op.create_index(
        "ix_jobs_running_owner",
        "jobs",
        ["company_id", "user_id"],
        unique=False,
        postgresql_where=RUNNING,
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_running_owner", table_name="jobs", postgresql_where=RUNNING)
    op.create_index(
        "ix_jobs_pending_created",
        "jobs",
        ["created_at", "id"],
        unique=False,
        postgresql_where=PENDING,
    )
    op.drop_index("ix_jobs_pending_company", table_name="jobs", postgresql_where=PENDING)
    op.drop_table("job_company_claims")
