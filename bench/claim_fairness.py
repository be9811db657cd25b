"""The queue's claim under one company's flood: claim latency with a large backlog of one
company, the plan of the claim's owner query, and how many of the flooding company's jobs are
claimed before another company's fresh job.

    .venv/bin/python bench/claim_fairness.py [--backlog 5000] [--users 1000] [--busy 2]
        [--claims 200] [--batch-size 1] [--others 1] [--finished 50000]

With the admin connection DATABASE_URL (default postgresql://postgres@127.0.0.1:5432/postgres)
it creates a scratch database `cms_claim_bench_<random>`, migrates it and drops it at the end.
Company `flood-co` gets `--backlog` queued jobs spread round robin over `--users` users, inserted
with one SQL statement, as old as those of `--others` companies `other-co-N` with 3 jobs each;
50,000 (`--finished`) succeeded jobs make the history a live queue keeps, and `ANALYZE jobs`
runs. `--busy` worker slots are simulated by claims held under a live lease: each
measured claim (`claim_next_job`, the worker's own call) is timed, then the oldest held claim is
completed, so `--busy` jobs stay running. After the first claims, `fresh-co` queues one job; the
report counts the flood's claims between that job and the claim that takes it. Then
`EXPLAIN (ANALYZE, BUFFERS)` of the owner query of a claim, captured as the app sends it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy import event, make_url, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.jobs.lifecycle import complete_jobs
from app.jobs.queue import ClaimedJob, ClaimPolicy, claim_next_job
from app.kit.config import to_asyncpg_url
from app.kit.db.migrations import run_migrations

DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
FLOOD, OTHER, FRESH = "flood-co", "other-co", "fresh-co"
FRESH_AFTER = 20
"""The fresh company's job is queued after this many measured claims."""

FLOOD_SQL = """
INSERT INTO jobs (company_id, id, user_id, kind, status, payload, attempts, max_attempts,
                  run_after, created_at)
SELECT :company, gen_random_uuid(), 'user-' || (g % :users), 'consolidation', 'queued',
       '{}'::jsonb, 0, 5, clock_timestamp() - make_interval(secs => :age_seconds),
       clock_timestamp() - make_interval(secs => :age_seconds) + g * interval '1 microsecond'
FROM generate_series(1, :count) AS g
"""
FINISHED_SQL = """
INSERT INTO jobs (company_id, id, user_id, kind, status, payload, attempts, max_attempts,
                  outcome, created_at, finished_at)
SELECT CASE WHEN g % 10 = 0 THEN :flood ELSE 'done-' || (g % 50) END, gen_random_uuid(),
       'user-' || (g % 997), 'consolidation', 'succeeded', '{}'::jsonb, 1, 5, 'noop',
       now() - interval '2 days', now() - interval '1 day'
FROM generate_series(1, :count) AS g
"""


@dataclass
class Run:
    latencies_ms: list[float] = field(default_factory=list)
    served: list[str] = field(default_factory=list)
    fresh_at: int | None = None
    owner_plan: list[str] = field(default_factory=list)

    def flood_before_fresh(self) -> int | None:
        """The flood's claims after the fresh job was queued, before the claim that took it."""
        if self.fresh_at is None or FRESH not in self.served[self.fresh_at :]:
            return None
        return self.served[self.fresh_at :].index(FRESH)


async def queue_jobs(
    engine: AsyncEngine, company: str, users: int, count: int, age_seconds: float = 0.0
) -> None:
    """`count` queued jobs of `company`, created `age_seconds` ago one microsecond apart."""
    params = {"company": company, "users": users, "count": count, "age_seconds": age_seconds}
    async with engine.begin() as conn:
        await conn.execute(text(FLOOD_SQL), params)


