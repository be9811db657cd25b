"""Actors carry their company: audit events and the last editor of flags and spaces.

A user id names a person only within its company, and an operator of one company changes the
flags of others, so an actor is (company, user id). `audit_events.actor_company_id` joins
`actor_id`, and `updated_by_company_id` joins `updated_by` on `company_feature_flags` and
`space_settings`; `ix_audit_events_actor` serves the erasure, which finds a user's events by
actor in every company's log.

Backfill: existing rows get the best value available, the row's own `company_id`; nothing else
recorded the actor's company. That is right for every row but a flag's (users change their own
setting, space admins their own company's spaces, an erasure is the user's own). A flag, or its
`feature_flag.set` event, changed by an operator of another company is attributed to the changed
company: the erasure treated those rows so until now, and still does.

Downgrade drops the three columns and the index: actors are user ids alone again.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 14:30:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (table, the new column naming the company of the actor its row names)
ACTOR_COMPANIES: Sequence[tuple[str, str]] = (
    ("audit_events", "actor_company_id"),
    ("company_feature_flags", "updated_by_company_id"),
    ("space_settings", "updated_by_company_id"),
)


def upgrade() -> None:
    for table, column in ACTOR_COMPANIES:
        op.add_column(table, sa.Column(column, sa.String(length=128), nullable=True))
        rows = sa.table(table, sa.column("company_id"), sa.column(column))
        op.execute(rows.update().values({column: rows.c.company_id}))
        op.alter_column(table, column, existing_type=sa.String(length=128), nullable=False)
    op.create_index(
        "ix_audit_events_actor",
        "audit_events",
        ["actor_company_id", "actor_id"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index("ix_audit_events_actor", table_name="audit_events")
    for table, column in ACTOR_COMPANIES:
        op.drop_column(table, column)
