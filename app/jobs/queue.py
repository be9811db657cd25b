"""The durable PostgreSQL job queue: what a job is, and claiming it under a lease, in fair order
across companies.

The queue knows jobs, not domains: a job is a `kind` (a name its producer and the worker's
handler agree on), an owner (company_id, user_id) and a payload of ids. All SQL over the `jobs`
table lives in this package (SQLAlchemy Core, and the claim's two statements as SQL sent on the
asyncpg connection, `driver.py`; no ORM objects are loaded): producers queue jobs
with `enqueue.py`, workers claim them here and finish them with `lifecycle.py`, and reads and
operator actions over stored jobs are in `repository.py`.

Clock: every timestamp is PostgreSQL's `now()` (the start of the current transaction), so workers
on hosts with skewed clocks agree on leases and `run_after`. Functions taking `now` use that
instant instead (tests step time with it). `created_at` is `clock_timestamp()`, so jobs enqueued
in one transaction keep their order, and so is the time a claim records its company as served
(see `claim_next_job`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal, cast

import asyncpg
from sqlalchemy import ColumnElement, Table, and_
from sqlalchemy.ext.asyncio import AsyncEngine

from app.jobs import claim_sql, cluster_claim
from app.jobs.driver import Statement, driver_transaction
from app.jobs.models import Job, JobCompanyClaim
from app.kit.citus import runs_citus

JobKind = str
"""The name of a kind of job; the worker runs each with the handler registered for it."""
JobStatus = Literal["queued", "running", "retrying", "succeeded", "dead"]
JobOutcome = Literal["noop", "updated"]
FailResult = Literal["retrying", "dead", "lease_lost"]
JobPayload = dict[str, str | list[str] | None]

PENDING_STATUSES: Final = ("queued", "retrying", "running")
WAITING_STATUSES: Final = ("queued", "retrying", "running", "dead")
LEASE_EXPIRED_CLASS: Final = "LeaseExpired"
LEASE_EXPIRED_MESSAGE: Final = "The worker lost its lease on the last attempt (stopped or hung)."

JOBS: Final = cast(Table, Job.__table__)
COMPANY_CLAIMS: Final = cast(Table, JobCompanyClaim.__table__)
LOCK_NAMESPACE: Final = "context-memory.jobs:"


@dataclass(frozen=True)
class JobRef:
    """One job of a claim. `attempts` already counts the attempt this claim started."""

    id: uuid.UUID
    payload: JobPayload
    attempts: int
    max_attempts: int
    created_at: datetime
    trace_context: tuple[str, ...] = ()
    """The `traceparent` of each request that queued the job or joined it (when sampled)."""


@dataclass(frozen=True)
class ClaimedJob:
    """What a worker holds: jobs of one user and kind, in created order, under one lease."""

    company_id: str
    user_id: str
    kind: JobKind
    lease_token: uuid.UUID
    jobs: tuple[JobRef, ...]

    @property
    def job_ids(self) -> list[uuid.UUID]:
        return [job.id for job in self.jobs]


# --- claim ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimPolicy:
    """How a worker claims: the lease it takes, and up to how many waiting jobs of one owner a
    claim of a kind in `coalesce` takes at once."""

    lease_seconds: float
    batch_size: int = 1
    coalesce: frozenset[JobKind] = frozenset()
    candidates: int = 8
    """How many of each company's oldest claimable jobs a claim reads its candidate owners from
    (see `PICK_OWNER`): about as many as claims may race, so that each finds an owner of its
    own in one look."""

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if self.candidates < 1:
            raise ValueError("candidates must be at least 1")


async def claim_next_job(
    engine: AsyncEngine, worker_id: str, policy: ClaimPolicy, *, now: datetime | None = None
) -> ClaimedJob | None:
    """Claim the next claimable job for `worker_id` in fair order across companies, coalesced
    with its owner's waiting jobs of the same kind when its kind is in `policy.coalesce`, in one
    short READ COMMITTED transaction of two statements. None when nothing is claimable.

    Claimable: `queued`/`retrying` with `run_after <= now`, or `running` with an expired lease
    (its worker died).

    Fair order: among the companies with a claimable job, the one served least recently (a
    company never served first), then that company's oldest claimable job, whoever its user. The
    claim records the company as served (`job_company_claims`) in the same transaction. So a
    company's backlog, however deep, delays another company's job by at most one claim per
    busy worker slot: the first claim to find the job waiting takes it, unless the backlog's
    company was served less recently, and then the claim after it does; claims racing it (each
    reads the order before the others commit) take at most one job of the backlog each. Two
    companies with backlogs alternate on one slot; on several, racing claims spread over both
    (see `PICK_OWNER`). A claim counts once however many jobs it coalesces. The time recorded is
    the database's `clock_timestamp()` at the claim, not `now`: fairness orders claims by when
    they really happened, even when tests step `now`.

    A user's jobs never run concurrently. Row locks (`SKIP LOCKED`) alone cannot ensure that:
    two workers may lock two *different* rows of one user, and neither sees the other's
    uncommitted claim in its `NOT EXISTS` check. So a claimer first takes a transaction-level
    advisory lock on (company_id, user_id) with `pg_try_advisory_xact_lock` (never waits; an
    owner whose lock is taken is passed over for the next candidate, in the same statement), and
    only then, in a *new* statement (`TAKE_JOBS`), hence a new READ COMMITTED snapshot,
    re-checks that the user has no job running under a live lease and locks their rows. Any
    claim that committed before our lock was granted is visible to that snapshot; none can
    commit while we hold it. The lock is released at commit, when our own `running` rows have
    become visible to others. The fair order itself is a plain read: a stale snapshot can only
    make two concurrent claimers try the same owner first, never break the per-user guarantee.

    The one wait a claim may meet is on its company's `job_company_claims` row, upserted by the
    second statement: a concurrent claim of the same company holds it until its commit, the
    next round trip. It cannot deadlock: a claim touches one such row, after every lock it
    takes without waiting.

    Coalescing: a claim of a kind in `policy.coalesce` absorbs the user's other claimable jobs of
    that kind in created order, up to `policy.batch_size` jobs in all, under the same lease. A
    job of any other kind is claimed alone. Every claimed job's `attempts` grows by one now. A
    job whose lease expired on its last attempt is dead-lettered (`LeaseExpired`) instead of
    run again.

    Both statements run on the engine's asyncpg connection as prepared statements, without
    SQLAlchemy's statement machinery (`app.jobs.driver`): the claim is the worker's most
    frequent statement pair.
    """
    if now is not None and now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    if await runs_citus(engine):
        return await _claim_on_cluster(engine, worker_id, policy, now=now)
    passed_companies: list[str] = []
    passed_users: list[str] = []
    async with driver_transaction(engine) as conn:
        while True:
            candidates = await conn.fetch(
                PICK_OWNER.sql,
                *PICK_OWNER.args(
                    now=now,
                    namespace=LOCK_NAMESPACE,
                    window=policy.candidates,
                    passed_companies=passed_companies,
                    passed_users=passed_users,
                ),
            )
            if not candidates:
                return None
            if candidates[0]["locked"]:
                claimed = await _take_jobs(
                    conn, candidates[0], now=now, worker_id=worker_id, policy=policy
                )
                if claimed is not None:
                    return claimed
                candidates = candidates[:1]
            # every candidate was taken by a racing claim (or claimed since our snapshot):
            # look again without them, their companies last
            passed_companies += [row["company_id"] for row in candidates]
            passed_users += [row["user_id"] for row in candidates]


_CLOCK = "coalesce(:now::timestamptz, now())"
"""PostgreSQL's `now()`, or the instant the caller passed (tests step time with it)."""
_PENDING = claim_sql.PENDING


