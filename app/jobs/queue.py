"""The durable PostgreSQL job queue: enqueue, claim under a lease, heartbeat, finish, dead-letter.

The queue knows jobs, not domains: a job is a `kind` (a name its producer and the worker's
handler agree on), an owner (company_id, user_id) and a payload of ids. Every statement that
writes or claims jobs lives here, either run by these functions (SQLAlchemy Core; no ORM objects
are loaded) or, for a producer that writes its job inside one larger statement, as the
`ENQUEUE_JOB_CTE` fragment; reads and operator actions over stored jobs are in `repository.py`.

Clock: every timestamp is PostgreSQL's `now()` (the start of the current transaction), so workers
on hosts with skewed clocks agree on leases and `run_after`. Functions taking `now` use that
instant instead (tests step time with it). `created_at` is `clock_timestamp()`, so jobs enqueued
in one transaction keep their order.
"""

from __future__ import annotations

import random
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final, Literal, cast

import orjson
from sqlalchemy import (
    ColumnElement,
    DateTime,
    Table,
    and_,
    case,
    exists,
    false,
    func,
    insert,
    literal,
    null,
    select,
    tuple_,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from app.jobs.models import Job

JobKind = str
"""The name of a kind of job; the worker runs each with the handler registered for it."""
_KINDS: list[JobKind] = []
JobStatus = Literal["queued", "running", "retrying", "succeeded", "dead"]
JobOutcome = Literal["noop", "updated"]
FailResult = Literal["retrying", "dead", "lease_lost"]
JobPayload = dict[str, str | list[str] | None]
Executor = AsyncSession | AsyncConnection

BACKOFF_BASE_SECONDS: Final = 2.0
BACKOFF_FACTOR: Final = 2.0
BACKOFF_CAP_SECONDS: Final = 300.0
ERROR_MESSAGE_MAX_CHARS: Final = 512
PAYLOAD_VALUE_MAX_CHARS: Final = 256
PENDING_STATUSES: Final = ("queued", "retrying", "running")
WAITING_STATUSES: Final = ("queued", "retrying", "running", "dead")
LEASE_EXPIRED_CLASS: Final = "LeaseExpired"
LEASE_EXPIRED_MESSAGE: Final = "The worker lost its lease on the last attempt (stopped or hung)."

JOBS: Final = cast(Table, Job.__table__)
_LOCK_NAMESPACE: Final = "context-memory.jobs:"
_ERROR_CLASS = re.compile(r"^[A-Za-z][A-Za-z0-9_.]{0,63}$")
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]+")


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


def register_kind(kind: JobKind) -> JobKind:
    """Declare a kind of job (by the domain that handles it, once, at import); returns it.

    The registered kinds are what the job routes declare in their contract; the database's
    `ck_jobs_kind` must allow the same set (a test holds the two together).
    """
    if kind not in _KINDS:
        _KINDS.append(kind)
    return kind


def registered_kinds() -> tuple[JobKind, ...]:
    return tuple(_KINDS)


# --- enqueue ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class NewJob:
    """A job to queue: its kind, its payload of ids and how many attempts it gets.

    The payload holds ids only (turn ids, space id, model name), never user text: each value is
    a string of at most 256 characters without line breaks, a list of such, or null.
    """

    kind: JobKind
    payload: JobPayload
    max_attempts: int
    id: uuid.UUID = field(default_factory=uuid.uuid4)

    def __post_init__(self) -> None:
        _check_payload(self.payload)
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")


ENQUEUE_JOB_CTE: Final = """, job AS (
    INSERT INTO jobs
        (company_id, id, user_id, kind, status, payload, attempts, max_attempts, created_at)
    VALUES (:company_id, CAST(:job_id AS uuid), :user_id, :job_kind, 'queued',
            CAST(:job_payload AS jsonb), 0, :job_max_attempts, clock_timestamp())
)"""
"""A `WITH` entry that queues `NewJob` exactly as `enqueue_job` does, for a statement that binds
`:company_id` and `:user_id` itself; its other parameters come from `enqueue_params`."""


