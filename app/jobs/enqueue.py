"""The producers' side of the queue: the kinds domains register, and queuing a job, alone or
inside a producer's own statement (`enqueue_job_cte`), with its payload checked once."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

import orjson
from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.jobs.queue import JOBS, LOCK_NAMESPACE, PENDING_STATUSES, JobKind, JobPayload

PAYLOAD_VALUE_MAX_CHARS: Final = 256
_KINDS: list[JobKind] = []


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


def enqueue_job_cte(gate: str) -> str:
    """A `WITH` entry that queues `NewJob` exactly as `enqueue_job` does when the earlier entry
    named `gate` (a constant of the composing statement, never user input) has a row, for a
    statement that binds `:company_id` and `:user_id` itself; its other parameters come from
    `enqueue_params`."""
    return f""", job AS (
    INSERT INTO jobs
        (company_id, id, user_id, kind, status, payload, attempts, max_attempts, created_at)
    SELECT :company_id, CAST(:job_id AS uuid), :user_id, :job_kind, 'queued',
           CAST(:job_payload AS jsonb), 0, :job_max_attempts, clock_timestamp()
    FROM {gate}
)"""  # noqa: S608


def enqueue_params(job: NewJob) -> dict[str, object]:
    """The `enqueue_job_cte` parameters of `job`."""
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
    lock_key = "\x1f".join((LOCK_NAMESPACE + "once", kind, company_id, user_id))
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
