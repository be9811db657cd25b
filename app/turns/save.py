"""Turn-save (`POST /v1/chats/{chat_id}/turns`): store the exchange per mode, durably, and queue
a consolidation when memory is active. Never waits for a model.

Runs on a driver connection. Without an `Idempotency-Key`, in the common cases ONE statement,
atomic on its own, no BEGIN/COMMIT round trips: the settings read and, gated in SQL on what it
read, the write of the turn, its messages and its job (`repository.save_common_turn`); in the
others (the user's first turn, a quota refusal, a full queue) that statement writes nothing and
serves as the settings read of the general plan, followed by one write. With a key, one
transaction: the key's advisory lock, the settings and record read, the write (record
included), COMMIT, all before the answer. The first enabled turn of a user also creates the
per-user folder (folders service), in a transaction of its own: creating it is idempotent, and
a turn whose write then fails leaves only that folder, which the next turn would have created
anyway.

Against an erasure of the user (`DELETE /v1/me`) the write is all or nothing, and so is its
plan: an erasure that commits before the write is seen by it (the memory folder the plan
queued a job for is gone, so nothing is written and the turn is planned again on what is
stored now: a fresh start, whose job is consolidated like any other); one that starts while
the write is in flight waits for it to commit and deletes the whole turn
(`repository.write_turn`). The same holds against an opt-out, which deletes the folder too.

Quotas (`app/quotas`, docs/operations.md#quotas) cost no round trip while a user is under
them: the settings read also reads the caller's quota marks, and the write queues a new job
only while the user's waiting jobs, counted under a per-user lock, are fewer than the quota.
Past it (the write stores nothing and says so), the turn is planned again with a read of the
waiting jobs and its id appended to the newest queued one; a job claimed or filled between
that read and the write makes the write store nothing, and the turn is planned again, like a
turn whose memory was erased meanwhile.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Literal

import asyncpg
import orjson

from app.consolidation.kinds import CONSOLIDATION, consolidation_payload
from app.conversations import repository as history
from app.conversations.modes import SavedMessage
from app.conversations.schemas import check_message_limits
from app.folders.service import ensure_user_folder
from app.jobs.enqueue import CoalescedItem, NewJob
from app.kit.citus import runs_citus
from app.kit.config import Settings
from app.kit.db.engine import Database
from app.kit.errors import Forbidden, QuotaExceeded
from app.kit.principal import Principal
from app.quotas.errors import WaitingJobsFull, stored_quota_refusal
from app.quotas.limits import quota_limits
from app.quotas.rule import (
    NEW_JOB,
    QuotaLimits,
    place_consolidation,
    users_with_memory_skip_reason,
)
from app.turns import idempotency, repository
from app.turns.batching import ALONE, TurnBatcher
from app.turns.errors import (
    IdempotencyKeyInFlight,
    IdempotencyKeyReused,
    MemoryDeletedWhileSaving,
    NothingQueued,
)
from app.turns.plan import plan_turn, saved_messages, skip_reason
from app.turns.repository import TurnWrite
from app.turns.schemas import TurnRequest

QUEUED, SKIPPED = 202, 201
MAX_PLANS = 3  # a turn planned again this often lost its memory to an erasure each time
# plans lost to the quota of waiting jobs (full at the write, or the job chosen to join claimed
# or filled meanwhile) before a plan queues its job whatever the count
MAX_QUEUE_PLANS = 6
FOLDER_REFUSED_REASON = (
    "Context memory is enabled, but the access check refused creating your memory folder; "
    "nothing was queued."
)


@dataclass(frozen=True)
class TurnOutcome:
    """The response to send: a fresh one, or the stored one of an earlier identical request."""

    status_code: int
    body: bytes
    replayed: bool


@dataclass(frozen=True)
class TurnSubmission:
    """One turn handed in: by whom, to which chat, what, and under which `Idempotency-Key`.

    `refuse_skipped`: a turn whose consolidation would be skipped is a 409 with the reason,
    and nothing is written (explicit consolidation). `trace_parent`: the request's W3C
    `traceparent` when it is traced and sampled, kept by the job that consolidates the turn.
    """

    principal: Principal
    chat_id: str
    request: TurnRequest
    idempotency_key: str | None = None
    refuse_skipped: bool = False
    trace_parent: str | None = None


async def save_turn(
    database: Database,
    submission: TurnSubmission,
    *,
    settings: Settings,
    batcher: TurnBatcher | None = None,
) -> TurnOutcome:
    """Save the turn and queue its consolidation (202), or say why it was skipped (201).

    With an idempotency key (scoped to the caller): while another request holds the key -> 409;
    a live record with the same request hash -> that response replayed, nothing written; with
    another hash -> 422. Otherwise the work is done and its response stored with the key, in the
    same transaction, so a replay can never see a turn that was rolled back.

    Without a key, the one statement of a common turn-save goes through `batcher` when given:
    written with the turn-saves of concurrent requests (app/turns/batching.py).
    """
    request = submission.request
    check_message_limits(
        settings,
        messages=request.messages,
        placeholder_history=request.placeholder_history,
        texts=[("response.content", request.response.content)],
    )
    citus = await runs_citus(database.engine)
    services = _Services(database, settings, quota_limits(settings), citus)
    keyed = submission.idempotency_key is not None
    common: _CommonOutcome | None = None
    if not keyed and batcher is not None:
        turn = _common_turn(services, submission)
        done = await batcher.save(turn)
        if done is not ALONE:
            common = _common_outcome(submission, turn, done)
            if isinstance(common, TurnOutcome):
                return common
    # without a key the write is one statement, atomic on its own: no BEGIN/COMMIT
    async with (
        database.driver.connection() as conn,
        conn.transaction() if keyed else contextlib.nullcontext(),
    ):
        return await _save(conn, services, submission, common)


@dataclass(frozen=True)
class _Services:
    """What planning and writing a turn use besides its connection."""

    database: Database
    settings: Settings
    limits: QuotaLimits
    citus: bool  # a Citus coordinator: the statements' forms for it (app/kit/citus.py)


_CommonOutcome = TurnOutcome | Literal[TurnWrite.PLAN_AGAIN] | repository.TurnSettingsRow


async def _save(
    conn: asyncpg.Connection,
    services: _Services,
    submission: TurnSubmission,
    common: _CommonOutcome | None = None,
) -> TurnOutcome:
    """`common`: what the one-statement attempt of a turn without a key answered, when it was
    made already (through the batcher); without a key and without it, it is made here."""
    principal, key = submission.principal, submission.idempotency_key
    # inside the caller's transaction: the lock lasts until COMMIT
    if key is not None and not await repository.try_lock_idempotency_key(
        conn, principal.company_id, principal.user_id, key
    ):
        raise IdempotencyKeyInFlight
    queue = Queue.COALESCE if services.limits.user_queued_jobs > 0 else Queue.ANYWAY
    erased = queue_plans = 0
    read: repository.TurnSettingsRow | None = None
    if key is None:
        if common is None:
            turn = _common_turn(services, submission)
            done = await repository.save_common_turn(
                conn, turn, limits=services.limits, citus=services.citus
            )
            common = _common_outcome(submission, turn, done)
        if isinstance(common, TurnOutcome):
            return common
        if isinstance(common, repository.TurnSettingsRow):
            read = common
        else:  # the memory folder the statement queued a job for was deleted meanwhile
            erased += 1
    while erased < MAX_PLANS:
        outcome = await _plan_and_write(conn, services, submission, queue, read)
        read = None  # a plan that wrote nothing starts from a fresh read
        if isinstance(outcome, TurnOutcome):
            return outcome
        if outcome is TurnWrite.PLAN_AGAIN:
            erased += 1
            continue
        queue_plans += 1
        # the waiting job chosen was claimed or filled meanwhile: read the jobs again; after
        # as many lost races, a job whatever the count, so that racing claims never leave the
        # turn unsaved
        queue = Queue.COALESCE if queue_plans < MAX_QUEUE_PLANS else Queue.ANYWAY
    raise MemoryDeletedWhileSaving


class Queue(Enum):
    """How a plan queues the turn's consolidation under the quota of waiting jobs."""

    COALESCE = "read the waiting jobs: a new job under the quota, else join the newest with room"
    ANYWAY = "a new job whatever the count (no quota, or the last plan)"


