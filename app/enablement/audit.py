"""The audit log of settings changes: record an event in the caller's transaction, list them,
and what an erasure leaves of it.

An event holds who (the actor's company and user id), when, what and old -> new of the changed
fields only; never memory content.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from sqlalchemy import and_, delete, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.enablement.models import AuditEvent
from app.kit.principal import Principal

JsonObject = Mapping[str, object]

USER_ERASED: Final = "user.erased"
"""The one kind of event an erasure keeps about the erased user (target `user`, the user's id):
when it happened and counts of what it deleted, never content. Earlier ones are kept too."""
ERASED_ACTOR: Final = "erased-user"
"""Who an erased user's remaining changes of company settings name as their actor."""


@dataclass(frozen=True)
class Actor:
    """Who changed something: a user of a company. A user id names a person only together with
    its company (an operator of one company changes the settings of others)."""

    company_id: str
    user_id: str

    @classmethod
    def of(cls, principal: Principal) -> Actor:
        """The caller, as the verified token names them."""
        return cls(principal.company_id, principal.user_id)


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


@dataclass(frozen=True)
class AuditEntry:
    """One event to record: who did what to which target, and the changed fields' values."""

    actor: Actor
    action: str
    target_kind: str
    target_id: str
    old: JsonObject | None
    new: JsonObject | None


def changed_fields(old: JsonObject, new: JsonObject) -> tuple[dict[str, object], dict[str, object]]:
    """The (old, new) values of the keys whose value differs, recursing into nested objects.

    `changed_fields({"a": 1, "b": {"c": 2, "d": 3}}, {"a": 1, "b": {"c": 2, "d": 4}})` is
    `({"b": {"d": 3}}, {"b": {"d": 4}})`; both are empty when nothing changed.
    """
    before: dict[str, object] = {}
    after: dict[str, object] = {}
    for key in old.keys() | new.keys():
        old_value, new_value = old.get(key), new.get(key)
        if isinstance(old_value, Mapping) and isinstance(new_value, Mapping):
            nested_old, nested_new = changed_fields(old_value, new_value)
            if nested_old or nested_new:
                before[key], after[key] = nested_old, nested_new
        elif old_value != new_value:
            before[key], after[key] = old_value, new_value
    return before, after


async def record_event(session: AsyncSession, company_id: str, entry: AuditEntry) -> None:
    """Append an event; it commits or rolls back with the change it describes."""
    await session.execute(
        insert(AuditEvent).values(
            company_id=company_id,
            actor_company_id=entry.actor.company_id,
            actor_id=entry.actor.user_id,
            action=entry.action,
            target_kind=entry.target_kind,
            target_id=entry.target_id,
            old=None if entry.old is None else dict(entry.old),
            new=None if entry.new is None else dict(entry.new),
        )
    )


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
    by_user = and_(AuditEvent.actor_company_id == company_id, AuditEvent.actor_id == user_id)
    anonymised = await session.execute(
        update(AuditEvent)
        .where(by_user, kept)
        .values(actor_id=ERASED_ACTOR)
        .returning(AuditEvent.id)
    )
    return AuditErasure(deleted=len(deleted.all()), anonymised=len(anonymised.all()))
