"""Quotas per user and per company.

`user_quota_marks` and `company_quota_marks`: the marks of the worker's periodic quota check,
one row per user (stored chat messages) or company (stored bytes) found at or over its quota,
read by turn-save's settings statement by primary key. Only subjects over a quota have a row.
A user's marks are erased with the user. The other quotas (queued jobs, users with memory,
versions) are counted where they are enforced and need no table.

`ix_jobs_waiting_owner`: an owner's waiting jobs of a kind, which the turn-save counts against
the quota of waiting jobs and coalesces a turn into past it.

Downgrade drops both tables and the index: every subject is under every stored-amount quota
until the check runs again (and the code of 0006 does not call the function).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 19:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _mark_columns() -> list[sa.Column[object]]:
    return [
        sa.Column("quota", sa.String(length=32), nullable=False),
        sa.Column("used", sa.BigInteger(), nullable=False),
        sa.Column("quota_limit", sa.BigInteger(), nullable=False),
        sa.Column(
            "checked_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
    ]


# The owner's waiting jobs of a kind, exactly what the turn-save's count and coalescing read: with
# stale statistics the planner would otherwise walk the company's pending jobs
# (`ix_jobs_pending_company`) and filter them by user, milliseconds for a company with a backlog.
WAITING_INDEX = "ix_jobs_waiting_owner"


def upgrade() -> None:
    op.create_index(
        WAITING_INDEX,
        "jobs",
        ["company_id", "user_id", "kind"],
        postgresql_where=sa.text("status IN ('queued', 'retrying')"),
    )
    op.create_table(
        "user_quota_marks",
        sa.Column("company_id", sa.String(length=128), nullable=False),
        sa.Column("user_id", sa.String(length=256), nullable=False),
        *_mark_columns(),
        sa.CheckConstraint(
            "quota IN ('user_history_messages')", name=op.f("ck_user_quota_marks_quota")
        ),
        sa.PrimaryKeyConstraint("company_id", "user_id", "quota", name=op.f("pk_user_quota_marks")),
    )
    op.create_table(
        "company_quota_marks",
        sa.Column("company_id", sa.String(length=128), nullable=False),
        *_mark_columns(),
        sa.CheckConstraint(
            "quota IN ('company_storage_bytes')", name=op.f("ck_company_quota_marks_quota")
        ),
        sa.PrimaryKeyConstraint("company_id", "quota", name=op.f("pk_company_quota_marks")),
    )


def downgrade() -> None:
    op.drop_index(WAITING_INDEX, table_name="jobs")
    op.drop_table("company_quota_marks")
    op.drop_table("user_quota_marks")
