"""The durable PostgreSQL job queue: what a job is, and claiming it under a lease, in fair order
across companies.

The queue knows jobs, not domains: a job is a `kind` (a name its producer and the worker's
handler agree on), an owner (company_id, user_id) and a payload of ids. All SQL over the `jobs`
table lives in this package (SQLAlchemy Core; no ORM objects are loaded): producers queue jobs
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
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Literal, cast

from sqlalchemy import (
    ColumnElement,
    DateTime,
    FromClause,
    Table,
    and_,
    exists,
    func,
    literal,
    literal_column,
    select,
    true,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.jobs.models import Job, JobCompanyClaim

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

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")


async def claim_next_job(
    engine: AsyncEngine, worker_id: str, policy: ClaimPolicy, *, now: datetime | None = None
) -> ClaimedJob | None:
    """Claim the next claimable job for `worker_id` in fair order across companies, coalesced
    with its owner's waiting jobs of the same kind when its kind is in `policy.coalesce`, in one
    short READ COMMITTED transaction. None when nothing is claimable.

    Claimable: `queued`/`retrying` with `run_after <= now`, or `running` with an expired lease
    (its worker died).

    Fair order: among the companies with a claimable job, the one served least recently (a
    company never served first), then that company's oldest claimable job, whoever its user. The
    claim records the company as served (`job_company_claims`) in the same transaction. So a
    company's backlog, however deep, delays another company's job by at most one claim per
    busy worker slot: the first claim to find the job waiting takes it, unless the backlog's
    company was served less recently, and then the claim after it does; claims racing it (each
    reads the order before the others commit) take at most one job of the backlog each. Two
    companies with backlogs alternate on one slot; on several, racing claims may serve one of
    them a few times in a row, but each keeps close to half of the claims (see `_next_owner`).
    A claim counts once however many jobs it coalesces. The time recorded is the database's
    `clock_timestamp()` at the claim, not `now`: fairness orders claims by when they really
    happened, even when tests step `now`.

    A user's jobs never run concurrently. Row locks (`SKIP LOCKED`) alone cannot ensure that:
    two workers may lock two *different* rows of one user, and neither sees the other's
    uncommitted claim in its `NOT EXISTS` check. So a claimer first takes a transaction-level
    advisory lock on (company_id, user_id) with `pg_try_advisory_xact_lock` (never waits; a user
    whose lock is taken is passed over: the fair order is read again without them, their company
    last), and only then, in a *new* statement, hence a new READ COMMITTED snapshot, re-checks
    that the user has no job running under a live lease and locks their rows. Any claim that
    committed before our lock was granted is visible to that snapshot; none can commit while we
    hold it. The lock is released at commit, when our own `running` rows have become visible to
    others.
    The fair order itself is a plain read: a stale snapshot can only make two concurrent
    claimers pick the same company, never break the per-user guarantee.

    The one wait a claim may meet is on its company's `job_company_claims` row, upserted last:
    a concurrent claim of the same company holds it until its commit. It cannot deadlock: a
    claim touches one such row, after every lock it takes without waiting.

    Coalescing: a claim of a kind in `policy.coalesce` absorbs the user's other claimable jobs of
    that kind in created order, up to `policy.batch_size` jobs in all, under the same lease. A
    job of any other kind is claimed alone. Every claimed job's `attempts` grows by one now. A
    job whose lease expired on its last attempt is dead-lettered (`LeaseExpired`) instead of
    run again.
    """
    clock = clock_of(now)
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="READ COMMITTED")
        async with conn.begin():
            passed_over: list[tuple[str, str]] = []
            while (owner := await _next_owner(conn, clock, passed_over)) is not None:
                if await _try_lock_owner(conn, *owner):
                    claimed = await _claim_for_owner(
                        conn, owner, clock=clock, worker_id=worker_id, policy=policy
                    )
                    if claimed is not None:
                        await _record_company_served(conn, claimed.company_id)
                        return claimed
                passed_over.append(owner)
    return None


def clock_of(now: datetime | None) -> ColumnElement[datetime]:
    """PostgreSQL's `now()`, or the given aware instant (tests step time with it)."""
    if now is None:
        return func.now()
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    return literal(now, DateTime(timezone=True))


