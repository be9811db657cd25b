"""Indexes for the queue's claim order and the operators' job listing.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 19:40:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_jobs_pending_created",
        "jobs",
        ["created_at", "id"],
        unique=False,
        postgresql_where=sa.text("status IN ('queued', 'retrying', 'running')"),
    )
    op.create_index(
        "ix_jobs_company_created",
        "jobs",
        ["company_id", sa.literal_column("created_at DESC"), sa.literal_column("id DESC")],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_company_created", table_name="jobs")
    op.drop_index(
        "ix_jobs_pending_created",
        table_name="jobs",
        postgresql_where=sa.text("status IN ('queued', 'retrying', 'running')"),
    )