def _claimable_sql(alias: str) -> str:
    return claim_sql.claimable(alias, _CLOCK)


def _no_live_lease_sql(alias: str) -> str:
    return claim_sql.no_live_lease(alias, _CLOCK, f"{alias}.company_id")


PICK_OWNER: Final = Statement(f"""
WITH RECURSIVE pending_companies(company_id) AS (
    SELECT (SELECT min(walked.company_id) FROM jobs walked WHERE walked.{_PENDING})
  UNION ALL
    SELECT (SELECT min(following.company_id) FROM jobs following
             WHERE following.{_PENDING} AND following.company_id > c.company_id)
      FROM pending_companies c WHERE c.company_id IS NOT NULL
),
heads AS (
    SELECT c.company_id, h.user_id, h.created_at, h.id,
           row_number() OVER (PARTITION BY c.company_id ORDER BY h.created_at, h.id) AS turn
      FROM pending_companies c
     CROSS JOIN LATERAL (
        SELECT DISTINCT ON (w.user_id) w.user_id, w.created_at, w.id
          FROM (SELECT j.user_id, j.created_at, j.id FROM jobs j
                 WHERE j.company_id = c.company_id AND j.{_PENDING}
                   AND {_claimable_sql("j")} AND {_no_live_lease_sql("j")}
                   AND NOT EXISTS (
                       SELECT FROM unnest(:passed_companies::text[], :passed_users::text[])
                                AS passed(company_id, user_id)
                        WHERE passed.company_id = j.company_id AND passed.user_id = j.user_id)
                 ORDER BY j.created_at, j.id
                 LIMIT :window) w
         ORDER BY w.user_id, w.created_at, w.id
     ) h
),
candidates AS MATERIALIZED (
    SELECT heads.company_id, heads.user_id
      FROM heads
      LEFT JOIN job_company_claims served ON served.company_id = heads.company_id
     ORDER BY heads.company_id = ANY(:passed_companies::text[]), heads.turn,
              served.last_claimed_at NULLS FIRST, heads.created_at, heads.id
),
chosen AS MATERIALIZED (
    SELECT company_id, user_id FROM candidates
     WHERE pg_try_advisory_xact_lock(hashtext(:namespace || company_id), hashtext(user_id))
     LIMIT 1
)
SELECT company_id, user_id, true AS locked FROM chosen
UNION ALL
SELECT company_id, user_id, false FROM candidates WHERE NOT EXISTS (SELECT FROM chosen)
""")  # noqa: S608 - composed of this module's constants only
"""The claim's first statement: the candidate owners in fair order, and the first of them whose
advisory lock this transaction could take, locked. One row, `locked`, or, when a racing claim
holds every candidate's lock, all of them, not locked. Never more than one lock is taken: the
candidates are materialized in order, and the lock is tried on each in turn only until one is
granted (`LIMIT 1` over a CTE scan stops there).

Candidates: a recursive walk of the distinct companies with pending jobs along
`ix_jobs_pending_company` (one index probe per company, whatever their backlogs); in each
company, the owners of its oldest `:window` claimable jobs whose user holds no live lease (a
short ordered scan of the same index), each by their oldest job. Their order: every company's
first owner, the company served least recently first, then every company's second owner, and
so on. So slots that finish together spread over the companies, then over each company's
owners, instead of all trying the same owner and querying again: the first takes the company
due next, the second the company after it (or, with one company, its next owner). Owners an
earlier look of this claim passed over are left out and their companies go last.

A plain read (no row locks): its snapshot may be stale; `TAKE_JOBS` re-checks."""


