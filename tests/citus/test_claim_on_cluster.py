"""The claim on the Citus cluster with two worker processes' worth of claimers: two `Worker`s,
each with an engine of its own (its own connections to the coordinator, as two `python -m app
worker` processes have) and two slots, claiming concurrently from several companies through
`app/jobs/cluster_claim.py`, as the service's role (a multi-shard statement is an error).

Each run is recorded with the test's clock: from the moment its slot starts it to the moment
before it commits its jobs done (its jobs stay `running`, under a live lease, until that commit:
no other claim may take its user before). So one user's runs never overlapping is what the
per-user lock must guarantee, measured with a margin in its favour of nothing."""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from itertools import pairwise

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.jobs.lifecycle import complete_jobs
from app.jobs.queue import ClaimedJob
from app.jobs.worker import JobHandler, Worker, WorkerConfig
from app.kit.config import Settings
from app.kit.db.engine import create_database
from app.kit.observability import Metrics
from tests.helpers.db import admin_fetchval
from tests.helpers.jobs import COALESCING, enqueue
from tests.helpers.polling import wait_until

pytestmark = pytest.mark.slow

WORKERS = 2
SLOTS = 2  # per worker
DEEP, SMALL = "deep-co", ("small-co-1", "small-co-2", "small-co-3")
DEEP_USERS, JOBS_PER_USER = 6, 8
BEFORE_THE_SMALL_ONES = 2 * WORKERS * SLOTS  # claims of the backlog before the small jobs come
DONE_SECONDS = 90.0


@dataclass(frozen=True)
class Run:
    worker: str
    company: str
    user: str
    jobs: tuple[uuid.UUID, ...]
    started: float
    ended: float


@dataclass
class Runs:
    """The handler of every worker: each run recorded, held a few milliseconds (the job's work),
    then its jobs completed in the worker's own engine."""

    started: list[tuple[str, str]] = field(default_factory=list)  # (company, user) in order
    runs: list[Run] = field(default_factory=list)

    def handler(self, worker: str, engine: AsyncEngine) -> JobHandler:
        async def run(claimed: ClaimedJob, lease_lost: asyncio.Event) -> str:
            started = time.monotonic()
            self.started.append((claimed.company_id, claimed.user_id))
            await asyncio.sleep(random.uniform(0.005, 0.03))  # the job's work
            ended = time.monotonic()  # still running under its lease: before the commit
            self.runs.append(
                Run(
                    worker,
                    claimed.company_id,
                    claimed.user_id,
                    tuple(claimed.job_ids),
                    started,
                    ended,
                )
            )
            async with engine.begin() as conn:
                assert await complete_jobs(conn, claimed, outcome="noop", version=None)
            return "noop"

        return run

    def done(self) -> set[uuid.UUID]:
        return {job for run in self.runs for job in run.jobs}


@asynccontextmanager
async def claiming(settings: Settings, runs: Runs) -> AsyncIterator[None]:
    """`WORKERS` workers of `SLOTS` slots, each on an engine of its own, until the block ends."""
    async with AsyncExitStack() as stack:
        workers = []
        for n in range(WORKERS):
            database = create_database(str(settings.database_url), settings, pool_size=SLOTS + 1)
            stack.push_async_callback(database.dispose)
            config = WorkerConfig(
                concurrency=SLOTS,
                poll_seconds=0.05,
                lease_seconds=30,
                batch_size=1,  # a claim per job: the backlog is many claims
                shutdown_grace_seconds=5,
                coalesce=COALESCING,
                worker_id=f"cluster-worker-{n}",
            )
            handler = runs.handler(config.worker_id, database.engine)
            workers.append(Worker(database.engine, {"consolidation": handler}, config, Metrics()))
        tasks = [asyncio.create_task(worker.run()) for worker in workers]
        try:
            yield
        finally:
            for worker in workers:
                worker.stop()
            await asyncio.gather(*tasks)


def overlaps(runs: list[Run]) -> list[tuple[Run, Run]]:
    """Pairs of one user's runs that overlapped in time."""
    by_user: dict[tuple[str, str], list[Run]] = defaultdict(list)
    for run in runs:
        by_user[(run.company, run.user)].append(run)
    found = []
    for own in by_user.values():
        own.sort(key=lambda run: run.started)
        found += [(a, b) for a, b in pairwise(own) if b.started < a.ended]
    return found


async def test_two_workers_claim_each_job_once_one_user_at_a_time_fairly(
    settings: Settings,
    sessions: async_sessionmaker[AsyncSession],
    admin_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A company with a deep backlog over six users, then three small companies with one job
    each once the backlog is being claimed: every job runs once, no user's runs overlap, the two
    workers both claim, and each small company's job is claimed within the claims racing it
    (one per slot of both workers) and those of the other small companies."""
    expected: set[uuid.UUID] = set()
    for n in range(DEEP_USERS):
        expected |= set(await enqueue(sessions, f"user-{n}", company=DEEP, count=JOBS_PER_USER))
    runs = Runs()
    caplog.set_level(logging.ERROR, logger="app.worker")
    began = time.monotonic()
    async with claiming(settings, runs):
        await wait_until(lambda: len(runs.started) >= BEFORE_THE_SMALL_ONES, DONE_SECONDS)
        mark = len(runs.started)
        for company in SMALL:
            expected |= set(await enqueue(sessions, "user-0", company=company))
        await wait_until(
            lambda: runs.done() >= expected,
            DONE_SECONDS,
            what=lambda: f"every job run ({len(runs.done())} of {len(expected)})",
        )
    assert not [r for r in caplog.records if r.name == "app.worker"], caplog.text
    ran = [job for run in runs.runs for job in run.jobs]
    assert sorted(ran) == sorted(expected)  # each exactly once
    assert overlaps(runs.runs) == []
    assert {run.worker for run in runs.runs} == {f"cluster-worker-{n}" for n in range(WORKERS)}
    after = [company for company, _ in runs.started[mark:]]
    bound = WORKERS * SLOTS + len(SMALL) - 1
    waited = {company: after.index(company) for company in SMALL}
    print(
        f"claims on the cluster: {len(runs.runs)} jobs by {WORKERS} workers of {SLOTS} slots in"
        f" {runs.runs[-1].ended - began:.1f} s; claims before each small company's job after it"
        f" was queued: {sorted(waited.values())} (bound {bound})"
    )
    for company, claims in waited.items():
        assert claims <= bound, (company, after[: bound + 3])
    succeeded = await admin_fetchval(
        admin_url, "SELECT count(*) FROM jobs WHERE status = 'succeeded' AND attempts = 1"
    )
    assert succeeded == len(expected)