def enqueue_params(job: NewJob) -> dict[str, object]:
    """The `ENQUEUE_JOB_CTE` parameters of `job`."""
    return {
        "job_id": job.id,
        "job_kind": job.kind,
        "job_payload": orjson.dumps(job.payload).decode(),
        "job_max_attempts": job.max_attempts,
    }


async def enqueue_job(
    session: AsyncSession, company_id: str, user_id: str, job: NewJob
) -> uuid.UUID:
    """Queue `job` for its owner inside the caller's transaction (executed, never committed
    here); returns its id."""
    await session.execute(
        insert(JOBS).values(
            company_id=company_id,
            id=job.id,
            user_id=user_id,
            kind=job.kind,
            status="queued",
            payload=job.payload,
            attempts=0,
            max_attempts=job.max_attempts,
            created_at=func.clock_timestamp(),
        )
    )
    return job.id


async def enqueue_job_once(
    session: AsyncSession, company_id: str, user_id: str, job: NewJob
) -> tuple[uuid.UUID, bool]:
    """The owner's pending job of `job.kind`, else `job` queued now: (job id, queued now).

    Concurrent callers are serialised by an advisory lock on (owner, kind) held until the
    caller's transaction ends, and the check runs as a new statement after it, so two callers
    never queue two pending jobs of one kind.
    """
    kind = job.kind
    lock_key = "\x1f".join((_LOCK_NAMESPACE + "once", kind, company_id, user_id))
    await session.execute(select(func.pg_advisory_xact_lock(func.hashtextextended(lock_key, 0))))
    pending = await session.scalar(
        select(JOBS.c.id)
        .where(JOBS.c.company_id == company_id, JOBS.c.user_id == user_id, JOBS.c.kind == kind)
        .where(JOBS.c.status.in_(PENDING_STATUSES))
        .order_by(JOBS.c.created_at)
        .limit(1)
    )
    if pending is not None:
        return pending, False
    return await enqueue_job(session, company_id, user_id, job), True


def _check_payload(payload: Mapping[str, object]) -> None:
    for key, value in payload.items():
        items = value if isinstance(value, list) else [value]
        for item in items:
            if item is None:
                continue
            if (
                not isinstance(item, str)
                or len(item) > PAYLOAD_VALUE_MAX_CHARS
                or "\n" in item
                or "\r" in item
            ):
                raise ValueError(f"job payload field {key!r} must hold ids only")


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
    """Claim the oldest claimable job for `worker_id`, coalesced with its owner's waiting jobs
    of the same kind when its kind is in `policy.coalesce`, in one short READ COMMITTED
    transaction. None when nothing is claimable.

    Claimable: `queued`/`retrying` with `run_after <= now`, or `running` with an expired lease
    (its worker died). A user's jobs never run concurrently. Row locks (`SKIP LOCKED`) alone
    cannot ensure that: two workers may lock two *different* rows of one user, and neither sees
    the other's uncommitted claim in its `NOT EXISTS` check. So a claimer first takes a
    transaction-level advisory lock on (company_id, user_id) with `pg_try_advisory_xact_lock`
    (never waits; a user whose lock is taken is passed over), and only then, in a *new*
    statement, hence a new READ COMMITTED snapshot, re-checks that the user has no job running
    under a live lease and locks their rows. Any claim that committed before our lock was
    granted is visible to that snapshot; none can commit while we hold it. The lock is released
    at commit, when our own `running` rows have become visible to others.

    Coalescing: a claim of a kind in `policy.coalesce` absorbs the user's other claimable jobs of
    that kind in created order, up to `policy.batch_size` jobs in all, under the same lease. A
    job of any other kind is claimed alone. Every claimed job's `attempts` grows by one now. A
    job whose lease expired on its last attempt is dead-lettered (`LeaseExpired`) instead of
    run again.
    """
    clock = _clock(now)
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="READ COMMITTED")
        async with conn.begin():
            passed_over: list[tuple[str, str]] = []
            while (owner := await _oldest_claimable_owner(conn, clock, passed_over)) is not None:
                if await _try_lock_owner(conn, *owner):
                    claimed = await _claim_for_owner(
                        conn, owner, clock=clock, worker_id=worker_id, policy=policy
                    )
                    if claimed is not None:
                        return claimed
                passed_over.append(owner)
    return None