def claimable(clock: ColumnElement[datetime]) -> ColumnElement[bool]:
    waiting = and_(JOBS.c.status.in_(("queued", "retrying")), JOBS.c.run_after <= clock)
    abandoned = and_(JOBS.c.status == "running", JOBS.c.lease_expires_at < clock)
    return waiting | abandoned


def _owner_has_live_lease(clock: ColumnElement[datetime]) -> ColumnElement[bool]:
    """A probe of `ix_jobs_running_owner`, which holds running jobs only (about one per busy
    slot), however many jobs the owner or the company has finished."""
    live = JOBS.alias("live")
    return exists().where(
        live.c.company_id == JOBS.c.company_id,
        live.c.user_id == JOBS.c.user_id,
        live.c.status == literal_column("'running'"),
        live.c.lease_expires_at >= clock,
    )


def _pending(table: FromClause) -> ColumnElement[bool]:
    """`status IN (...)` with literal values, as `ix_jobs_pending_company`'s predicate has them
    (with bound values a generic plan could not prove that the partial index applies)."""
    return table.c.status.in_([literal_column(f"'{status}'") for status in PENDING_STATUSES])


async def _next_owner(
    conn: AsyncConnection, clock: ColumnElement[datetime], passed_over: Sequence[tuple[str, str]]
) -> tuple[str, str] | None:
    """The owner of the first claimable job in fair order (see `claim_next_job`).

    One statement: a recursive walk of the distinct companies with pending jobs along
    `ix_jobs_pending_company` (one index probe per company, whatever their backlogs), each
    company's oldest claimable job whose user holds no live lease (a short ordered scan of the
    same index), and the companies' fairness records. A plain read (no row locks): its snapshot
    may be stale; `_claim_for_owner` re-checks.

    A company whose user this claim passed over goes last: claimers that read the same
    snapshot pick the same owner, and the ones that lose its lock learn that a concurrent claim
    is serving that company right now. Without this, slots that finish together would keep
    taking the same company as a pack, and two busy companies would not alternate.
    """
    walked = JOBS.alias("walked")
    first = select(func.min(walked.c.company_id)).where(_pending(walked)).scalar_subquery()
    companies = select(first.label("company_id")).cte("pending_companies", recursive=True)
    following = JOBS.alias("following")
    step = (
        select(func.min(following.c.company_id))
        .where(_pending(following), following.c.company_id > companies.c.company_id)
        .scalar_subquery()
    )
    companies = companies.union_all(select(step).where(companies.c.company_id.is_not(None)))
    head = (
        select(JOBS.c.company_id, JOBS.c.user_id, JOBS.c.created_at, JOBS.c.id)
        .where(JOBS.c.company_id == companies.c.company_id, _pending(JOBS))
        .where(claimable(clock), ~_owner_has_live_lease(clock))
        .order_by(JOBS.c.created_at, JOBS.c.id)
        .limit(1)
    )
    fair_order: list[ColumnElement[Any]] = []
    if passed_over:
        head = head.where(tuple_(JOBS.c.company_id, JOBS.c.user_id).not_in(passed_over))
        fair_order.append(companies.c.company_id.in_({company for company, _ in passed_over}))
    heads = head.lateral("head")
    fair_order += [
        COMPANY_CLAIMS.c.last_claimed_at.asc().nulls_first(),
        heads.c.created_at,
        heads.c.id,
    ]
    query = (
        select(heads.c.company_id, heads.c.user_id)
        .select_from(
            companies.join(heads, true()).outerjoin(
                COMPANY_CLAIMS, COMPANY_CLAIMS.c.company_id == heads.c.company_id
            )
        )
        .order_by(*fair_order)
        .limit(1)
    )
    row = (await conn.execute(query)).first()
    return None if row is None else (row.company_id, row.user_id)


