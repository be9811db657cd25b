"""The queue runs the kinds domains register: the database allows exactly the registered kinds,
and a claimed job whose kind has no handler is dead-lettered instead of looping."""

from __future__ import annotations

import re

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.jobs import repository as stored_jobs
from app.jobs.enqueue import NewJob, enqueue_job, registered_kinds
from app.jobs.worker import UNKNOWN_KIND_CLASS, Worker, WorkerConfig
from app.kit.observability import Metrics


async def test_the_database_allows_exactly_the_registered_kinds(engine: AsyncEngine) -> None:
    """The app (imported by the fixtures) has registered every domain's kinds."""
    async with engine.connect() as conn:
        definition = await conn.scalar(
            text(
                "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
                "WHERE conrelid = 'jobs'::regclass AND conname = 'ck_jobs_kind'"
            )
        )
    assert isinstance(definition, str)
    allowed = set(re.findall(r"'([a-z_]+)'::", definition))
    assert allowed == set(registered_kinds()) == {"consolidation", "condensation"}


async def test_a_job_without_a_handler_is_dead_lettered(
    engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession]
) -> None:
    async with sessions() as session, session.begin():
        job_id = await enqueue_job(
            session, "acme", "alice", NewJob("condensation", {"space_id": "space-1"}, 5)
        )

    async def consolidate(*_: object) -> str:
        raise AssertionError("only the condensation job is queued")

    config = WorkerConfig(concurrency=1, poll_seconds=0.05, lease_seconds=30, batch_size=1)
    worker = Worker(engine, {"consolidation": consolidate}, config, Metrics())
    assert await worker.run_once() is not None

    async with sessions() as session:
        job = await stored_jobs.get_job(session, "acme", "alice", job_id)
    assert (job.status, job.error_class, job.attempts) == ("dead", UNKNOWN_KIND_CLASS, 1)
