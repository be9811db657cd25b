"""The job queue against real PostgreSQL: leases and fencing, retries with backoff, dead letters,
per-user serialization under concurrent claimers, coalescing, release, and SKIP LOCKED."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.jobs import repository as jobs
from app.jobs.enqueue import NewJob, enqueue_job
from app.jobs.lifecycle import (
    BACKOFF_CAP_SECONDS,
    AttemptFailure,
    backoff_seconds,
    complete_jobs,
    fail_jobs,
    heartbeat,
    release_jobs,
)
from app.jobs.queue import JOBS
from app.kit.errors import Conflict, NotFound
from tests.helpers.apps import COMPANY
from tests.helpers.db import admin_session
from tests.helpers.jobs import LEASE, claim, claim_one, enqueue
from tests.helpers.polling import wait_until


async def db_now(engine: AsyncEngine) -> datetime:
    async with engine.connect() as conn:
        value: datetime = (await conn.execute(select(text("now()")))).scalar_one()
    return value


async def job(engine: AsyncEngine, job_id: uuid.UUID) -> dict[str, Any]:
    async with admin_session(engine) as session:
        row = (await session.execute(select(JOBS).where(JOBS.c.id == job_id))).one()
    return dict(row._mapping)


async def clear_jobs(engine: AsyncEngine) -> None:
    async with admin_session(engine) as session, session.begin():
        await session.execute(JOBS.delete())


async def test_enqueue_claim_complete(
    engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession]
) -> None:
    [job_id] = await enqueue(sessions)
    assert (await job(engine, job_id))["status"] == "queued"

    claimed = await claim_one(engine)
    assert (claimed.company_id, claimed.user_id, claimed.kind) == (
        COMPANY,
        "alice",
        "consolidation",
    )
    assert [ref.id for ref in claimed.jobs] == [job_id]
    assert claimed.jobs[0].attempts == 1  # counted at claim time
    assert claimed.jobs[0].payload["space_id"] == "space-1"
    running = await job(engine, job_id)
    assert running["status"] == "running"
    assert running["lease_token"] == claimed.lease_token
    assert running["locked_by"] == "w1"
    assert await claim(engine) is None  # nothing else to claim

    async with engine.begin() as conn:
        assert await complete_jobs(conn, claimed, outcome="updated", version=3)
    done = await job(engine, job_id)
    assert (done["status"], done["outcome"], done["version"]) == ("succeeded", "updated", 3)
    assert done["finished_at"] is not None
    assert done["lease_token"] is None
    assert not await heartbeat(engine, claimed, LEASE)  # a finished job has no lease to extend


async def test_enqueue_refuses_text_in_the_payload(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    async with sessions() as session, session.begin():
        with pytest.raises(ValueError, match="ids only"):
            await enqueue_job(
                session,
                COMPANY,
                "alice",
                NewJob("consolidation", {"note": "I live in Berlin\nand I love cats"}, 5),
            )


async def test_enqueue_joins_the_callers_transaction(
    engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession]
) -> None:
    async with sessions() as session:
        await session.begin()
        job_id = await enqueue_job(session, COMPANY, "alice", NewJob("consolidation", {}, 5))
        await session.rollback()
    async with admin_session(engine) as check:
        assert (await check.execute(select(JOBS.c.id).where(JOBS.c.id == job_id))).first() is None


@pytest.mark.parametrize(
    ("attempts", "ceiling"),
    [(1, 2.0), (2, 4.0), (3, 8.0), (6, 64.0), (8, 256.0), (9, 300.0), (50, 300.0)],
)
def test_backoff_ceiling_grows_exponentially_to_the_cap(attempts: int, ceiling: float) -> None:
    assert backoff_seconds(attempts, jitter=1.0) == ceiling
    assert backoff_seconds(attempts, jitter=0.0) == 0.0
    assert 0.0 <= backoff_seconds(attempts) <= ceiling  # full jitter


def test_backoff_honours_retry_after() -> None:
    assert backoff_seconds(1, retry_after_seconds=30, jitter=0.0) == 30.0
    assert backoff_seconds(9, retry_after_seconds=30, jitter=1.0) == 300.0
    assert backoff_seconds(1, retry_after_seconds=3600, jitter=0.0) == BACKOFF_CAP_SECONDS


async def test_retryable_failure_backs_off_and_grows_then_dead_letters(
    engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession]
) -> None:
    [job_id] = await enqueue(sessions, max_attempts=4)
    now = await db_now(engine)
    for attempt in (1, 2, 3):
        claimed = await claim_one(engine, now=now)
        assert claimed.jobs[0].attempts == attempt
        result = await fail_jobs(
            engine,
            claimed,
            AttemptFailure("ModelTimeout", "The model did not answer in time.", True),
            now=now,
        )
        assert result == "retrying"
        row = await job(engine, job_id)
        assert row["status"] == "retrying"
        assert row["lease_token"] is None
        delay = row["run_after"] - now
        assert timedelta(0) <= delay <= timedelta(seconds=2.0 * 2 ** (attempt - 1))
        assert await claim(engine, now=now) is None  # not due yet
        now = row["run_after"] + timedelta(microseconds=1)

    claimed = await claim_one(engine, now=now)
    assert claimed.jobs[0].attempts == 4
    result = await fail_jobs(
        engine,
        claimed,
        AttemptFailure("ModelTimeout", "The model did not answer in time.", True),
        now=now,
    )
    assert result == "dead"
    dead = await job(engine, job_id)
    assert (dead["status"], dead["attempts"]) == ("dead", 4)
    assert (dead["error_class"], dead["error_message"]) == (
        "ModelTimeout",
        "The model did not answer in time.",
    )
    assert dead["finished_at"] is not None
    assert await claim(engine, now=now + timedelta(days=1)) is None


async def test_retry_after_is_honoured(
    engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession]
) -> None:
    [job_id] = await enqueue(sessions)
    now = await db_now(engine)
    claimed = await claim_one(engine, now=now)
    result = await fail_jobs(
        engine, claimed, AttemptFailure("RateLimited", "The model answered 429.", True, 30), now=now
    )
    assert result == "retrying"
    delay = (await job(engine, job_id))["run_after"] - now
    assert timedelta(seconds=30) <= delay <= timedelta(seconds=BACKOFF_CAP_SECONDS)


async def test_non_retryable_failure_dead_letters_at_once_with_a_bounded_message(
    engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession]
) -> None:
    [job_id] = await enqueue(sessions)
    claimed = await claim_one(engine)
    result = await fail_jobs(
        engine,
        claimed,
        AttemptFailure(
            "MalformedOutput", "The model output was not valid JSON.\n" + "x" * 600, False
        ),
    )
    assert result == "dead"
    dead = await job(engine, job_id)
    assert dead["status"] == "dead"
    assert dead["attempts"] == 1
    message = str(dead["error_message"])
    assert len(message) == 512
    assert "\n" not in message


async def test_error_class_must_be_an_identifier(
    engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession]
) -> None:
    await enqueue(sessions)
    claimed = await claim_one(engine)
    with pytest.raises(ValueError, match="identifier"):
        await fail_jobs(engine, claimed, AttemptFailure("my name is Bob", "x", False))


async def test_operator_retry_requeues_a_dead_job(
    engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession]
) -> None:
    [job_id] = await enqueue(sessions)
    [other_id] = await enqueue(sessions, "bob")
    claimed = await claim_one(engine)
    await fail_jobs(engine, claimed, AttemptFailure("Refused", "Refused.", False))
    async with sessions() as session, session.begin():
        with pytest.raises(NotFound):
            await jobs.retry_dead_job(session, "other-co", job_id)
        with pytest.raises(NotFound):
            await jobs.retry_dead_job(session, COMPANY, uuid.uuid4())
        with pytest.raises(Conflict):
            await jobs.retry_dead_job(session, COMPANY, other_id)  # queued, not dead
        retried = await jobs.retry_dead_job(session, COMPANY, job_id)
    assert (retried.status, retried.attempts, retried.error_class) == ("queued", 0, None)
    again = await claim_one(engine)
    assert [ref.id for ref in again.jobs] == [job_id]
    assert again.jobs[0].attempts == 1


async def test_expired_lease_is_reclaimed_and_the_old_holder_is_fenced_out(
    engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession]
) -> None:
    [job_id] = await enqueue(sessions)
    now = await db_now(engine)
    first = await claim_one(engine, worker="w1", now=now)
    assert await heartbeat(engine, first, LEASE, now=now)
    assert await claim(engine, worker="w2", now=now + timedelta(seconds=LEASE - 1)) is None

    later = now + timedelta(seconds=LEASE + 1)
    second = await claim_one(engine, worker="w2", now=later)
    assert [ref.id for ref in second.jobs] == [job_id]
    assert second.jobs[0].attempts == 2
    assert second.lease_token != first.lease_token

    assert not await heartbeat(engine, first, LEASE, now=later)
    async with engine.begin() as conn:
        assert not await complete_jobs(conn, first, outcome="updated", version=7)
    result = await fail_jobs(engine, first, AttemptFailure("ModelTimeout", "Timeout.", True))
    assert result == "lease_lost"
    assert await release_jobs(engine, first) == 0
    row = await job(engine, job_id)
    assert (row["status"], row["lease_token"], row["version"]) == (
        "running",
        second.lease_token,
        None,
    )
    async with engine.begin() as conn:
        assert await complete_jobs(conn, second, outcome="noop", version=None)


async def test_a_real_short_lease_expires(
    engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession]
) -> None:
    await enqueue(sessions)
    first = await claim_one(engine, lease=0.2)
    # the real clock, the database's: claimable again as soon as the lease has run out
    second = await wait_until(lambda: claim(engine, worker="w2"), 10, what="the lease to run out")
    assert second.jobs[0].id == first.jobs[0].id
    assert not await heartbeat(engine, first, LEASE)


async def test_an_expired_lease_on_the_last_attempt_dead_letters_the_job(
    engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession]
) -> None:
    [job_id] = await enqueue(sessions, max_attempts=1)
    now = await db_now(engine)
    await claim_one(engine, now=now)
    assert await claim(engine, now=now + timedelta(seconds=LEASE + 1)) is None
    dead = await job(engine, job_id)
    assert (dead["status"], dead["error_class"]) == ("dead", "LeaseExpired")


async def test_a_live_lease_blocks_the_users_other_jobs(
    engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession]
) -> None:
    await enqueue(sessions, count=2)
    first = await claim_one(engine, batch_size=1)
    assert await claim(engine, batch_size=1) is None
    async with engine.begin() as conn:
        assert await complete_jobs(conn, first, outcome="noop", version=None)
    assert await claim(engine, batch_size=1) is not None


async def test_lost_lease_on_one_job_fences_the_whole_completion(
    engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession]
) -> None:
    ids = await enqueue(sessions, count=2)
    claimed = await claim_one(engine)
    async with sessions() as session, session.begin():
        assert await jobs.delete_user_jobs(session, COMPANY, "bob") == 0
    async with admin_session(engine) as session, session.begin():  # one of the two vanished
        await session.execute(JOBS.delete().where(JOBS.c.id == ids[1]))  # (say, by an operator)
    async with engine.begin() as conn:
        assert not await complete_jobs(conn, claimed, outcome="updated", version=1)
    assert (await job(engine, ids[0]))["status"] == "running"  # nothing written


async def test_coalescing_claims_a_users_jobs_together_in_created_order(
    engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession]
) -> None:
    ids = await enqueue(sessions, count=5)  # one transaction: created order still kept
    [condensation] = await enqueue(sessions, kind="condensation")
    claimed = await claim_one(engine, batch_size=10)
    assert [ref.id for ref in claimed.jobs] == ids
    assert all(ref.attempts == 1 for ref in claimed.jobs)

    assert await release_jobs(engine, claimed) == 5
    for job_id in ids:
        row = await job(engine, job_id)
        assert (row["status"], row["attempts"], row["lease_token"]) == ("queued", 0, None)

    bounded = await claim_one(engine, batch_size=3)
    assert [ref.id for ref in bounded.jobs] == ids[:3]
    async with engine.begin() as conn:
        assert await complete_jobs(conn, bounded, outcome="updated", version=1)
    rest = await claim_one(engine, batch_size=3)
    assert [ref.id for ref in rest.jobs] == ids[3:]
    async with engine.begin() as conn:
        assert await complete_jobs(conn, rest, outcome="noop", version=None)
    alone = await claim_one(engine, batch_size=3)
    assert (alone.kind, [ref.id for ref in alone.jobs]) == ("condensation", [condensation])


async def test_release_after_a_failure_goes_back_to_retrying(
    engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession]
) -> None:
    [job_id] = await enqueue(sessions)
    now = await db_now(engine)
    claimed = await claim_one(engine, now=now)
    await fail_jobs(engine, claimed, AttemptFailure("E", "e", True), now=now)
    later = now + timedelta(seconds=BACKOFF_CAP_SECONDS)
    again = await claim_one(engine, now=later)
    assert again.jobs[0].attempts == 2
    assert await release_jobs(engine, again) == 1
    row = await job(engine, job_id)
    assert (row["status"], row["attempts"]) == ("retrying", 1)


async def test_two_claimers_never_take_two_jobs_of_one_user(
    engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession]
) -> None:
    for _ in range(20):
        await enqueue(sessions, "a", count=2)
        await enqueue(sessions, "b")
        claims = await asyncio.gather(
            claim(engine, worker="w1", batch_size=1), claim(engine, worker="w2", batch_size=1)
        )
        users = sorted(c.user_id for c in claims if c is not None)
        assert users == ["a", "b"]
        await clear_jobs(engine)


async def test_five_claimers_take_each_user_once(
    engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession]
) -> None:
    for _ in range(20):
        await enqueue(sessions, "a", count=2)
        await enqueue(sessions, "b")
        claims = await asyncio.gather(
            *(claim(engine, worker=f"w{n}", batch_size=1) for n in range(5))
        )
        users = Counter(c.user_id for c in claims if c is not None)
        assert users == Counter({"a": 1, "b": 1})
        await clear_jobs(engine)


async def test_skip_locked_claims_every_job_exactly_once(
    engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession]
) -> None:
    expected = {job_id for n in range(10) for job_id in await enqueue(sessions, f"user-{n}")}

    async def drain(worker: str) -> list[uuid.UUID]:
        taken: list[uuid.UUID] = []
        while (claimed := await claim(engine, worker=worker)) is not None:
            taken += claimed.job_ids
        return taken

    results = await asyncio.gather(*(drain(f"w{n}") for n in range(4)))
    taken = [job_id for result in results for job_id in result]
    assert sorted(taken) == sorted(expected)  # each exactly once
    assert await claim(engine) is None


async def test_delete_user_jobs_removes_pending_jobs_only(
    engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession]
) -> None:
    [done] = await enqueue(sessions)
    claimed = await claim_one(engine)
    async with engine.begin() as conn:
        await complete_jobs(conn, claimed, outcome="noop", version=None)
    await enqueue(sessions, count=2)
    running = await claim_one(engine, batch_size=1)
    [bobs] = await enqueue(sessions, "bob")
    async with sessions() as session, session.begin():
        assert await jobs.delete_user_jobs(session, COMPANY, "alice") == 2
    assert not await heartbeat(engine, running, LEASE)  # the running worker is fenced out
    async with admin_session(engine) as session:
        left = set((await session.execute(select(JOBS.c.id))).scalars())
    assert left == {done, bobs}


async def test_queue_stats_report_depth_and_oldest_wait(
    engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession]
) -> None:
    empty = await jobs.queue_stats(engine)
    assert empty == {
        "depth": {"queued": 0, "retrying": 0, "running": 0, "dead": 0},
        "oldest_age_seconds": 0.0,
    }
    [old] = await enqueue(sessions, "a")
    await enqueue(sessions, "b", count=2)
    async with admin_session(engine) as session, session.begin():
        await session.execute(
            update(JOBS)
            .where(JOBS.c.id == old)
            .values(run_after=text("now() - interval '90 seconds'"))
        )
    waiting = await jobs.queue_stats(engine)
    assert waiting["depth"] == {"queued": 3, "retrying": 0, "running": 0, "dead": 0}
    assert 90 <= waiting["oldest_age_seconds"] < 120
    await claim_one(engine, batch_size=1)  # takes "a"'s job (the most overdue)
    stats = await jobs.queue_stats(engine)
    assert stats["depth"] == {"queued": 2, "retrying": 0, "running": 1, "dead": 0}
    assert 0.0 <= stats["oldest_age_seconds"] < 90
