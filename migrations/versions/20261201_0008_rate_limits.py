"""Rate-limit overrides per company.

`company_rate_limits`: one row per company an operator gave other rate limits than the
service's defaults (audited): per route class, per scope (`user`, `company`), a limit
`"QUOTA/WINDOW_SECONDS"` or `"off"`, as a JSON object; a class or scope left out keeps the
default. Who saved it last is (company, user), as on the other company settings.

Downgrade drops the table: every company is back at the defaults.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 19:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "company_rate_limits",
        sa.Column("company_id", sa.String(length=128), nullable=False),
        sa.Column("limits", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("updated_by_company_id", sa.String(length=128), nullable=False),
        sa.Column("updated_by", sa.String(length=256), nullable=False),
        sa.CheckConstraint(
            "jsonb_typeof(limits) = 'object'", name=op.f("ck_company_rate_limits_limits_object")
        ),
        sa.PrimaryKeyConstraint("company_id", name=op.f("pk_company_rate_limits")),
    )


def downgrade() -> None:
    op.drop_table("company_rate_limits")