TAKE_JOBS: Final = Statement(
    claim_sql.take_jobs_sql(_CLOCK, "j.company_id", claim_sql.RECORD_SERVED_CTE)
)
"""The claim's second statement, for the owner whose lock the first one took: dead-letter the
owner's jobs whose lease expired on their last attempt (a poison job could otherwise kill
workers forever), lock the owner's oldest claimable job (none while the owner holds a live
lease) and, for a kind that coalesces, up to `:more` more of the same kind, take them under
a new lease, and record the company as served (never moved back by a claim that waited on its
row while a later one committed). Every part sees the same snapshot, taken after the lock:
the jobs it dead-letters are left out of the ones it takes."""


async def _take_jobs(
    conn: asyncpg.Connection,
    owner: asyncpg.Record,
    *,
    now: datetime | None,
    worker_id: str,
    policy: ClaimPolicy,
) -> ClaimedJob | None:
    """`TAKE_JOBS` for the owner `PICK_OWNER` locked; None when the owner has nothing
    claimable any more (claimed since that statement's snapshot)."""
    company_id, user_id = owner["company_id"], owner["user_id"]
    token = uuid.uuid4()
    rows = await conn.fetch(
        TAKE_JOBS.sql,
        *TAKE_JOBS.args(
            now=now,
            company_id=company_id,
            user_id=user_id,
            **_lease_values(policy, worker_id, token),
        ),
    )
    return _claimed(company_id, user_id, token, rows)


