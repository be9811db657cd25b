"""The producers' side of the queue: the kinds domains register, and queuing a job, alone or
inside a producer's own statement (`enqueue_job_cte`), with its payload checked once; and, for a
producer that bounds how many jobs an owner has waiting, the count of those and appending an
item to one of them instead (`WAITING_JOBS_JOINS`, `coalesce_job_cte`).

A job, or an item appended to one, may carry the W3C `traceparent` of the request that queued
it (`jobs.trace_context`): the run's span links to each. The statement fragments come in two
forms, with and without it, so that a producer that is not traced binds nothing more."""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

import orjson
from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.jobs.queue import JOBS, LOCK_NAMESPACE, PENDING_STATUSES, JobKind, JobPayload

PAYLOAD_VALUE_MAX_CHARS: Final = 256
TRACEPARENT: Final = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
"""A W3C `traceparent` (version, trace id, parent id, flags): ids only, checked as such."""
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
    trace_parent: str | None = None
    """The `traceparent` of the request that queued it, when that was traced and sampled."""

    def __post_init__(self) -> None:
        _check_payload(self.payload)
        _check_traceparent(self.trace_parent)
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")


_PAYLOAD: Final = "CAST(:job_payload AS jsonb)"


def enqueue_job_cte(gate: str, *, traced: bool = False, payload_merge: str | None = None) -> str:
    """A `WITH` entry that queues `NewJob` exactly as `enqueue_job` does when the earlier entry
    named `gate` (a constant of the composing statement, never user input) has a row, for a
    statement that binds `:company_id` and `:user_id` itself; its other parameters come from
    `enqueue_params`. `traced`: the job keeps its `trace_parent` (`:job_trace_parent`).
    `payload_merge`: a jsonb object of the composing statement (a constant SQL expression,
    never user input) whose keys replace the payload's, for a value the statement decides."""
    payload = _PAYLOAD if payload_merge is None else f"{_PAYLOAD} || {payload_merge}"
    trace_column = ", trace_context" if traced else ""
    trace_value = ", ARRAY[CAST(:job_trace_parent AS text)]" if traced else ""
    return f""", job AS (
    INSERT INTO jobs
        (company_id, id, user_id, kind, status, payload, attempts, max_attempts,
         created_at{trace_column})
    SELECT :company_id, CAST(:job_id AS uuid), :user_id, :job_kind, 'queued',
           {payload}, 0, :job_max_attempts, clock_timestamp(){trace_value}
    FROM {gate}
)"""  # noqa: S608


def enqueue_params(job: NewJob) -> dict[str, object]:
    """The `enqueue_job_cte` parameters of `job`."""
    return {
        "job_id": job.id,
        "job_kind": job.kind,
        "job_payload": orjson.dumps(job.payload).decode(),
        "job_max_attempts": job.max_attempts,
        "job_trace_parent": job.trace_parent,
    }


# --- coalescing a producer's item into a waiting job (the producers' per-user queue quota) ----

ITEMS_KEY: Final = "turn_ids"
"""The payload list coalescing appends to. A job holds its first item under another key (a
turn-save's `turn_id`), which `job_items` counts as well."""


def _job_items(alias: str) -> str:
    # `alias` is a constant of this module, never user input
    payload = f"{alias}.payload"
    return (
        f"(({payload} ? 'turn_id')::int + coalesce(jsonb_array_length(CASE WHEN "
        f"jsonb_typeof({payload} -> '{ITEMS_KEY}') = 'array' THEN {payload} -> '{ITEMS_KEY}' "
        "END), 0))"
    )


