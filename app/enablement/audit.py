"""The audit log of settings changes: record an event in the caller's transaction (the log's
writes are `app.kit.audited_setting`'s), list them, and what an erasure leaves of it.

An event holds who (the actor's company and user id), when, what and old -> new of the changed
fields only; never memory content.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from sqlalchemy import and_, delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.enablement.models import AuditEvent
from app.kit.audited_setting import Actor, AuditEntry, AuditLog

__all__ = [  # the trail's vocabulary, `Actor` and `AuditEntry` included (defined in the kit)
    "AUDIT_LOG",
    "ERASED_ACTOR",
    "USER_ERASED",
    "Actor",
    "AuditEntry",
    "AuditErasure",
    "AuditRecord",
    "erase_user_events",
    "record_event",
    "select_events",
]

USER_ERASED: Final = "user.erased"
"""The one kind of event an erasure keeps about the erased user (target `user`, the user's id):
when it happened and counts of what it deleted, never content. Earlier ones are kept too."""
ERASED_ACTOR: Final = "erased-user"
"""Who an erased user's remaining changes of company settings name as their actor."""


@dataclass(frozen=True)
class AuditRecord:
    id: int
    occurred_at: datetime
    actor_company_id: str
    actor_id: str
    action: str
    target_kind: str
    target_id: str
    old: dict[str, Any] | None
    new: dict[str, Any] | None


AUDIT_LOG: Final = AuditLog(AuditEvent)
record_event = AUDIT_LOG.record


async def select_events(
    session: AsyncSession, company_id: str, *, before_id: int | None, limit: int
) -> list[AuditRecord]:
    """Up to `limit` events of the company, newest first (by id), older than `before_id`."""
    statement = (
        select(
            AuditEvent.id,
            AuditEvent.occurred_at,
            AuditEvent.actor_company_id,
            AuditEvent.actor_id,
            AuditEvent.action,
            AuditEvent.target_kind,
            AuditEvent.target_id,
            AuditEvent.old,
            AuditEvent.new,
        )
        .where(AuditEvent.company_id == company_id)
        .order_by(AuditEvent.id.desc())
        .limit(limit)
    )
    if before_id is not None:
        statement = statement.where(AuditEvent.id < before_id)
    rows = (await session.execute(statement)).all()
    return [AuditRecord(*row) for row in rows]


@dataclass(frozen=True)
class AuditErasure:
    deleted: int  # events about the user (their setting, their memory's deletion)
    anonymised: int  # events the user caused on flags and spaces, in any company's log


async def erase_user_events(session: AsyncSession, company_id: str, user_id: str) -> AuditErasure:
    """Erasure: delete the company's events about the user, except `USER_ERASED` ones, and
    name `ERASED_ACTOR` instead of the user in the events they caused on other targets (the
    company keeps what changed in its flags and spaces, and when, but not who changed it).

    The user's events are those whose actor is (`company_id`, `user_id`), both matching: an
    operator of another company with the same user id keeps their events, and the user's own
    changes of other companies' flags (as an operator) are anonymised in those companies' logs
    too. The actor's company stays: it names no person.
    """
    kept = AuditEvent.action != USER_ERASED
    about_user = and_(AuditEvent.target_kind == "user", AuditEvent.target_id == user_id)
    deleted = await session.execute(
        delete(AuditEvent)
        .where(AuditEvent.company_id == company_id, about_user, kept)
        .returning(AuditEvent.id)
    )
    anonymised = await AUDIT_LOG.anonymise_actor(
        session, Actor(company_id, user_id), ERASED_ACTOR, sparing=USER_ERASED
    )
    return AuditErasure(deleted=len(deleted.all()), anonymised=anonymised)