def _lease_values(policy: ClaimPolicy, worker_id: str, token: uuid.UUID) -> dict[str, object]:
    """`TAKE_JOBS`' values besides the clock and the owner, on one node or a cluster."""
    return {
        "lease_expired_class": LEASE_EXPIRED_CLASS,
        "lease_expired_message": LEASE_EXPIRED_MESSAGE,
        "coalesce": sorted(policy.coalesce),
        "more": policy.batch_size - 1,
        "lease_token": token,
        "lease_seconds": policy.lease_seconds,
        "worker_id": worker_id[:128],
    }


def _claimed(
    company_id: str, user_id: str, token: uuid.UUID, rows: list[asyncpg.Record]
) -> ClaimedJob | None:
    if not rows:
        return None
    refs = tuple(
        JobRef(
            row["id"],
            row["payload"],
            row["attempts"],
            row["max_attempts"],
            row["created_at"],
            tuple(row["trace_context"] or ()),
        )
        for row in rows
    )
    return ClaimedJob(company_id, user_id, rows[0]["kind"], token, refs)


async def _claim_on_cluster(
    engine: AsyncEngine, worker_id: str, policy: ClaimPolicy, *, now: datetime | None
) -> ClaimedJob | None:
    """`claim_next_job` on a Citus cluster (`app/jobs/cluster_claim.py`): the companies in fair
    order, in each its candidate owners oldest job first, the first whose lock (on the
    coordinator) this transaction takes and who still has a claimable job is claimed."""
    passed_companies: list[str] = []
    async with driver_transaction(engine) as conn:
        clock = await cluster_claim.clock_of(conn, now)
        while companies := await cluster_claim.pick_companies(conn, clock, passed_companies):
            for company_id in companies:
                owners = await cluster_claim.pick_owners(conn, clock, company_id, policy.candidates)
                for user_id in owners:
                    if not await cluster_claim.try_lock(conn, LOCK_NAMESPACE, company_id, user_id):
                        continue
                    token = uuid.uuid4()
                    rows = await cluster_claim.take_jobs(
                        conn,
                        clock=clock,
                        company_id=company_id,
                        user_id=user_id,
                        **_lease_values(policy, worker_id, token),
                    )
                    claimed = _claimed(company_id, user_id, token, rows)
                    if claimed is not None:
                        return claimed
            if set(companies) <= set(passed_companies):
                return None
            passed_companies += companies
    return None


def claimable(clock: ColumnElement[datetime]) -> ColumnElement[bool]:
    waiting = and_(JOBS.c.status.in_(("queued", "retrying")), JOBS.c.run_after <= clock)
    abandoned = and_(JOBS.c.status == "running", JOBS.c.lease_expires_at < clock)
    return waiting | abandoned
