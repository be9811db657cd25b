"""Turn-save (`POST /v1/chats/{chat_id}/turns`): store the exchange per mode, durably, and queue
a consolidation when memory is active. Never waits for a model.

Runs on a driver connection. Without an `Idempotency-Key`: one settings read, then one write
(turn, messages and job together), each atomic on its own, no BEGIN/COMMIT round trips: the
write is the only statement that changes anything. With a key, one transaction: the key's
advisory lock, the settings and record read, the write (record included), COMMIT, all before
the answer. The first enabled turn of a user also creates the per-user folder (folders
service), in a transaction of its own: creating it is idempotent, and a turn whose write then
fails leaves only that folder, which the next turn would have created anyway.

Against an erasure of the user (`DELETE /v1/me`) the write is all or nothing, and so is its
plan: an erasure that commits before the write is seen by it (the memory folder the plan
queued a job for is gone, so nothing is written and the turn is planned again on what is
stored now: a fresh start, whose job is consolidated like any other); one that starts while
the write is in flight waits for it to commit and deletes the whole turn
(`repository.write_turn`). The same holds against an opt-out, which deletes the folder too.
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass

import asyncpg
import orjson

from app.auth import Principal
from app.config import Settings
from app.consolidation.kinds import CONSOLIDATION
from app.conversations import repository as history
from app.conversations.schemas import check_message_limits
from app.db import Database
from app.errors import Conflict, Forbidden, Unprocessable
from app.folders.service import ensure_user_folder
from app.jobs.enqueue import NewJob
from app.tokens import TokenCounter, TokenCounters
from app.turns import idempotency, repository
from app.turns.plan import TurnPlan, plan_turn, skip_reason
from app.turns.schemas import TurnRequest

QUEUED, SKIPPED = 202, 201
MAX_PLANS = 3  # a turn planned again this often lost its memory to an erasure each time
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
    and nothing is written (explicit consolidation).
    """

    principal: Principal
    chat_id: str
    request: TurnRequest
    idempotency_key: str | None = None
    refuse_skipped: bool = False


async def save_turn(
    database: Database, submission: TurnSubmission, *, settings: Settings, tokens: TokenCounters
) -> TurnOutcome:
    """Save the turn and queue its consolidation (202), or say why it was skipped (201).

    With an idempotency key (scoped to the caller): while another request holds the key -> 409;
    a live record with the same request hash -> that response replayed, nothing written; with
    another hash -> 422. Otherwise the work is done and its response stored with the key, in the
    same transaction, so a replay can never see a turn that was rolled back.
    """
    request = submission.request
    check_message_limits(
        settings,
        messages=request.messages,
        placeholder_history=request.placeholder_history,
        texts=[("response.content", request.response.content)],
    )
    async with database.driver.connection() as conn:
        # without a key the write is one statement, atomic on its own: no BEGIN/COMMIT
        keyed = submission.idempotency_key is not None
        async with conn.transaction() if keyed else contextlib.nullcontext():
            return await _save(conn, database, submission, settings, tokens)


async def _save(
    conn: asyncpg.Connection,
    database: Database,
    submission: TurnSubmission,
    settings: Settings,
    tokens: TokenCounters,
) -> TurnOutcome:
    principal, key = submission.principal, submission.idempotency_key
    # inside the caller's transaction: the lock lasts until COMMIT
    if key is not None and not await repository.try_lock_idempotency_key(
        conn, principal.company_id, principal.user_id, key
    ):
        raise Conflict(
            "A request with this Idempotency-Key is still in progress; retry later.",
            headers={"Retry-After": "1"},
        )
    for _ in range(MAX_PLANS):
        outcome = await _plan_and_write(conn, database, submission, settings, tokens)
        if outcome is not None:
            return outcome
    raise Conflict(
        "Your memory was deleted while this turn was being saved; nothing was saved, retry.",
        headers={"Retry-After": "1"},
    )


async def _plan_and_write(
    conn: asyncpg.Connection,
    database: Database,
    submission: TurnSubmission,
    settings: Settings,
    tokens: TokenCounters,
) -> TurnOutcome | None:
    """Read the settings, plan the turn and write it; None when nothing was written because
    the memory the plan queued a job for was deleted meanwhile (plan again)."""
    principal, request, key = submission.principal, submission.request, submission.idempotency_key
    request_hash = None if key is None else idempotency.request_hash(submission.chat_id, request)
    row = await repository.select_turn_settings(
        conn, principal.company_id, principal.user_id, request.space_id, key
    )
    if row.record is not None:
        if row.record.request_hash != request_hash:
            raise Unprocessable.field(
                f"header.{idempotency.HEADER}",
                f"This {idempotency.HEADER} was already used with a different request.",
            )
        return TurnOutcome(row.record.response_status, row.record.response_body, replayed=True)

    skipped = skip_reason(row.settings)
    if skipped is None and not row.user_folder_exists:
        skipped = await _provision_folder(database, principal)
    if skipped is not None and submission.refuse_skipped:
        raise Conflict(f"Nothing was queued: {skipped}")
    plan = plan_turn(request, row.settings.space, skipped)

    turn, messages = _new_rows(submission, plan, tokens.stored)
    payload = plan.job_payload(turn.id, request.space_id)
    job = None
    if payload is not None:
        job = NewJob(CONSOLIDATION, payload, settings.job_max_attempts)
    status = QUEUED if job is not None else SKIPPED
    body = turn_saved_json(turn.id, len(messages), job=job, skipped_reason=skipped)
    record = None
    if key is not None and request_hash is not None:
        record = history.NewIdempotencyRecord(
            key, request_hash, status, body, settings.idempotency_ttl_hours
        )
    if not await repository.write_turn(conn, turn, messages, job=job, record=record):
        return None
    return TurnOutcome(status, body, replayed=False)


def _new_rows(
    submission: TurnSubmission, plan: TurnPlan, counter: TokenCounter
) -> tuple[history.NewTurn, list[history.NewMessage]]:
    """The turn row and its message rows, each message counted once, here."""
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
    count = counter.count
    messages = [
        history.NewMessage(s.message.role, s.message.content, s.source, count(s.message.content))
        for s in plan.messages
    ]
    return turn, messages


def turn_saved_json(
    turn_id: uuid.UUID,
    saved_messages: int,
    *,
    job: NewJob | None,
    skipped_reason: str | None,
) -> bytes:
    """The `TurnSaved` answer, written once as bytes (the tests hold it to the schema)."""
    consolidation = (
        {"status": "queued", "job_id": job.id, "reason": None}
        if job is not None
        else {"status": "skipped", "job_id": None, "reason": skipped_reason}
    )
    return orjson.dumps(
        {"turn_id": turn_id, "saved_messages": saved_messages, "consolidation": consolidation}
    )


async def _provision_folder(database: Database, principal: Principal) -> str | None:
    """Create the per-user folder (first turn), committed on its own; the reason to skip
    consolidation if refused.

    A refused folder must not lose the exchange: history is saved either way.
    """
    try:
        async with database.sessionmaker() as session, session.begin():
            await ensure_user_folder(session, principal)
    except Forbidden:
        return FOLDER_REFUSED_REASON
    return None