def _clock(now: datetime | None) -> ColumnElement[datetime]:
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
    live = JOBS.alias("live")
    return exists().where(
        live.c.company_id == JOBS.c.company_id,
        live.c.user_id == JOBS.c.user_id,
        live.c.status == "running",
        live.c.lease_expires_at >= clock,
    )


async def _oldest_claimable_owner(
    conn: AsyncConnection, clock: ColumnElement[datetime], passed_over: Sequence[tuple[str, str]]
) -> tuple[str, str] | None:
    """A plain read (no row locks): its snapshot may be stale; `_claim_for_owner` re-checks."""
    query = (
        select(JOBS.c.company_id, JOBS.c.user_id)
        .where(claimable(clock), ~_owner_has_live_lease(clock))
        .order_by(JOBS.c.created_at, JOBS.c.id)
        .limit(1)
    )
    if passed_over:
        query = query.where(tuple_(JOBS.c.company_id, JOBS.c.user_id).not_in(passed_over))
    row = (await conn.execute(query)).first()
    return None if row is None else (row.company_id, row.user_id)


async def _try_lock_owner(conn: AsyncConnection, company_id: str, user_id: str) -> bool:
    """Transaction-level advisory lock on the user. Hash collisions only over-serialize."""
    key = func.pg_try_advisory_xact_lock(
        func.hashtext(_LOCK_NAMESPACE + company_id), func.hashtext(user_id)
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


# --- while running, and after -----------------------------------------------------------------


def _held(claimed: ClaimedJob) -> ColumnElement[bool]:
    """The claim's rows, only while its lease token still stands (the fence)."""
    return and_(
        JOBS.c.company_id == claimed.company_id,
        JOBS.c.id.in_(claimed.job_ids),
        JOBS.c.status == "running",
        JOBS.c.lease_token == claimed.lease_token,
    )


async def heartbeat(
    engine: AsyncEngine, claimed: ClaimedJob, lease_seconds: float, *, now: datetime | None = None
) -> bool:
    """Extend the lease to now + `lease_seconds`. False = the lease is lost for at least one job
    (re-claimed after expiry, or deleted by an opt-out): the worker must stop and write nothing.
    An expired lease nobody re-claimed yet is still ours and is extended."""
    clock = _clock(now)
    async with engine.begin() as conn:
        extended = await conn.execute(
            update(JOBS)
            .where(_held(claimed))
            .values(lease_expires_at=clock + timedelta(seconds=lease_seconds), updated_at=clock)
            .returning(JOBS.c.id)
        )
        return len(extended.all()) == len(claimed.jobs)


async def complete_jobs(
    executor: Executor,
    claimed: ClaimedJob,
    *,
    outcome: JobOutcome,
    version: int | None,
    now: datetime | None = None,
) -> bool:
    """Mark the claim's jobs succeeded, in the caller's transaction: call it in the transaction
    that writes the profile version, so both commit or neither does.

    All or nothing: if any job's lease token changed (re-claimed after expiry) or the job is gone,
    nothing is written and False is returned; the caller must then roll back its transaction.
    The rows stay locked until the caller commits, so a re-claim cannot slip in between.
    """
    clock = _clock(now)
    held = await executor.execute(select(JOBS.c.id).where(_held(claimed)).with_for_update())
    if len(held.all()) != len(claimed.jobs):
        return False
    await executor.execute(
        update(JOBS)
        .where(_held(claimed))
        .values(
            status="succeeded",
            outcome=outcome,
            version=version,
            error_class=None,
            error_message=None,
            lease_token=None,
            lease_expires_at=None,
            finished_at=clock,
            updated_at=clock,
        )
    )
    return True


def backoff_seconds(
    attempts: int, *, retry_after_seconds: float | None = None, jitter: float | None = None
) -> float:
    """Delay before the next attempt: full jitter, uniform in [0, min(cap, base * 2^(n-1))]
    (2 s, 4 s, ... capped at 5 min), but at least the model's Retry-After (itself capped)."""
    exponent = min(max(attempts - 1, 0), 30)
    ceiling = min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * BACKOFF_FACTOR**exponent)
    fraction = random.random() if jitter is None else jitter  # noqa: S311 - jitter, not a secret
    delay = ceiling * min(max(fraction, 0.0), 1.0)
    if retry_after_seconds is not None and retry_after_seconds > 0:
        delay = max(delay, min(retry_after_seconds, BACKOFF_CAP_SECONDS))
    return delay


