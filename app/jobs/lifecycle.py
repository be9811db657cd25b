"""What a worker does with a claim it holds: extend its lease, complete it in the caller's
transaction, fail it (retry with backoff, or dead-letter), defer it to a later time, or release
it on shutdown. Every write is fenced by the claim's lease token."""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from sqlalchemy import (
    ARRAY,
    CTE,
    ColumnElement,
    DateTime,
    Integer,
    Interval,
    Select,
    String,
    Uuid,
    and_,
    any_,
    bindparam,
    case,
    exists,
    false,
    func,
    null,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler

from app.jobs.queue import JOBS, ClaimedJob, FailResult, JobOutcome
from app.kit.citus import compiling_for_citus, known_citus

BACKOFF_BASE_SECONDS: Final = 2.0
BACKOFF_FACTOR: Final = 2.0
BACKOFF_CAP_SECONDS: Final = 300.0
ERROR_MESSAGE_MAX_CHARS: Final = 512
_ERROR_CLASS = re.compile(r"^[A-Za-z][A-Za-z0-9_.]{0,63}$")
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]+")
Executor = AsyncSession | AsyncConnection


class _Clock(ColumnElement[datetime]):
    """PostgreSQL's `now()`, or the instant bound as `now` (tests step time with it):
    `coalesce(:now, now())`. On a Citus cluster, which refuses a non-immutable function inside
    COALESCE in an UPDATE, it is `:now` alone, always bound (`_clock`)."""

    type = DateTime(timezone=True)
    inherit_cache = True


@compiles(_Clock)
def _compile_clock(element: _Clock, compiler: SQLCompiler, **kw: Any) -> str:
    now = compiler.process(bindparam("now", type_=DateTime(timezone=True)), **kw)
    if compiling_for_citus(compiler.dialect):
        return f"CAST({now} AS timestamptz)"
    return f"coalesce({now}, now())"


_CLOCK: Final = _Clock()


class _RetryAt(ColumnElement[datetime]):
    """`_CLOCK` + the retry's delay, a `timedelta` bound as `retry_delay`; on a Citus cluster,
    which refuses a non-immutable operator (timestamptz + interval) inside CASE in an UPDATE,
    the instant computed by the caller, bound as `retry_at`."""

    type = DateTime(timezone=True)
    inherit_cache = True


@compiles(_RetryAt)
def _compile_retry_at(element: _RetryAt, compiler: SQLCompiler, **kw: Any) -> str:
    if compiling_for_citus(compiler.dialect):
        at = compiler.process(bindparam("retry_at", type_=DateTime(timezone=True)), **kw)
        return f"CAST({at} AS timestamptz)"
    delay = compiler.process(bindparam("retry_delay", type_=Interval), **kw)
    return f"({compiler.process(_CLOCK, **kw)} + {delay})"


_HELD: Final = and_(
    JOBS.c.company_id == bindparam("held_company", type_=String),
    JOBS.c.id == any_(bindparam("held_ids", type_=ARRAY(Uuid))),
    JOBS.c.status == "running",
    JOBS.c.lease_token == bindparam("held_token", type_=Uuid),
)
"""The claim's rows, only while its lease token still stands (the fence); `_held_params`
binds it. The statements that use it are built once: they are the worker's most frequent."""


async def _clock(executor: Executor, now: datetime | None) -> datetime | None:
    """`now`, or on a Citus cluster the transaction's `now()` read first: Citus refuses a
    non-immutable function inside the COALESCE of `_CLOCK` in an UPDATE, and is given the
    instant instead (one more round trip there; none on plain PostgreSQL)."""
    if now is not None or not known_citus(executor):
        return now
    clock: datetime | None = await executor.scalar(select(func.now()))
    return clock


def _held_params(claimed: ClaimedJob, now: datetime | None) -> dict[str, object]:
    if now is not None and now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    return {
        "held_company": claimed.company_id,
        "held_ids": claimed.job_ids,
        "held_token": claimed.lease_token,
        "now": now,
    }


