"""SQL of the user's export: everything stored about one user as statements in the order of the
export's document, which the export streams from its snapshot a batch at a time, and the lock
that runs one export of a user at a time.

Every statement filters by the owner (company, user); the records name exactly the columns
exported (jobs: no payload, no error text). Reads only.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, Select, Subquery, func, select, union_all
from sqlalchemy.ext.asyncio import AsyncSession

from app.conversations.models import ChatMessage, Turn
from app.enablement.audit import AuditRecord
from app.enablement.models import AuditEvent, UserSettings
from app.jobs.models import Job
from app.kit.db.base import Base

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


@dataclass(frozen=True)
class TurnRecord:
    id: uuid.UUID
    chat_id: str
    space_id: str
    history_mode: str
    language_model: str | None
    created_at: datetime


@dataclass(frozen=True)
class MessageRecord:
    id: int
    chat_id: str
    turn_id: uuid.UUID
    role: str
    content: str
    source: str
    created_at: datetime


@dataclass(frozen=True)
class JobRecord:
    id: uuid.UUID
    kind: str
    status: str
    outcome: str | None
    version: int | None
    created_at: datetime
    finished_at: datetime | None


def _columns(record: type[DataclassInstance], table: type[Base]) -> list[Any]:
    """The columns of `table` named by the fields of `record`, in the fields' order."""
    return [getattr(table, field.name) for field in fields(record)]


# --- chats: one entry per chat, by first activity, each with its turns and messages -------------


def _chat_activity(company_id: str, user_id: str) -> Subquery:
    """Each chat of the user with its first activity: its oldest turn or message."""
    activity = union_all(
        select(Turn.chat_id, Turn.created_at).where(
            Turn.company_id == company_id, Turn.user_id == user_id
        ),
        select(ChatMessage.chat_id, ChatMessage.created_at).where(
            ChatMessage.company_id == company_id, ChatMessage.user_id == user_id
        ),
    ).subquery("activity")
    return (
        select(activity.c.chat_id, func.min(activity.c.created_at).label("first_at"))
        .group_by(activity.c.chat_id)
        .subquery("chats")
    )


def _chat_order(chats: Subquery) -> tuple[ColumnElement[Any], ...]:
    """By first activity, then by id in code point order (`COLLATE "C"`, as Python compares)."""
    return (chats.c.first_at, chats.c.chat_id.collate("C"))


def chat_ids(company_id: str, user_id: str) -> Select[Any]:
    """The ids of the user's chats, in the document's order."""
    chats = _chat_activity(company_id, user_id)
    return select(chats.c.chat_id).order_by(*_chat_order(chats))


def chat_turns(company_id: str, user_id: str) -> Select[Any]:
    """Every turn of the user as `TurnRecord` columns: chat by chat in the order of `chat_ids`,
    then by (created_at, id) within a chat."""
    chats = _chat_activity(company_id, user_id)
    return (
        select(*_columns(TurnRecord, Turn))
        .join(chats, chats.c.chat_id == Turn.chat_id)
        .where(Turn.company_id == company_id, Turn.user_id == user_id)
        .order_by(*_chat_order(chats), Turn.created_at, Turn.id)
    )


def chat_messages(company_id: str, user_id: str) -> Select[Any]:
    """Every stored message of the user as `MessageRecord` columns: chat by chat in the order
    of `chat_ids`, then in stored order (id) within a chat."""
    chats = _chat_activity(company_id, user_id)
    return (
        select(*_columns(MessageRecord, ChatMessage))
        .join(chats, chats.c.chat_id == ChatMessage.chat_id)
        .where(ChatMessage.company_id == company_id, ChatMessage.user_id == user_id)
        .order_by(*_chat_order(chats), ChatMessage.id)
    )


# --- the rest ----------------------------------------------------------------------------------


def jobs(company_id: str, user_id: str) -> Select[Any]:
    """The user's jobs as `JobRecord` columns, oldest first."""
    return (
        select(*_columns(JobRecord, Job))
        .where(Job.company_id == company_id, Job.user_id == user_id)
        .order_by(Job.created_at, Job.id)
    )


def audit_events(company_id: str, user_id: str) -> Select[Any]:
    """Events about the user's own setting and memory (target kind `user`), as `AuditRecord`
    columns, oldest first.

    Events the user caused on the company's flags and spaces are left out on purpose: they are
    the company's record of its settings (an erasure anonymises them, it does not delete them),
    and those written before events named the actor's company carry the event's company as the
    actor's, which does not prove who acted (operators act on other companies).
    """
    return (
        select(*_columns(AuditRecord, AuditEvent))
        .where(
            AuditEvent.company_id == company_id,
            AuditEvent.target_kind == "user",
            AuditEvent.target_id == user_id,
        )
        .order_by(AuditEvent.id)
    )


# --- the snapshot ------------------------------------------------------------------------------


async def try_lock_export(session: AsyncSession, company_id: str, user_id: str) -> bool:
    """Take the user's export lock for the rest of the transaction, without waiting: False when
    another transaction (on any replica) holds it. Transaction-scoped, so it goes with the
    transaction, also when the connection breaks. (Ids are printable, so the unit separator
    cannot be forged; a hash collision only makes two users' exports wait for each other.)"""
    key = "\x1f".join(("user-memory-export", company_id, user_id))
    statement = select(func.pg_try_advisory_xact_lock(func.hashtextextended(key, 0)))
    locked: bool = (await session.execute(statement)).scalar_one()
    return locked


async def snapshot_time(session: AsyncSession, company_id: str, user_id: str) -> datetime:
    """The start of the current transaction: the instant its snapshot shows. The export's first
    statement, and it reads one of the company's tables (the user's settings row, by its
    primary key): on a Citus cluster the snapshot on the node holding the company starts at the
    first statement that reaches it, and this must be that statement, before the export lock
    (a statement without a company table, run on the coordinator). On one PostgreSQL it is one
    index probe more."""
    statement = select(func.now(), func.count()).where(
        UserSettings.company_id == company_id, UserSettings.user_id == user_id
    )
    moment: datetime = (await session.execute(statement)).one()[0]
    return moment
