"""The company registry, the platform log and company offboardings.

`companies`: one row per company the service serves (registered by a platform operator, by the
company's own operators' first call, or by an import), a company table (first key column
`company_id`, distributed on Citus, erased with the company).

`platform_events` and `company_offboardings`: platform tables naming their company in
`subject_company`, with no `company_id` column, so that they survive the company's offboarding
(reference tables on Citus). At most one unfinished offboarding per company.

Companies that hold data already are not registered here: their operators' first write
registers them (`first_use`), or a platform operator does.

Downgrade drops the three tables: the registry, the log and the receipts are gone.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07 00:40:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_NOW = sa.text("now()")


def upgrade() -> None:
    op.create_table(
        "companies",
        sa.Column("company_id", sa.String(length=128), nullable=False),
        sa.Column("display_name", sa.String(length=200), nullable=False),
        sa.Column("origin", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=_NOW, nullable=False),
        sa.CheckConstraint(
            "origin IN ('operator', 'first_use', 'import')", name=op.f("ck_companies_origin")
        ),
        sa.PrimaryKeyConstraint("company_id", name=op.f("pk_companies")),
    )
    op.create_table(
        "platform_events",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("occurred_at", sa.DateTime(timezone=True), server_default=_NOW, nullable=False),
        sa.Column("subject_company", sa.String(length=128), nullable=False),
        sa.Column("actor_company_id", sa.String(length=128), nullable=False),
        sa.Column("actor_id", sa.String(length=256), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("detail", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_platform_events")),
    )
    op.create_index(
        "ix_platform_events_subject_company_id",
        "platform_events",
        ["subject_company", "id"],
        unique=False,
    )
    op.create_index(
        "ix_platform_events_actor",
        "platform_events",
        ["actor_company_id", "actor_id"],
        unique=False,
    )
    op.create_table(
        "company_offboardings",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("subject_company", sa.String(length=128), nullable=False),
        sa.Column(
            "status", sa.String(length=16), server_default=sa.text("'queued'"), nullable=False
        ),
        sa.Column("requested_at", sa.DateTime(timezone=True), server_default=_NOW, nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "erased",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("passes", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'done')", name=op.f("ck_company_offboardings_status")
        ),
        sa.CheckConstraint(
            "jsonb_typeof(erased) = 'object'", name=op.f("ck_company_offboardings_erased_object")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_company_offboardings")),
    )
    op.create_index(
        "uq_company_offboardings_unfinished",
        "company_offboardings",
        ["subject_company"],
        unique=True,
        postgresql_where=sa.text("status <> 'done'"),
    )
    op.create_index(
        "ix_company_offboardings_subject_company",
        "company_offboardings",
        ["subject_company", "requested_at"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_table("company_offboardings")
    op.drop_table("platform_events")
    op.drop_table("companies")