async def _record_company_served(conn: AsyncConnection, company_id: str) -> None:
    """The company is now the most recently served (never moved back by a claim that waited on
    this row while a later one committed)."""
    served = pg_insert(COMPANY_CLAIMS).values(
        company_id=company_id, last_claimed_at=func.clock_timestamp()
    )
    await conn.execute(
        served.on_conflict_do_update(
            index_elements=[COMPANY_CLAIMS.c.company_id],
            set_={
                "last_claimed_at": func.greatest(
                    COMPANY_CLAIMS.c.last_claimed_at, served.excluded.last_claimed_at
                )
            },
        )
    )


async def _try_lock_owner(conn: AsyncConnection, company_id: str, user_id: str) -> bool:
    """Transaction-level advisory lock on the user. Hash collisions only over-serialize."""
    key = func.pg_try_advisory_xact_lock(
        func.hashtext(LOCK_NAMESPACE + company_id), func.hashtext(user_id)
    )
    return bool((await conn.execute(select(key))).scalar_one())


async def _claim_for_owner(
    conn: AsyncConnection,
    owner: tuple[str, str],
    *,
    clock: ColumnElement[datetime],
    worker_id: str,
    policy: ClaimPolicy,
) -> ClaimedJob | None:
    company_id, user_id = owner
    batch_size = policy.batch_size
    owned = and_(JOBS.c.company_id == company_id, JOBS.c.user_id == user_id)
    await _dead_letter_exhausted_leases(conn, owned, clock)
    columns = (JOBS.c.id, JOBS.c.kind, JOBS.c.payload, JOBS.c.max_attempts, JOBS.c.created_at)
    in_order = (JOBS.c.created_at, JOBS.c.id)
    head = (
        await conn.execute(
            select(*columns)
            .where(owned, claimable(clock), ~_owner_has_live_lease(clock))
            .order_by(*in_order)
            .limit(1)
            .with_for_update(skip_locked=True, of=JOBS)
        )
    ).first()
    if head is None:
        return None
    rows = [head]
    if head.kind in policy.coalesce and batch_size > 1:
        rows += (
            await conn.execute(
                select(*columns)
                .where(owned, JOBS.c.kind == head.kind, JOBS.c.id != head.id)
                .where(claimable(clock))
                .order_by(*in_order)
                .limit(batch_size - 1)
                .with_for_update(skip_locked=True, of=JOBS)
            )
        ).all()
    token = uuid.uuid4()
    claimed = await conn.execute(
        update(JOBS)
        .where(JOBS.c.company_id == company_id, JOBS.c.id.in_([row.id for row in rows]))
        .values(
            status="running",
            attempts=JOBS.c.attempts + 1,
            lease_token=token,
            lease_expires_at=clock + timedelta(seconds=policy.lease_seconds),
            locked_by=worker_id[:128],
            updated_at=clock,
        )
        .returning(JOBS.c.id, JOBS.c.attempts)
    )
    attempts: dict[uuid.UUID, int] = dict(claimed.all())
    refs = tuple(
        JobRef(row.id, row.payload, attempts[row.id], row.max_attempts, row.created_at)
        for row in rows
    )
    return ClaimedJob(company_id, user_id, head.kind, token, refs)


async def _dead_letter_exhausted_leases(
    conn: AsyncConnection, owned: ColumnElement[bool], clock: ColumnElement[datetime]
) -> None:
    """A job whose worker vanished on its last attempt is not run again (a poison job could
    otherwise kill workers forever)."""
    exhausted = (
        select(JOBS.c.id)
        .where(owned, JOBS.c.status == "running", JOBS.c.lease_expires_at < clock)
        .where(JOBS.c.attempts >= JOBS.c.max_attempts)
        .with_for_update(skip_locked=True)
    )
    await conn.execute(
        update(JOBS)
        .where(owned, JOBS.c.id.in_(exhausted))
        .values(
            status="dead",
            error_class=LEASE_EXPIRED_CLASS,
            error_message=LEASE_EXPIRED_MESSAGE,
            lease_token=None,
            lease_expires_at=None,
            finished_at=clock,
            updated_at=clock,
        )
    )