_HEARTBEAT: Final = (
    update(JOBS)
    .where(_HELD)
    .values(
        lease_expires_at=_CLOCK + bindparam("lease", type_=Interval),
        updated_at=_CLOCK,
    )
    .returning(JOBS.c.id)
)


async def heartbeat(
    engine: AsyncEngine, claimed: ClaimedJob, lease_seconds: float, *, now: datetime | None = None
) -> bool:
    """Extend the lease to now + `lease_seconds`. False = the lease is lost for at least one job
    (re-claimed after expiry, or deleted by an opt-out): the worker must stop and write nothing.
    An expired lease nobody re-claimed yet is still ours and is extended."""
    async with engine.begin() as conn:
        params = _held_params(claimed, await _clock(conn, now))
        params |= {"lease": timedelta(seconds=lease_seconds)}
        extended = await conn.execute(_HEARTBEAT, params)
        return len(extended.all()) == len(claimed.jobs)


Riders = Callable[[ColumnElement[bool]], Sequence[CTE]]
"""Writes of the caller that ride along with a claim's completion (`completion_statement`):
given whether the claim was completed, its data-modifying CTEs."""


def completion_statement(riders: Riders | None = None) -> Select[int]:
    """The statement of `complete_jobs`, with the caller's `riders` in it (built once, at
    import): their writes commit or roll back with the completion, in one round trip, and
    each should write only when handed `true` (the claim was completed: all or nothing), so
    that the statement may run in autocommit. The riders' parameters must not be named as
    `complete_jobs`'s (`held_*`, `now`, `outcome`, `version`) nor as a column of `jobs`."""
    # ONE statement: lock the claim's rows still under its lease, and mark them only when all
    # of them are (a row whose token changed is not locked, so the count falls short)
    held = select(JOBS.c.id).where(_HELD).with_for_update().cte("held")
    all_held = select(func.count()).select_from(held).scalar_subquery() == bindparam(
        "held_count", type_=Integer
    )
    done = (
        update(JOBS)
        # by the claim's ids, as the rows were locked (not `IN (SELECT id FROM held)`, which
        # the planner may answer by scanning all of the company's jobs); the rows it finds are
        # the ones `held` locked, the count having been checked first
        .where(_HELD, all_held)
        .values(
            status="succeeded",
            outcome=bindparam("outcome", type_=String),
            version=bindparam("version", type_=Integer),
            error_class=None,
            error_message=None,
            lease_token=None,
            lease_expires_at=None,
            finished_at=_CLOCK,
            updated_at=_CLOCK,
        )
        .returning(JOBS.c.id)
        .cte("done")
    )
    statement = select(func.count()).select_from(done)
    if riders is None:
        return statement
    return statement.add_cte(*riders(exists(select(done.c.id))))


_COMPLETE: Final = completion_statement()


