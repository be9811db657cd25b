"""The claim's index serves the claim only: `ix_jobs_claimable` gains `run_after IS NOT NULL`.

`ix_jobs_claimable` (waiting jobs by `run_after`) and `ix_jobs_waiting_owner` (an owner's waiting
jobs of a kind) had the same predicate, so every query of waiting jobs could use either. After a
VACUUM or ANALYZE that found the queue empty (a worker that keeps up leaves it so), the planner
believes both partial indexes empty, costs them alike, and took the older one for the turn-save's
count of the user's waiting jobs: a scan of every waiting job of every company, filtered by
owner, on every turn-save. Under a backlog (a slow model, a stopped worker) a turn-save then cost
more with every job queued. The claim compares `run_after` with a strict operator, which implies
`run_after IS NOT NULL`, so it still proves the new predicate; the count of an owner's waiting
jobs does not, and can only use the owner's index. `run_after` is NOT NULL: the index holds the
same rows as before.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06 04:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_jobs_claimable"
WAITING = "status IN ('queued', 'retrying')"


def _recreate(predicate: str) -> None:
    op.drop_index(INDEX, table_name="jobs")
    op.create_index(INDEX, "jobs", ["run_after"], postgresql_where=sa.text(predicate))


def upgrade() -> None:
    _recreate(f"{WAITING} AND run_after IS NOT NULL")


def downgrade() -> None:
    _recreate(WAITING)
