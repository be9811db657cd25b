"""The one statement that finishes a worker's run (`FINISH_STATEMENTS`): the claim's completion
with the run's count and, after a version was written, retention riding along. It runs in
autocommit after a NOOP, so the riders must write nothing when the lease was lost."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, date, datetime, timedelta

import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker

from app.consolidation.pipeline import FINISH_STATEMENTS
from app.folders import service as folders
from app.jobs.lifecycle import complete_jobs
from app.jobs.queue import JOBS, ClaimedJob
from app.kit.principal import Principal
from app.profiles import repository as profiles
from app.profiles import service as profile_service
from app.profiles.document import Frontmatter, Profile, Section
from app.profiles.versions import ExpectedHead, VersionPolicy, VersionSource, stamp
from app.usage.repository import COUNTS, counts_params
from tests.helpers.apps import COMPANY
from tests.helpers.db import admin_session
from tests.helpers.jobs import LEASE, claim_one, enqueue
from tests.helpers.profiles import STORED_COUNTER

DAY = date(2026, 6, 17)
ALICE = Principal(user_id="alice", company_id=COMPANY, roles=frozenset())
KEEP = 2


@pytest.fixture
async def autocommit(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    async with engine.connect() as conn:
        yield await conn.execution_options(isolation_level="AUTOCOMMIT")


async def five_versions(sessions: async_sessionmaker[AsyncSession]) -> None:
    async with sessions() as session, session.begin():
        folder_id, _ = await folders.ensure_user_folder(session, ALICE)
        await profile_service.ensure_memory_file(session, COMPANY, "alice", folder_id)
    for n in range(5):
        profile = Profile.from_sections(Frontmatter(user_id="alice"), {Section.WORK: (f"f{n}",)})
        async with sessions() as session, session.begin():
            await profiles.write_version(
                session,
                ExpectedHead(COMPANY, "alice", n),
                stamp(profile, user_id="alice", now=datetime.now(UTC), turn_count=n),
                source=VersionSource("user_edit"),
                tokens=5,
            )


async def counted(engine: AsyncEngine) -> dict[str, int]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(COUNTS.c.counter, COUNTS.c.count.label("n")).where(
                COUNTS.c.company_id == COMPANY
            )
        )
        return {row.counter: row.n for row in rows}


async def versions(engine: AsyncEngine) -> list[int]:
    async with admin_session(engine) as session:
        rows = await session.execute(
            text("SELECT version FROM memory_versions WHERE user_id = 'alice' ORDER BY version")
        )
        return [row.version for row in rows]


def riders(claimed: ClaimedJob, *, retention: bool) -> dict[str, object]:
    counts = {
        (COMPANY, DAY, "consolidations_updated"): 1,
        (COMPANY, DAY, "consolidations_offline"): 1,
    }
    params = counts_params(counts)
    if retention:
        head = ExpectedHead(claimed.company_id, claimed.user_id, 5)
        params |= profile_service.retention_params(head, VersionPolicy(STORED_COUNTER, keep=KEEP))
    return params


async def finish(
    conn: AsyncConnection, claimed: ClaimedJob, *, written: bool, retention: bool
) -> bool:
    """`complete_jobs` as the pipeline finishes a run: `written` a version (outcome and
    version), with or without `retention` riding along."""
    return await complete_jobs(
        conn,
        claimed,
        outcome="updated" if written else "noop",
        version=5 if written else None,
        statement=FINISH_STATEMENTS[retention],
        riders=riders(claimed, retention=retention),
    )


async def test_a_held_claim_is_completed_counted_and_pruned_in_one_statement(
    engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession], autocommit: AsyncConnection
) -> None:
    await five_versions(sessions)
    [job_id] = await enqueue(sessions)
    claimed = await claim_one(engine)

    assert await finish(autocommit, claimed, written=True, retention=True)
    async with admin_session(engine) as session:
        job = (await session.execute(select(JOBS).where(JOBS.c.id == job_id))).one()
    assert (job.status, job.outcome, job.version) == ("succeeded", "updated", 5)
    assert await counted(engine) == {"consolidations_updated": 1, "consolidations_offline": 1}
    assert await versions(engine) == [4, 5]


@pytest.mark.parametrize("retention", [False, True])
async def test_a_lost_lease_writes_nothing_not_even_the_riders(
    engine: AsyncEngine,
    sessions: async_sessionmaker[AsyncSession],
    autocommit: AsyncConnection,
    retention: bool,
) -> None:
    await five_versions(sessions)
    await enqueue(sessions)
    async with engine.connect() as conn:
        now = (await conn.execute(select(text("now()")))).scalar_one()
    first = await claim_one(engine, worker="w1", now=now)
    second = await claim_one(engine, worker="w2", now=now + timedelta(seconds=LEASE + 1))

    assert not await finish(autocommit, first, written=True, retention=retention)
    assert await counted(engine) == {}
    assert await versions(engine) == [1, 2, 3, 4, 5]
    assert await finish(autocommit, second, written=False, retention=False)
    assert await counted(engine) == {"consolidations_updated": 1, "consolidations_offline": 1}


async def test_a_rider_parameter_named_as_a_job_column_is_refused(
    engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession], autocommit: AsyncConnection
) -> None:
    await enqueue(sessions)
    claimed = await claim_one(engine)
    for name in ("company_id", "held_ids"):
        with pytest.raises(ValueError, match="apart"):
            await complete_jobs(
                autocommit,
                claimed,
                outcome="noop",
                version=None,
                statement=FINISH_STATEMENTS[False],
                riders={name: "x"},
            )
    async with admin_session(engine) as session:
        status = (await session.execute(select(JOBS.c.status))).scalar_one()
    assert status == "running"
