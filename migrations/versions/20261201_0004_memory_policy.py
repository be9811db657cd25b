"""The company's memory policy, and the record of what it kept out of users' memories.

`company_memory_policies`: one row per company that saved a policy (operators, audited): the
action per category of content (`drop`, `redact`, `allow`) as a JSON object, the retention in
days, and who changed it last as (company, user), as on `company_feature_flags`. A company
without a row has the service's defaults.

`memory_policy_actions`: per write of a user's profile, each bullet the policy dropped or value
it redacted: category, the detector's kind, section, the version written (NULL when the write
stored nothing) and its provenance. Never the value. Rows go with the user's `memory.md` (FK
cascade), so an opt-out or an erasure takes them along.

`memory_versions.reason` may also be `retention`: the version the worker writes when the
company's retention removes old Recent Topics.

Downgrade drops both tables (every company is back at the defaults and the record is gone) and
relabels `retention` versions as `truncation`, the older reason closest to it (whole lines
removed by code, no model involved), so that no version is lost.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 18:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _created_now(name: str) -> sa.Column[object]:
    return sa.Column(
        name, sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
    )


OLD_REASONS = "'consolidation', 'condensation', 'truncation', 'user_edit', 'restore'"
NEW_REASONS = f"{OLD_REASONS}, 'retention'"
REASON_CHECK = "ck_memory_versions_reason"


def _reasons(allowed: str) -> None:
    op.drop_constraint(op.f(REASON_CHECK), "memory_versions", type_="check")
    op.create_check_constraint(op.f(REASON_CHECK), "memory_versions", f"reason IN ({allowed})")


def upgrade() -> None:
    _reasons(NEW_REASONS)
    op.create_table(
        "company_memory_policies",
        sa.Column("company_id", sa.String(length=128), nullable=False),
        sa.Column("actions", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("recent_topics_days", sa.Integer(), nullable=False),
        sa.Column("inactive_memory_days", sa.Integer(), nullable=False),
        _created_now("updated_at"),
        sa.Column("updated_by_company_id", sa.String(length=128), nullable=False),
        sa.Column("updated_by", sa.String(length=256), nullable=False),
        sa.CheckConstraint(
            "recent_topics_days BETWEEN 0 AND 3650",
            name=op.f("ck_company_memory_policies_recent_topics_days_range"),
        ),
        sa.CheckConstraint(
            "inactive_memory_days BETWEEN 0 AND 3650",
            name=op.f("ck_company_memory_policies_inactive_memory_days_range"),
        ),
        sa.CheckConstraint(
            "jsonb_typeof(actions) = 'object'",
            name=op.f("ck_company_memory_policies_actions_object"),
        ),
        sa.PrimaryKeyConstraint("company_id", name=op.f("pk_company_memory_policies")),
    )
    op.create_table(
        "memory_policy_actions",
        sa.Column("company_id", sa.String(length=128), nullable=False),
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("user_id", sa.String(length=256), nullable=False),
        _created_now("occurred_at"),
        sa.Column("version", sa.Integer(), nullable=True),
        sa.Column("reason", sa.String(length=16), nullable=False),
        sa.Column("category", sa.String(length=32), nullable=False),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("section", sa.String(length=64), nullable=False),
        sa.Column(
            "source_turn_ids",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'[]'"),
            nullable=False,
        ),
        sa.Column("job_id", sa.Uuid(), nullable=True),
        sa.CheckConstraint(
            "action IN ('drop', 'redact')", name=op.f("ck_memory_policy_actions_action")
        ),
        sa.ForeignKeyConstraint(
            ["company_id", "user_id"],
            ["memory_files.company_id", "memory_files.user_id"],
            name=op.f("fk_memory_policy_actions_company_id_user_id_memory_files"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("company_id", "id", name=op.f("pk_memory_policy_actions")),
    )
    op.create_index(
        "ix_memory_policy_actions_owner",
        "memory_policy_actions",
        ["company_id", "user_id", sa.literal_column("id DESC")],
        unique=False,
    )


def downgrade() -> None:
    op.execute("UPDATE memory_versions SET reason = 'truncation' WHERE reason = 'retention'")
    _reasons(OLD_REASONS)
    op.drop_index("ix_memory_policy_actions_owner", table_name="memory_policy_actions")
    op.drop_table("memory_policy_actions")
    op.drop_table("company_memory_policies")
