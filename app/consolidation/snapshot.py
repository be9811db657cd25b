"""What one claim's read step sees (`Snapshot`) and the step that reads it: one short
transaction over the spaces' enablement, the head profile and the claimed turns."""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass

from app.consolidation.exchanges import select_exchanges
from app.consolidation.kinds import CONSOLIDATION
from app.consolidation.rules import Exchange
from app.db import Database
from app.enablement.service import load_enablement
from app.jobs.queue import ClaimedJob, JobRef
from app.llm import resolve_model_name
from app.profiles.document import Profile
from app.profiles.service import load_profile


@dataclass(frozen=True)
class Snapshot:
    """What the read step saw. The decision is made against it and written on `version`."""

    profile: Profile
    version: int
    exchanges: tuple[Exchange, ...]
    turn_ids: tuple[str, ...]
    budget: int
    model: str


async def read_snapshot(
    database: Database, claimed: ClaimedJob, default_model: str
) -> Snapshot | None:
    """One short transaction. None when nothing is left to do (memory off, turns gone).

    Raises `NotFound` when the memory was deleted (opt-out) after the jobs were queued.
    """
    company_id, user_id = claimed.company_id, claimed.user_id
    async with database.sessionmaker() as session, session.begin():
        budgets: dict[str, int | None] = {}  # per space; None where memory is off
        enabled: list[tuple[JobRef, int]] = []
        for job in claimed.jobs:
            space_id = _text(job.payload.get("space_id"))
            if space_id is None:
                continue
            if space_id not in budgets:
                context = await load_enablement(session, company_id, space_id, user_id)
                budgets[space_id] = context.user_memory.max_tokens if context.enabled else None
            budget = budgets[space_id]
            if budget is not None:
                enabled.append((job, budget))
        if not enabled:
            return None
        profile, version = await load_profile(session, company_id, user_id)
        turn_ids = [turn for job, _ in enabled for turn in _turn_ids(job)]
        found = await select_exchanges(session, company_id, user_id, turn_ids)
    if claimed.kind == CONSOLIDATION and not found:
        return None
    newest, budget = enabled[-1]  # the newest turn's space sets the budget and the model
    return Snapshot(
        profile=profile,
        version=version,
        exchanges=tuple(exchange for _, exchange in found),
        turn_ids=tuple(str(turn_id) for turn_id, _ in found),
        budget=budget,
        model=resolve_model_name(_text(newest.payload.get("model")) or default_model),
    )


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _turn_ids(job: JobRef) -> list[uuid.UUID]:
    """`turn_id` (turn-save) and `turn_ids` (a list) are both read; malformed ids are skipped."""
    raw = job.payload.get("turn_ids")
    values = list(raw) if isinstance(raw, list) else []
    single = job.payload.get("turn_id")
    if isinstance(single, str):
        values.append(single)
    ids = []
    for value in values:
        with contextlib.suppress(ValueError):
            ids.append(uuid.UUID(value))
    return ids