def _common_turn(services: _Services, submission: TurnSubmission) -> repository.CommonTurn:
    """The turn as the one statement of a common turn-save writes it (see
    `repository.save_common_turn`): memory active for a user with a folder, under the quotas
    and with room in the queue (202, a new job), or memory off for the turn (201).

    The SQL gate and the Python plan decide alike (a test holds `memory_enabled_sql` to
    `effective_enablement` and the payload's model to `consolidation_model` over every
    combination of their inputs); the answer is built from what the statement read.
    """
    request = submission.request
    turn, messages = _new_rows(submission, saved_messages(request))
    job = NewJob(
        CONSOLIDATION,
        consolidation_payload(str(turn.id), request.space_id, None),
        services.settings.job_max_attempts,
        trace_parent=submission.trace_parent,
    )
    return repository.CommonTurn(
        turn, messages, job, request.language_model, submission.refuse_skipped
    )


def _common_outcome(
    submission: TurnSubmission, common: repository.CommonTurn, done: repository.CommonTurnSave
) -> _CommonOutcome:
    """The answer when the one statement wrote the turn; else what the general plan starts
    from: the settings read in the same statement, or `PLAN_AGAIN` when the statement found the
    user's memory folder deleted meanwhile."""
    if not done.written:
        if done.gated:
            return TurnWrite.PLAN_AGAIN
        if done.settings is None:
            raise RuntimeError("a turn left to the general plan comes with its settings")
        return done.settings
    turn = common.turn
    skipped = None
    if not done.queued:
        skipped = None if done.settings is None else skip_reason(done.settings.settings)
        if skipped is None:
            user = submission.principal.user_id
            raise RuntimeError(f"turn {turn.id} of {user}: skipped without a reason")
    job_id = common.job.id if done.queued else None
    body = turn_saved_json(turn.id, len(common.messages), job_id=job_id, skipped_reason=skipped)
    return TurnOutcome(QUEUED if done.queued else SKIPPED, body, replayed=False)