async def measure(engine: AsyncEngine, args: argparse.Namespace) -> Run:
    await queue_jobs(engine, FLOOD, args.users, args.backlog, age_seconds=3600)
    for number in range(args.others):
        await queue_jobs(engine, f"{OTHER}-{number}", 3, 3, age_seconds=3600)
    async with engine.begin() as conn:  # the history a live queue keeps: finished jobs
        await conn.execute(text(FINISHED_SQL), {"count": args.finished, "flood": FLOOD})
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.execute(text("ANALYZE jobs"))
    policy = ClaimPolicy(lease_seconds=300, batch_size=args.batch_size)
    run = Run()
    held: deque[ClaimedJob] = deque()
    for number in range(args.claims):
        if number == FRESH_AFTER:
            await queue_jobs(engine, FRESH, 1, 1)
            run.fresh_at = len(run.served)
        started = time.perf_counter()
        claimed = await claim_next_job(engine, f"bench-{number % max(args.busy, 1)}", policy)
        run.latencies_ms.append((time.perf_counter() - started) * 1000)
        if claimed is None:  # every claimable user is busy: a slot finishes, then claims again
            if not held:
                break
            async with engine.begin() as conn:
                await complete_jobs(conn, held.popleft(), outcome="noop", version=None)
            continue
        run.served.append(claimed.company_id)
        held.append(claimed)
        while len(held) > args.busy:
            async with engine.begin() as conn:
                await complete_jobs(conn, held.popleft(), outcome="noop", version=None)
    run.owner_plan = await explain_owner_query(engine, policy)
    return run


async def explain_owner_query(engine: AsyncEngine, policy: ClaimPolicy) -> list[str]:
    """The plan of the first statement of one more claim (the owner query), as the claim sent
    it on the asyncpg connection (its query logger), run again under EXPLAIN with the same
    parameters once the claim has committed."""
    sent: list[tuple[str, tuple[Any, ...]]] = []
    logged: list[Any] = []

    def record(query: Any) -> None:
        sent.append((query.query, tuple(query.args)))

    def log(_connection: Any, connection_record: Any, _proxy: Any) -> None:
        connection_record.driver_connection.add_query_logger(record)
        logged.append(connection_record.driver_connection)

    event.listen(engine.sync_engine.pool, "checkout", log)
    try:
        await claim_next_job(engine, "bench-explain", policy)
    finally:
        event.remove(engine.sync_engine.pool, "checkout", log)
        for driver in logged:
            driver.remove_query_logger(record)
    statement, parameters = next(
        (query, args) for query, args in sent if "pending_companies" in query
    )
    async with engine.connect() as conn:
        result = await conn.exec_driver_sql("EXPLAIN (ANALYZE, BUFFERS) " + statement, parameters)
        return [str(row[0]) for row in result]


def report(run: Run, args: argparse.Namespace) -> str:
    latencies = sorted(run.latencies_ms)
    p95 = latencies[max(int(len(latencies) * 0.95) - 1, 0)]
    lines = [
        f"backlog {args.backlog} jobs of {FLOOD} over {args.users} users, busy slots {args.busy},"
        f" batch size {args.batch_size}",
        f"claims {len(latencies)}: median {statistics.median(latencies):.2f} ms,"
        f" p95 {p95:.2f} ms, max {latencies[-1]:.2f} ms",
        f"{FRESH}'s job queued before claim #{run.fresh_at}; flood claims before it was taken:"
        f" {run.flood_before_fresh()}",
        "served, claim by claim from the fresh job: "
        + " ".join(company.split("-")[0] for company in run.served[run.fresh_at or 0 :][:12]),
        "owner query plan:",
        *("    " + line for line in run.owner_plan),
    ]
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> None:
    admin_url = os.environ.get("DATABASE_URL", DEFAULT_ADMIN_URL)
    name = f"cms_claim_bench_{uuid.uuid4().hex[:8]}"
    admin_dsn = make_url(admin_url).set(drivername="postgresql").render_as_string(False)
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    url = make_url(to_asyncpg_url(admin_url)).set(database=name)
    database_url = url.render_as_string(hide_password=False)
    try:
        await asyncio.to_thread(run_migrations, database_url)
        engine = create_async_engine(database_url, pool_size=max(args.busy, 1) + 2)
        try:
            print(report(await measure(engine, args), args))
        finally:
            await engine.dispose()
    finally:
        admin = await asyncpg.connect(admin_dsn)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--backlog", type=int, default=5000)
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--busy", type=int, default=2)
    parser.add_argument("--claims", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--others", type=int, default=1, help="companies with 3 jobs each")
    parser.add_argument(
        "--finished",
        type=int,
        default=20000,
        help="succeeded jobs of 50 companies, the flood's among them",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
