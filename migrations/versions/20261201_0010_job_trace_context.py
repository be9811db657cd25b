"""A job keeps the trace context of the turns that queued it: `jobs.trace_context`.

A nullable `text[]` of W3C `traceparent` values: the turn that queued the job, then each turn
coalesced into it, in order, written by the same statement that writes the turn and only when
that turn's trace was sampled (NULL otherwise, and for every job queued before). The worker's
span of the run links to each (`app/jobs/worker.py`). Ids and flags only, never user text.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 22:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("trace_context", postgresql.ARRAY(sa.Text()), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "trace_context")