async def _plan_and_write(
    conn: asyncpg.Connection,
    services: _Services,
    submission: TurnSubmission,
    queue: Queue,
    read: repository.TurnSettingsRow | None = None,
) -> TurnOutcome | TurnWrite:
    """Read the settings (unless `read` holds them, read by this turn's one-statement attempt),
    plan the turn and write it; when nothing was written, why: the
    memory the plan queued a job for was deleted meanwhile (`PLAN_AGAIN`), or the waiting job
    it coalesced the turn into was claimed or filled meanwhile (`JOB_TAKEN`).

    Quotas: a caller the last quota check found over their history or their company's storage
    quota is refused (409, nothing written); so is a turn whose user's waiting consolidation
    jobs are as many as the quota allows and all full. Below that, once the user has as many
    waiting jobs as the quota, the turn is coalesced into the newest queued one. The count is
    read with the settings, in the same statement, not under a lock: turn-saves of one user in
    flight together may each add a job, so the user's waiting jobs reach at most the quota plus
    those (a lock and a fresh count on every turn-save cost a quarter of its throughput).
    """
    principal, request, key = submission.principal, submission.request, submission.idempotency_key
    settings, limits = services.settings, services.limits
    request_hash = None if key is None else idempotency.request_hash(submission.chat_id, request)
    waiting_under = limits if queue is Queue.COALESCE else None
    row = read
    if row is None or (waiting_under is None) != (row.waiting is None):
        row = await repository.select_turn_settings(
            conn,
            principal,
            request.space_id,
            key,
            waiting_under=waiting_under,
            citus=services.citus,
        )
    if row.record is not None:
        if row.record.request_hash != request_hash:
            raise IdempotencyKeyReused
        return TurnOutcome(row.record.response_status, row.record.response_body, replayed=True)
    refused = stored_quota_refusal(row.usage, limits)
    if refused is not None:
        raise refused

    skipped = skip_reason(row.settings)
    if skipped is None and not row.user_folder_exists:
        skipped = await _provision_folder(
            services.database, principal, limits, refuse_quota=submission.refuse_skipped
        )
    if skipped is not None and submission.refuse_skipped:
        raise NothingQueued(skipped)
    plan = plan_turn(request, row.settings.space, skipped)

    turn, messages = _new_rows(submission, plan.messages)
    payload = plan.job_payload(turn.id, request.space_id)
    job, job_id = None, None
    if payload is not None:
        new_job = NewJob(
            CONSOLIDATION, payload, settings.job_max_attempts, trace_parent=submission.trace_parent
        )
        job, job_id = _consolidation_job(new_job, row, services, queue)
    status = QUEUED if job is not None else SKIPPED
    body = turn_saved_json(turn.id, len(messages), job_id=job_id, skipped_reason=skipped)
    record = None
    if key is not None and request_hash is not None:
        record = history.NewIdempotencyRecord(
            key, request_hash, status, body, settings.idempotency_ttl_hours
        )
    written = await repository.write_turn(
        conn, turn, messages, job=job, record=record, citus=services.citus
    )
    if written is not TurnWrite.WRITTEN:
        return written
    return TurnOutcome(status, body, replayed=False)