WAITING_JOBS_JOINS: Final = f"""
LEFT JOIN LATERAL (
    SELECT count(*) AS waiting FROM (
        SELECT 1 FROM jobs wj
        WHERE wj.company_id = :company_id AND wj.user_id = :user_id AND wj.kind = :waiting_kind
          AND wj.status IN ('queued', 'retrying')
        LIMIT :waiting_quota
    ) counted
) waiting_jobs ON true
LEFT JOIN LATERAL (
    SELECT tj.id FROM jobs tj
    WHERE waiting_jobs.waiting >= :waiting_quota AND :waiting_quota > 0
      AND tj.company_id = :company_id AND tj.user_id = :user_id AND tj.kind = :waiting_kind
      AND tj.status = 'queued' AND {_job_items("tj")} < :job_max_items
    ORDER BY tj.payload ->> 'space_id' = :space_id DESC NULLS LAST, tj.created_at DESC,
             tj.id DESC
    LIMIT 1
) coalesce_target ON true"""  # noqa: S608
"""For a statement that binds :company_id, :user_id and :space_id: how many jobs of
:waiting_kind the user has waiting (queued or retrying, counted up to :waiting_quota, over
`ix_jobs_waiting_owner`), and, only when that reaches :waiting_quota (> 0), the newest still-queued
one holding fewer than :job_max_items items (one of :space_id first). Their columns are
`WAITING_JOBS_COLUMNS`; `waiting_params` binds the rest."""

WAITING_JOBS_COLUMNS: Final = (
    "waiting_jobs.waiting AS waiting_jobs, coalesce_target.id AS coalesce_job_id"
)


def waiting_params(kind: JobKind, quota: int, max_items: int) -> dict[str, object]:
    """The parameters of `WAITING_JOBS_JOINS` of its own (`quota` 0: no quota)."""
    return {"waiting_kind": kind, "waiting_quota": quota, "job_max_items": max_items}


@dataclass(frozen=True)
class CoalescedItem:
    """An id appended to the waiting job `job_id`'s `turn_ids` instead of a job of its own,
    while that job is still queued and holds fewer than `max_items` items."""

    job_id: uuid.UUID
    item: str
    max_items: int
    trace_parent: str | None = None
    """The `traceparent` of the request that appended it, when traced and sampled."""

    def __post_init__(self) -> None:
        _check_payload({ITEMS_KEY: [self.item]})
        _check_traceparent(self.trace_parent)


def coalesce_job_cte(name: str, gate: str, *, traced: bool = False) -> str:
    """A `WITH` entry `name` that appends `CoalescedItem` to its job when the earlier entry
    `gate` has a row (both constants of the composing statement, never user input), for a
    statement that binds :company_id and :user_id; its other parameters come from
    `coalesce_params`. It has a row when the item was appended. `traced`: the item's
    `trace_parent` (`:coalesce_trace_parent`) is appended to the job's trace context too.

    An UPDATE: it waits for a claim or another append holding the row and then re-checks the
    row as committed, so a job claimed meanwhile (no longer `queued`) or filled meanwhile is
    left alone, and concurrent appends never lose one another."""
    trace_context = (
        ",\n        trace_context = coalesce(cj.trace_context, ARRAY[]::text[])"
        " || CAST(:coalesce_trace_parent AS text)"
        if traced
        else ""
    )
    return f""", {name} AS (
    UPDATE jobs cj
    SET payload = jsonb_set(
            cj.payload, '{{{ITEMS_KEY}}}',
            coalesce(CASE WHEN jsonb_typeof(cj.payload -> '{ITEMS_KEY}') = 'array'
                          THEN cj.payload -> '{ITEMS_KEY}' END, '[]'::jsonb)
            || jsonb_build_array(CAST(:coalesce_item AS text))),
        updated_at = now(){trace_context}
    WHERE cj.company_id = :company_id AND cj.id = CAST(:coalesce_job_id AS uuid)
      AND cj.user_id = :user_id AND cj.status = 'queued'
      AND {_job_items("cj")} < :coalesce_max_items
      AND EXISTS (SELECT FROM {gate})
    RETURNING cj.id
)"""  # noqa: S608


def coalesce_params(coalesced: CoalescedItem) -> dict[str, object]:
    """The `coalesce_job_cte` parameters of `coalesced`."""
    return {
        "coalesce_job_id": coalesced.job_id,
        "coalesce_item": coalesced.item,
        "coalesce_max_items": coalesced.max_items,
        "coalesce_trace_parent": coalesced.trace_parent,
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
            trace_context=None if job.trace_parent is None else [job.trace_parent],
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


def _check_traceparent(value: str | None) -> None:
    if value is not None and not TRACEPARENT.match(value):
        raise ValueError("trace_parent must be a W3C traceparent")


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
