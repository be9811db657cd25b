"""Explicit consolidation (`POST /v1/me/memory/consolidations`): one exchange handed in directly.

The exchange is stored as a turn of the reserved chat `_memory-consolidations` (so job payloads
stay ids only, the worker consolidates it like any turn, and the caller's export shows it), then
queued. With `wait`, the request commits first and then polls the job until it finishes.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import orjson
from pydantic import BaseModel, ConfigDict

from app.conversations.modes import HistoryMode
from app.conversations.schemas import MessageIn, ResponseIn, SpaceId, Text
from app.jobs import repository as jobs
from app.jobs.repository import JobRow
from app.kit.config import Settings
from app.kit.db.engine import Database
from app.kit.principal import Principal
from app.kit.tracing import current_traceparent
from app.turns.save import TurnSubmission, save_turn
from app.turns.schemas import TurnRequest

RESERVED_CHAT_ID = "_memory-consolidations"
POLL_SECONDS = 0.1
FINISHED = frozenset({"succeeded", "dead"})


class ConsolidationRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    space_id: SpaceId
    user: Text
    assistant: Text


async def request_consolidation(
    database: Database,
    principal: Principal,
    body: ConsolidationRequest,
    *,
    settings: Settings,
) -> uuid.UUID:
    """Store the exchange and queue its consolidation, committed before returning the job id.

    Memory not effectively enabled for (space, caller) → 409 with the reason; nothing is stored.
    """
    turn = TurnRequest(
        space_id=body.space_id,
        history_mode=HistoryMode.NEVER,
        messages=[MessageIn(role="user", content=body.user)],
        response=ResponseIn(content=body.assistant),
    )
    # refuse_skipped: not enabled is a 409 with the reason, and nothing is written
    submission = TurnSubmission(
        principal, RESERVED_CHAT_ID, turn, refuse_skipped=True, trace_parent=current_traceparent()
    )
    outcome = await save_turn(database, submission, settings=settings)
    return uuid.UUID(orjson.loads(outcome.body)["consolidation"]["job_id"])


async def wait_for_job(
    database: Database, principal: Principal, job_id: uuid.UUID, timeout_seconds: float
) -> JobRow:
    """Poll the job (one short read each time) until it succeeded or died, or the timeout."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        async with database.sessionmaker() as session:
            job = await jobs.get_job(session, principal.company_id, principal.user_id, job_id)
        if job.status in FINISHED or time.monotonic() >= deadline:
            return job
        await asyncio.sleep(POLL_SECONDS)
