"""The job queue below HTTP: enqueue jobs, claim them as a worker would, and read a job's row."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any

from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.jobs.enqueue import NewJob, enqueue_job
from app.jobs.queue import ClaimedJob, ClaimPolicy, JobKind, claim_next_job
from tests.helpers.apps import COMPANY, SPACE
from tests.helpers.db import rows

LEASE = 60
COALESCING = frozenset({"consolidation"})  # as the consolidation domain registers it


async def enqueue(
    sessions: async_sessionmaker[AsyncSession],
    user: str = "alice",
    *,
    company: str = COMPANY,
    kind: JobKind = "consolidation",
    max_attempts: int = 5,
    count: int = 1,
    payload: Mapping[str, Any] | None = None,
) -> list[uuid.UUID]:
    """`count` jobs for the user in one transaction; without `payload`, each names a turn of
    its own."""
    async with sessions() as session, session.begin():
        return [
            await enqueue_job(
                session,
                company,
                user,
                NewJob(
                    kind,
                    dict(payload)
                    if payload is not None
                    else {"turn_ids": [str(uuid.uuid4())], "space_id": SPACE, "model": None},
                    max_attempts,
                ),
            )
            for _ in range(count)
        ]


async def claim(
    engine: AsyncEngine,
    *,
    worker: str = "w1",
    batch_size: int = 10,
    lease: float = LEASE,
    now: datetime | None = None,
    coalesce: Collection[JobKind] = COALESCING,
) -> ClaimedJob | None:
    return await claim_next_job(
        engine, worker, ClaimPolicy(lease, batch_size, frozenset(coalesce)), now=now
    )


async def claim_one(
    engine: AsyncEngine,
    *,
    worker: str = "w1",
    batch_size: int = 10,
    lease: float = LEASE,
    now: datetime | None = None,
    coalesce: Collection[JobKind] = COALESCING,
) -> ClaimedJob:
    claimed = await claim(
        engine, worker=worker, batch_size=batch_size, lease=lease, now=now, coalesce=coalesce
    )
    assert claimed is not None
    return claimed


async def job_row(app: FastAPI, job_id: uuid.UUID) -> Any:
    """The job's status, outcome and error, with the database's `now()` as `db_now`."""
    (row,) = await rows(
        app,
        "SELECT status, outcome, version, error_class, error_message, attempts, run_after,"
        " now() AS db_now FROM jobs WHERE company_id = 'acme' AND id = :id",
        id=job_id,
    )
    return row
