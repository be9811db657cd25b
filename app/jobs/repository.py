"""Reading and operating on stored jobs: a user's own job, the operator's listing and retry of
dead letters, the opt-out's and the erasure's deletes, and the queue statistics behind the
metrics gauges.

The worker's side of the queue (enqueue, claim, heartbeat, finish) lives in `queue.py`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict

from sqlalchemy import Row, case, delete, func, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from app.jobs.errors import JobNotDead, JobNotFound
from app.jobs.queue import (
    JOBS,
    PENDING_STATUSES,
    WAITING_STATUSES,
    JobKind,
    JobOutcome,
    JobPayload,
    JobStatus,
    claimable,
)
from app.kit.citus import across_companies
from app.kit.pagination import Page, PageRequest, page_of


@dataclass(frozen=True)
class JobRow:
    """A job as stored (its payload holds ids only)."""

    company_id: str
    id: uuid.UUID
    user_id: str
    kind: JobKind
    status: JobStatus
    payload: JobPayload
    attempts: int
    max_attempts: int
    run_after: datetime
    outcome: JobOutcome | None
    version: int | None
    error_class: str | None
    error_message: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None


class QueueStats(TypedDict):
    depth: dict[str, int]  # jobs per status in WAITING_STATUSES (zeros included)
    oldest_age_seconds: float  # how long the most overdue claimable job has waited; 0 if none


def _job_row(row: Row[Any]) -> JobRow:
    fields = row._mapping
    return JobRow(**{name: fields[name] for name in JobRow.__dataclass_fields__})


async def get_job(
    session: AsyncSession, company_id: str, user_id: str, job_id: uuid.UUID
) -> JobRow:
    """One of the user's own jobs; anybody else's is a 404."""
    row = (
        await session.execute(
            select(JOBS).where(
                JOBS.c.company_id == company_id, JOBS.c.user_id == user_id, JOBS.c.id == job_id
            )
        )
    ).first()
    if row is None:
        raise JobNotFound
    return _job_row(row)


async def list_jobs(
    session: AsyncSession, company_id: str, status: JobStatus | None, page: PageRequest
) -> Page[JobRow]:
    """A company's jobs, newest first, paged by (created_at, id)."""
    query = select(JOBS).where(JOBS.c.company_id == company_id)
    if status is not None:
        query = query.where(JOBS.c.status == status)
    created_at, job_id = page.instant("created_at"), page.uuid("id")
    if created_at is not None and job_id is not None:
        query = query.where(tuple_(JOBS.c.created_at, JOBS.c.id) < (created_at, job_id))
    query = query.order_by(JOBS.c.created_at.desc(), JOBS.c.id.desc()).limit(page.limit + 1)
    rows = [_job_row(row) for row in await session.execute(query)]
    return page_of(
        rows, page.limit, lambda job: {"created_at": job.created_at.isoformat(), "id": str(job.id)}
    )


async def retry_dead_job(session: AsyncSession, company_id: str, job_id: uuid.UUID) -> JobRow:
    """Operator retry of a dead-lettered job: queued again now, with a fresh attempt budget."""
    retried = (
        await session.execute(
            update(JOBS)
            .where(JOBS.c.company_id == company_id, JOBS.c.id == job_id, JOBS.c.status == "dead")
            .values(
                status="queued",
                attempts=0,
                run_after=func.now(),
                outcome=None,
                version=None,
                error_class=None,
                error_message=None,
                lease_token=None,
                lease_expires_at=None,
                locked_by=None,
                finished_at=None,
                updated_at=func.now(),
            )
            .returning(*JOBS.c)
        )
    ).first()
    if retried is not None:
        return _job_row(retried)
    status = await session.scalar(
        select(JOBS.c.status).where(JOBS.c.company_id == company_id, JOBS.c.id == job_id)
    )
    if status is None:
        raise JobNotFound
    raise JobNotDead(status)


async def delete_user_jobs(session: AsyncSession, company_id: str, user_id: str) -> int:
    """Opt-out: delete the user's pending jobs (a running one's worker is then fenced out)."""
    deleted = await session.execute(
        delete(JOBS)
        .where(JOBS.c.company_id == company_id, JOBS.c.user_id == user_id)
        .where(JOBS.c.status.in_(PENDING_STATUSES))
        .returning(JOBS.c.id)
    )
    return len(deleted.all())


async def delete_every_user_job(session: AsyncSession, company_id: str, user_id: str) -> int:
    """Erasure: delete all the user's jobs, finished ones included (a running one's worker is
    then fenced out: its heartbeat and completion find no job holding its lease)."""
    deleted = await session.execute(
        delete(JOBS)
        .where(JOBS.c.company_id == company_id, JOBS.c.user_id == user_id)
        .returning(JOBS.c.id)
    )
    return len(deleted.all())


async def queue_stats(engine: AsyncEngine) -> QueueStats:
    """Depth by status and the wait of the most overdue claimable job, for the metrics gauges
    `queue_depth` and `queue_oldest_age_seconds`."""
    due_since = case((JOBS.c.status == "running", JOBS.c.lease_expires_at), else_=JOBS.c.run_after)
    # gauges of the whole instance for /metrics: every company's jobs
    async with engine.connect() as conn, across_companies(conn):
        counts = await conn.execute(
            select(JOBS.c.status, func.count())
            .where(JOBS.c.status.in_(WAITING_STATUSES))
            .group_by(JOBS.c.status)
        )
        depth = dict.fromkeys(WAITING_STATUSES, 0) | {str(s): int(n) for s, n in counts}
        oldest = await conn.scalar(
            select(func.extract("epoch", func.now() - func.min(due_since))).where(
                claimable(func.now())
            )
        )
    return QueueStats(depth=depth, oldest_age_seconds=max(float(oldest or 0), 0.0))