@dataclass(frozen=True)
class AttemptFailure:
    """Why an attempt failed, as operators see it, and whether the job may run again.

    Contract: `error_class` is an identifier (e.g. `RateLimited`, `MalformedOutput`) and
    `message` a fixed description written by the caller's author, never `str(exc)` of a model
    error nor anything derived from the model's output or the user's text; both are shown to
    operators. `retry_after_seconds`: the failing service's Retry-After, if it sent one.
    """

    error_class: str
    message: str
    retryable: bool
    retry_after_seconds: float | None = None

    def __post_init__(self) -> None:
        if not _ERROR_CLASS.match(self.error_class):
            raise ValueError("error_class must be an identifier of at most 64 characters")


async def fail_jobs(
    engine: AsyncEngine,
    claimed: ClaimedJob,
    failure: AttemptFailure,
    *,
    now: datetime | None = None,
) -> FailResult:
    """Record a failed attempt: each job retries after `backoff_seconds` if the failure is
    retryable and it has attempts left, else it is dead-lettered. The message is stripped of
    control characters and cut to 512 characters.

    Returns "retrying" if any job will run again, "dead" if all were dead-lettered, and
    "lease_lost" if the lease was no longer held (nothing written).
    """
    message = _CONTROL_CHARS.sub(" ", failure.message).strip()[:ERROR_MESSAGE_MAX_CHARS]
    clock = _clock(now)
    delay = backoff_seconds(
        max(job.attempts for job in claimed.jobs),
        retry_after_seconds=failure.retry_after_seconds,
    )
    retry = JOBS.c.attempts < JOBS.c.max_attempts if failure.retryable else false()
    async with engine.begin() as conn:
        failed = await conn.execute(
            update(JOBS)
            .where(_held(claimed))
            .values(
                status=case((retry, "retrying"), else_="dead"),
                run_after=case((retry, clock + timedelta(seconds=delay)), else_=JOBS.c.run_after),
                finished_at=case((retry, null()), else_=clock),
                error_class=failure.error_class,
                error_message=message,
                lease_token=None,
                lease_expires_at=None,
                updated_at=clock,
            )
            .returning(JOBS.c.status)
        )
        statuses = set(failed.scalars().all())
    if not statuses:
        return "lease_lost"
    return "retrying" if "retrying" in statuses else "dead"


async def release_jobs(engine: AsyncEngine, claimed: ClaimedJob) -> int:
    """Graceful shutdown: hand the claim back untouched. The attempt did not happen, so
    `attempts` goes back down; a job that had failed before returns to `retrying`, others to
    `queued`; `run_after` is kept (already due). Returns how many jobs were put back."""
    async with engine.begin() as conn:
        released = await conn.execute(
            update(JOBS)
            .where(_held(claimed))
            .values(
                status=case((JOBS.c.attempts > 1, "retrying"), else_="queued"),
                attempts=func.greatest(JOBS.c.attempts - 1, 0),
                lease_token=None,
                lease_expires_at=None,
                locked_by=None,
                updated_at=func.now(),
            )
            .returning(JOBS.c.id)
        )
        return len(released.all())
