"""The claim on a Citus cluster (`claim_next_job` picks it when the database runs Citus): the
same guarantees as the single-node claim (`queue.PICK_OWNER`, `queue.TAKE_JOBS`), in statements
Citus can run.

Citus runs no recursive walk over a distributed table, no volatile function in an UPDATE's SET,
and splits a statement with modifying CTEs into steps; and a statement routed to one shard takes
its advisory locks on that shard's worker, a statement without a distributed table on the
coordinator. So:

1. `PICK_COMPANIES`: the companies with a claimable job, served least recently first (the fair
   order), at most `:companies` of them. It reads every company's shard: the one statement of
   the claim that does, lowered from the tests' multi-shard error (`across_companies`).
2. `PICK_OWNERS`, per company in that order, pinned to it: the owners of its oldest claimable
   jobs whose user holds no live lease, each by their oldest job.
3. `TRY_LOCK`, per owner in that order: the owner's advisory lock, in a statement without a
   distributed table, so on the coordinator for every claimer: one lock space for every worker
   process, and a user's jobs never run concurrently.
4. `TAKE_JOBS` (the single-node statement with the clock passed in and no upsert inside) pinned
   to the company and user, then `RECORD_SERVED`, the company's turn, pinned to the company.

The clock: `now()` of the transaction (or the caller's `now`) read once with the lock, then
passed to every statement, so a claim agrees with itself as the single-node claim does.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

import asyncpg

from app.jobs.claim_sql import PENDING, claimable, no_live_lease, take_jobs_sql
from app.jobs.driver import Statement
from app.kit.citus import ACROSS_COMPANIES_SQL, BACK_TO_ONE_COMPANY_SQL

COMPANIES_PER_LOOK: Final = 8


def _claimable(alias: str) -> str:
    return claimable(alias, ":clock")


def _no_live_lease(alias: str) -> str:
    return no_live_lease(alias, ":clock", ":company_id")


CLOCK: Final = Statement("SELECT coalesce(:now::timestamptz, now()) AS clock")

PICK_COMPANIES: Final = Statement(f"""
SELECT p.company_id
  FROM (SELECT DISTINCT j.company_id FROM jobs j
         WHERE j.{PENDING} AND {_claimable("j")}) p
  LEFT JOIN job_company_claims served ON served.company_id = p.company_id
 ORDER BY p.company_id = ANY(:passed_companies::text[]),
          served.last_claimed_at NULLS FIRST, p.company_id
 LIMIT :companies
""")  # noqa: S608 - composed of this module's constants only

PICK_OWNERS: Final = Statement(f"""
SELECT DISTINCT ON (w.user_id) w.user_id, w.created_at, w.id
  FROM (SELECT j.user_id, j.created_at, j.id FROM jobs j
         WHERE j.company_id = :company_id AND j.{PENDING}
           AND {_claimable("j")} AND {_no_live_lease("j")}
         ORDER BY j.created_at, j.id
         LIMIT :window) w
 ORDER BY w.user_id, w.created_at, w.id
""")  # noqa: S608 - composed of this module's constants only

TRY_LOCK: Final = Statement(
    "SELECT pg_try_advisory_xact_lock(hashtext(:namespace || :company_id), hashtext(:user_id))"
)

TAKE_JOBS: Final = Statement(take_jobs_sql(":clock", ":company_id", served=""))

RECORD_SERVED: Final = Statement("""
INSERT INTO job_company_claims AS c (company_id, last_claimed_at)
VALUES (:company_id, clock_timestamp())
    ON CONFLICT (company_id) DO UPDATE
   SET last_claimed_at = greatest(c.last_claimed_at, excluded.last_claimed_at)
""")


async def pick_companies(
    conn: asyncpg.Connection, clock: datetime, passed_companies: list[str]
) -> list[str]:
    """`PICK_COMPANIES`, the claim's one statement over every company's shard."""
    await conn.execute(ACROSS_COMPANIES_SQL)
    rows = await conn.fetch(
        PICK_COMPANIES.sql,
        *PICK_COMPANIES.args(
            clock=clock, passed_companies=passed_companies, companies=COMPANIES_PER_LOOK
        ),
    )
    await conn.execute(BACK_TO_ONE_COMPANY_SQL)
    return [row["company_id"] for row in rows]


async def pick_owners(
    conn: asyncpg.Connection, clock: datetime, company_id: str, window: int
) -> list[str]:
    """The company's candidate owners, by their oldest claimable job."""
    rows = await conn.fetch(
        PICK_OWNERS.sql,
        *PICK_OWNERS.args(clock=clock, company_id=company_id, window=window),
    )
    return [row["user_id"] for row in sorted(rows, key=lambda r: (r["created_at"], r["id"]))]


async def try_lock(conn: asyncpg.Connection, namespace: str, company_id: str, user_id: str) -> bool:
    return bool(
        await conn.fetchval(
            TRY_LOCK.sql,
            *TRY_LOCK.args(namespace=namespace, company_id=company_id, user_id=user_id),
        )
    )


async def clock_of(conn: asyncpg.Connection, now: datetime | None) -> datetime:
    clock: datetime = await conn.fetchval(CLOCK.sql, *CLOCK.args(now=now))
    return clock


async def take_jobs(conn: asyncpg.Connection, **values: object) -> list[asyncpg.Record]:
    """`TAKE_JOBS`, then the company's turn recorded when it took any."""
    rows: list[asyncpg.Record] = await conn.fetch(TAKE_JOBS.sql, *TAKE_JOBS.args(**values))
    if rows:
        await conn.execute(RECORD_SERVED.sql, *RECORD_SERVED.args(company_id=values["company_id"]))
    return rows
