"""Fair claims across companies against real PostgreSQL and the real worker: one company's flood
of 5,000 queued jobs delays another company's fresh job by at most one claim per busy slot, two
busy companies alternate, and fairness never lets one user's jobs run concurrently."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.jobs.lifecycle import complete_jobs
from app.jobs.queue import COMPANY_CLAIMS, JOBS, ClaimedJob
from app.jobs.worker import Worker, WorkerConfig
from app.kit.observability import Metrics
from tests.helpers.db import admin_session
from tests.helpers.jobs import COALESCING, claim, claim_one, enqueue
from tests.helpers.worker import wait_for

FLOOD, FRESH, LATE = "flood-co", "fresh-co", "late-co"
BACKLOG = 5000

FLOOD_SQL = text("""
INSERT INTO jobs (company_id, id, user_id, kind, status, payload, attempts, max_attempts,
                  run_after, created_at)
SELECT :company, gen_random_uuid(), 'user-' || (g % :users), 'consolidation', 'queued',
       '{}'::jsonb, 0, 5, now() - interval '1 hour',
       now() - make_interval(mins => :minutes_ago) + g * interval '1 millisecond'
FROM generate_series(1, :count) AS g
""")


async def flood(
    engine: AsyncEngine,
    company: str = FLOOD,
    *,
    count: int = BACKLOG,
    users: int = 1000,
    minutes_ago: int = 60,
) -> None:
    """`count` queued jobs of `company` over `users` users, due and created `minutes_ago`, in
    one statement."""
    params = {"company": company, "count": count, "users": users, "minutes_ago": minutes_ago}
    async with engine.begin() as conn:
        await conn.execute(FLOOD_SQL, params)


class HeldJobs:
    """A job handler for a real `Worker` that records every claim in order and keeps its slot
    busy until the test releases it; then it completes the claim as a real handler does."""

    def __init__(self, engine: AsyncEngine, *, hold: bool = True) -> None:
        self.engine = engine
        self.claims: list[ClaimedJob] = []
        self._released = 0
        self._open = not hold
        self._changed = asyncio.Condition()

    @property
    def companies(self) -> list[str]:
        return [claimed.company_id for claimed in self.claims]

    async def run(self, claimed: ClaimedJob, lease_lost: asyncio.Event) -> str:
        self.claims.append(claimed)
        async with self._changed:
            await self._changed.wait_for(lambda: self._open or self._released > 0)
            if not self._open:
                self._released -= 1
        async with self.engine.begin() as conn:
            assert await complete_jobs(conn, claimed, outcome="noop", version=None)
        return "noop"

    async def release(self, slots: int) -> None:
        """Let `slots` held claims finish (their slots then claim again)."""
        async with self._changed:
            self._released += slots
            self._changed.notify_all()

    async def open(self) -> None:
        async with self._changed:
            self._open = True
            self._changed.notify_all()

    async def claimed(self, count: int) -> None:
        async def enough() -> bool:
            return len(self.claims) >= count

        await wait_for(enough, seconds=20)


@asynccontextmanager
async def running_worker(engine: AsyncEngine, held: HeldJobs, slots: int) -> AsyncIterator[None]:
    """A real worker with `slots` slots running `held` for every job; stopped at the end."""
    config = WorkerConfig(
        concurrency=slots,
        poll_seconds=0.05,
        lease_seconds=30,
        batch_size=10,
        shutdown_grace_seconds=5,
        coalesce=COALESCING,
        worker_id="fair-worker",
    )
    worker = Worker(engine, {"consolidation": held.run}, config, Metrics())
    task = asyncio.create_task(worker.run())
    try:
        yield
    finally:
        worker.stop()
        await held.open()
        await task


async def running_owners(engine: AsyncEngine) -> Counter[tuple[str, str]]:
    async with admin_session(engine) as session:
        found = await session.execute(
            select(JOBS.c.company_id, JOBS.c.user_id, func.count())
            .where(JOBS.c.status == "running")
            .group_by(JOBS.c.company_id, JOBS.c.user_id)
        )
        return Counter({(company, user): int(n) for company, user, n in found})


@pytest.mark.parametrize("served_before", [False, True], ids=["new-company", "served-before"])
@pytest.mark.parametrize("slots", [1, 3])
async def test_a_fresh_job_is_claimed_next_whatever_another_companys_backlog(
    engine: AsyncEngine,
    sessions: async_sessionmaker[AsyncSession],
    slots: int,
    served_before: bool,
) -> None:
    if served_before:  # the fresh company was served before the flood's claims began
        await enqueue(sessions, "bob", company=FRESH)
        done = await claim_one(engine)
        assert done.company_id == FRESH
        async with engine.begin() as conn:
            assert await complete_jobs(conn, done, outcome="noop", version=None)
    await flood(engine)
    held = HeldJobs(engine)
    async with running_worker(engine, held, slots):
        await held.claimed(slots)
        assert held.companies == [FLOOD] * slots  # every slot busy with the flood

        [fresh] = await enqueue(sessions, "bob", company=FRESH)
        await held.release(1)  # one slot frees: its next claim is the fresh job
        await held.claimed(slots + 1)
        assert (held.companies[slots], held.claims[slots].job_ids) == (FRESH, [fresh])

        # every slot frees at once: their claims race, and the late company's job is among
        # them (the others may take the flood's jobs, at most one each)
        [late] = await enqueue(sessions, "carol", company=LATE)
        await held.release(slots)
        await held.claimed(2 * slots + 1)
        racing = held.claims[slots + 1 : 2 * slots + 1]
        assert [c.job_ids for c in racing if c.company_id == LATE] == [[late]]
        assert Counter(c.company_id for c in racing)[FLOOD] == slots - 1

    async with admin_session(engine) as session:
        found = await session.execute(
            select(COMPANY_CLAIMS.c.company_id, COMPANY_CLAIMS.c.last_claimed_at)
        )
        served: dict[str, datetime] = dict(found.all())
    assert set(served) == {FLOOD, FRESH, LATE}
    assert served[LATE] > served[FRESH]


async def test_a_company_served_since_the_backlogs_last_claim_waits_one_claim(
    engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession]
) -> None:
    await flood(engine, count=50, users=50)
    assert (await claim_one(engine)).company_id == FLOOD
    await enqueue(sessions, "bob", company=FRESH)
    assert (await claim_one(engine)).company_id == FRESH  # never served: first
    [again] = await enqueue(sessions, "carol", company=FRESH)
    # the flood's company was served less recently than the fresh one: one claim, then ours
    assert (await claim_one(engine)).company_id == FLOOD
    assert (await claim_one(engine)).job_ids == [again]


async def test_two_busy_companies_alternate_on_one_slot(engine: AsyncEngine) -> None:
    await flood(engine, count=BACKLOG)
    # the second company's jobs are all newer than every one of the flood's
    await flood(engine, "second-co", count=300, users=300, minutes_ago=30)
    held = HeldJobs(engine, hold=False)
    async with running_worker(engine, held, slots=1):
        await held.claimed(20)
    assert held.companies[:20] == [FLOOD, "second-co"] * 10


async def test_two_busy_companies_share_several_slots_without_a_pack(engine: AsyncEngine) -> None:
    """Slots that finish together race for the same company; the ones that lose its owner's
    lock turn to the other company, so neither settles into a pack (which gave one company
    two claims of every three, 50 of 150). Three slots split 150 claims about 60/40 on this
    machine (the less served company got 56-64 in eight runs), not evenly: the bound sits
    between that and a pack, over enough claims that a run's spread does not cross it."""
    slots, claims = 3, 150
    await flood(engine, count=BACKLOG)
    await flood(engine, "second-co", count=300, users=300, minutes_ago=30)
    held = HeldJobs(engine, hold=False)
    async with running_worker(engine, held, slots):
        await held.claimed(claims)
    served = Counter(held.companies[:claims])
    assert min(served[FLOOD], served["second-co"]) >= claims * 7 // 20, served