def _consolidation_job(
    job: NewJob, row: repository.TurnSettingsRow, services: _Services, queue: Queue
) -> tuple[NewJob | CoalescedItem, uuid.UUID]:
    """What the write queues for the turn's consolidation `job`, and the id of the job that
    will hold the turn; 409 when every waiting job of the user is full."""
    limits = services.limits
    if queue is Queue.ANYWAY:
        return job, job.id
    placement = NEW_JOB if row.waiting is None else place_consolidation(row.waiting, limits)
    if placement is None:
        raise WaitingJobsFull(limits)
    if placement.coalesce_into is None:
        return job, job.id
    turn_id = job.payload["turn_id"]
    if not isinstance(turn_id, str):
        raise TypeError("a turn's consolidation payload names its turn")
    coalesced = CoalescedItem(
        placement.coalesce_into, turn_id, limits.job_max_turns, trace_parent=job.trace_parent
    )
    return coalesced, coalesced.job_id


def _new_rows(
    submission: TurnSubmission, saved: Sequence[SavedMessage]
) -> tuple[history.NewTurn, list[history.NewMessage]]:
    """The turn row and its message rows (stored uncounted: a history load counts what its
    budget needs, see `select_history`)."""
    principal, request = submission.principal, submission.request
    turn = history.NewTurn(
        id=uuid.uuid4(),
        company_id=principal.company_id,
        user_id=principal.user_id,
        chat_id=submission.chat_id,
        space_id=request.space_id,
        history_mode=request.history_mode.value,
        language_model=request.language_model,
    )
    messages = [history.NewMessage(s.message.role, s.message.content, s.source) for s in saved]
    return turn, messages


def turn_saved_json(
    turn_id: uuid.UUID,
    saved_messages: int,
    *,
    job_id: uuid.UUID | None,
    skipped_reason: str | None,
) -> bytes:
    """The `TurnSaved` answer, written once as bytes (the tests hold it to the schema)."""
    consolidation = (
        {"status": "queued", "job_id": job_id, "reason": None}
        if job_id is not None
        else {"status": "skipped", "job_id": None, "reason": skipped_reason}
    )
    return orjson.dumps(
        {"turn_id": turn_id, "saved_messages": saved_messages, "consolidation": consolidation}
    )


async def _provision_folder(
    database: Database, principal: Principal, limits: QuotaLimits, *, refuse_quota: bool
) -> str | None:
    """Create the per-user folder (first turn), committed on its own; the reason to skip
    consolidation if refused (by the access check, or because the company has as many users
    with memory as its quota allows; with `refuse_quota` the latter is the 409 itself).

    A refused folder must not lose the exchange: history is saved either way.
    """
    try:
        async with database.sessionmaker() as session, session.begin():
            await ensure_user_folder(
                session, principal, users_with_memory_quota=limits.company_users_with_memory
            )
    except Forbidden:
        return FOLDER_REFUSED_REASON
    except QuotaExceeded:
        if refuse_quota:
            raise
        return users_with_memory_skip_reason(limits)
    return None