async def complete_jobs(  # noqa: PLR0913 - the last three are optional, by keyword
    executor: Executor,
    claimed: ClaimedJob,
    *,
    outcome: JobOutcome,
    version: int | None,
    now: datetime | None = None,
    statement: Select[int] = _COMPLETE,
    riders: Mapping[str, object] | None = None,
) -> bool:
    """Mark the claim's jobs succeeded, in the caller's transaction: call it in the transaction
    that writes the profile version, so both commit or neither does.

    All or nothing: if any job's lease token changed (re-claimed after expiry) or the job is gone,
    nothing is written and False is returned; the caller must then roll back its transaction.
    The rows stay locked until the caller commits, so a re-claim cannot slip in between.
    `statement`: one of `completion_statement`, its riders bound by `riders`.
    """
    params = _held_params(claimed, await _clock(executor, now)) | {
        "held_count": len(claimed.jobs),
        "outcome": outcome,
        "version": version,
    }
    if riders:
        if params.keys() & riders.keys() or JOBS.c.keys() & riders.keys():
            # a parameter named as a column of `jobs` would be set by the UPDATE (SQLAlchemy)
            raise ValueError("a rider's parameters must be named apart from the completion's")
        params |= riders
    completed = await executor.scalar(statement, params)
    return completed == len(claimed.jobs)


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
    delay = backoff_seconds(
        max(job.attempts for job in claimed.jobs),
        retry_after_seconds=failure.retry_after_seconds,
    )
    retry = JOBS.c.attempts < JOBS.c.max_attempts if failure.retryable else false()
    retry_delay = timedelta(seconds=delay)
    async with engine.begin() as conn:
        clock = await _clock(conn, now)
        failed = await conn.execute(
            update(JOBS)
            .where(_HELD)
            .values(
                status=case((retry, "retrying"), else_="dead"),
                run_after=case((retry, _RetryAt()), else_=JOBS.c.run_after),
                finished_at=case((retry, null()), else_=_CLOCK),
                error_class=failure.error_class,
                error_message=message,
                lease_token=None,
                lease_expires_at=None,
                updated_at=_CLOCK,
            )
            .returning(JOBS.c.status),
            _held_params(claimed, clock)
            | {"retry_delay": retry_delay, "retry_at": clock and clock + retry_delay},
        )
        statuses = set(failed.scalars().all())
    if not statuses:
        return "lease_lost"
    return "retrying" if "retrying" in statuses else "dead"


async def defer_jobs(executor: Executor, claimed: ClaimedJob, run_after: datetime) -> bool:
    """Put the claim back, untouched, to run no earlier than `run_after` (a company's spent
    model budget: the next period), in the caller's transaction. As `release_jobs`, the attempt
    did not happen: `attempts` goes back down and nothing is dead-lettered or lost.

    All or nothing, fenced like `complete_jobs`: False (nothing written) when any job's lease
    was lost; the caller must then roll back.
    """
    params = _held_params(claimed, None)
    held = await executor.execute(select(JOBS.c.id).where(_HELD).with_for_update(), params)
    if len(held.all()) != len(claimed.jobs):
        return False
    await executor.execute(
        update(JOBS)
        .where(_HELD)
        .values(
            status=case((JOBS.c.attempts > 1, "retrying"), else_="queued"),
            attempts=func.greatest(JOBS.c.attempts - 1, 0),
            run_after=run_after,
            lease_token=None,
            lease_expires_at=None,
            locked_by=None,
            updated_at=func.now(),
        ),
        params,
    )
    return True


async def bring_forward(session: AsyncSession, company_id: str, deferred_until: datetime) -> int:
    """The company's waiting jobs that `defer_jobs` put off until `deferred_until` (or later)
    become due now, in the caller's transaction (an operator raised the company's model
    budget: the worker decides again). Returns how many."""
    brought = await session.execute(
        update(JOBS)
        .where(
            JOBS.c.company_id == company_id,
            JOBS.c.status.in_(("queued", "retrying")),
            JOBS.c.run_after >= deferred_until,
        )
        .values(run_after=func.now(), updated_at=func.now())
        .returning(JOBS.c.id)
    )
    return len(brought.all())


async def release_jobs(engine: AsyncEngine, claimed: ClaimedJob) -> int:
    """Graceful shutdown: hand the claim back untouched. The attempt did not happen, so
    `attempts` goes back down; a job that had failed before returns to `retrying`, others to
    `queued`; `run_after` is kept (already due). Returns how many jobs were put back."""
    async with engine.begin() as conn:
        released = await conn.execute(
            update(JOBS)
            .where(_HELD)
            .values(
                status=case((JOBS.c.attempts > 1, "retrying"), else_="queued"),
                attempts=func.greatest(JOBS.c.attempts - 1, 0),
                lease_token=None,
                lease_expires_at=None,
                locked_by=None,
                updated_at=func.now(),
            )
            .returning(JOBS.c.id),
            _held_params(claimed, None),
        )
        return len(released.all())