async def test_fair_order_never_runs_one_users_jobs_concurrently(
    engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """Claimers race through three companies' jobs (several per user, no coalescing), holding
    each claim a moment: no claim ever returns a user whose other claim is still held, the
    database never shows one user running twice, and every job is claimed exactly once."""
    expected: set[uuid.UUID] = set()
    for company, users in (("big-co", 6), ("mid-co", 3), ("one-co", 1)):
        for n in range(users):
            expected |= set(await enqueue(sessions, f"user-{n}", company=company, count=4))
    held_owners: set[tuple[str, str]] = set()
    taken: list[uuid.UUID] = []
    overlaps: list[tuple[str, str]] = []
    twice_in_db: list[Counter[tuple[str, str]]] = []

    async def slot(worker: str) -> None:
        idle = 0
        while idle < 20:
            claimed = await claim(engine, worker=worker, batch_size=1)
            if claimed is None:
                idle += 1
                await asyncio.sleep(0.01)
                continue
            idle = 0
            owner = (claimed.company_id, claimed.user_id)
            if owner in held_owners:
                overlaps.append(owner)
            held_owners.add(owner)
            taken.extend(claimed.job_ids)
            running = await running_owners(engine)
            if any(n > 1 for n in running.values()):
                twice_in_db.append(running)
            await asyncio.sleep(random.uniform(0, 0.005))
            held_owners.discard(owner)
            async with engine.begin() as conn:
                assert await complete_jobs(conn, claimed, outcome="noop", version=None)

    await asyncio.gather(*(slot(f"w{n}") for n in range(6)))
    assert overlaps == []
    assert twice_in_db == []
    assert sorted(taken) == sorted(expected)  # each exactly once
