"""The history store: a turn and its messages written in one statement, read back page by page,
deleted per chat or per user. Every statement filters by (company_id, user_id): two users' chats
with the same id never meet. SQL only; never commits.

The turn write and the history read are on the orchestrator's hot path: this module exports them
as fragments that `app/turns` composes into its one statement per call (built once at import,
prepared once per connection, run on a driver connection). The rest uses the request's session.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from app.conversations.modes import Message, MessageSource, Role
from app.kit.citus import (
    HOLD_COMPANY_SHARDS_SQL,
    across_companies,
    bound_to_citus,
    on_company_node,
)
from app.kit.db.driver_pool import positional
from app.kit.principal import Principal


@dataclass(frozen=True)
class NewTurn:
    id: uuid.UUID
    company_id: str
    user_id: str
    chat_id: str
    space_id: str
    history_mode: str
    language_model: str | None


@dataclass(frozen=True)
class NewMessage:
    """A message to append. Its token count is left out (NULL): turn-save never counts, a
    history load counts a message only when the budget needs it (`select_history`)."""

    role: Role
    content: str
    source: MessageSource


@dataclass(frozen=True)
class NewIdempotencyRecord:
    """The finished response of a keyed request, replayed for `ttl_hours`."""

    key: str
    request_hash: str
    response_status: int
    response_body: bytes
    ttl_hours: int


@dataclass(frozen=True)
class StoredMessage:
    id: int
    role: Role
    content: str
    source: MessageSource
    turn_id: uuid.UUID
    created_at: datetime


def chat_lock_key(company_id: str, user_id: str, chat_id: str) -> str:
    """The advisory-lock key of one chat (ids hold no control characters, so \\x1f separates)."""
    return f"turns.chat\x1f{company_id}\x1f{user_id}\x1f{chat_id}"


def user_history_lock_key(company_id: str, user_id: str) -> str:
    """The advisory-lock key of one user's whole history: turn writes hold it shared, the
    erasure of the user exclusively (`lock_user_history`)."""
    return f"turns.user\x1f{company_id}\x1f{user_id}"


_LOCK_USER_HISTORY = text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))")
_LOCK_USER_HISTORY_SHARED = text("SELECT pg_advisory_xact_lock_shared(hashtextextended(:key, 0))")
# On a Citus coordinator, the same locks taken on the company's node, where the turn-save's
# company function takes them (its keys are taken nowhere else: docs/scaling.md)
_HOLD_COMPANY_SHARDS = text(HOLD_COMPANY_SHARDS_SQL)
_LOCK_USER_HISTORY_ON_CITUS = text(
    on_company_node(
        "lock_user_history",
        positional("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0)) IS NOT NULL AS held"),
        in_transactions=True,
    ).named_call
)
_LOCK_USER_HISTORY_SHARED_ON_CITUS = text(
    on_company_node(
        "lock_user_history_shared",
        positional(
            "SELECT pg_advisory_xact_lock_shared(hashtextextended(:key, 0)) IS NOT NULL AS held"
        ),
        in_transactions=True,
    ).named_call
)


async def lock_user_history(
    session: AsyncSession | AsyncConnection, company_id: str, user_id: str, *, shared: bool = False
) -> None:
    """Wait until no turn of the user is being written, and keep new ones out until the
    caller's transaction ends; `shared`, wait only for an erasure of the user.

    Every turn write holds the same lock shared (`TURN_LOCKS_CTE`), from before it writes until
    it commits. The eraser takes it before it deletes anything: each statement it runs after
    that sees every turn written before, with its messages and its job; and a turn write that
    arrives meanwhile waits for the erasure to commit, then writes after it.

    On a Citus coordinator it is taken on the node of the company's shards, as the turn write's
    company function takes it (app/kit/citus.py).
    """
    params = {"company_id": company_id, "key": user_history_lock_key(company_id, user_id)}
    if await bound_to_citus(session):
        await session.execute(_HOLD_COMPANY_SHARDS, params)
        lock = _LOCK_USER_HISTORY_SHARED_ON_CITUS if shared else _LOCK_USER_HISTORY_ON_CITUS
    else:
        lock = _LOCK_USER_HISTORY_SHARED if shared else _LOCK_USER_HISTORY
    await session.execute(lock, params)


# --- the turn write, as fragments of the turn-save's one statement (composed in app/turns) ------

_TURN_LOCKS_SELECT: Final = """
    SELECT pg_advisory_xact_lock_shared(hashtextextended(:user_lock_key, 0)) IS NOT NULL
               AS user_held,
           pg_advisory_xact_lock(hashtextextended(:chat_lock_key, 0)) IS NOT NULL
               AS chat_held"""
_TURN_LOCKS: Final = f"turn_locks AS MATERIALIZED ({_TURN_LOCKS_SELECT}{{source}}\n)"

TURN_LOCKS_CTE: Final = "\nWITH " + _TURN_LOCKS.format(source="")
"""The first entry of a turn write's `WITH`: the user's history lock, shared (see
`lock_user_history`), then the chat's lock, both held until the write commits. Turn writes of one
chat are therefore serialised: message ids follow commit order within a chat, and each turn's
messages are contiguous in id order, so a reader paging by id never sees half a turn nor one
turn's messages interleaved with another's."""


def turn_locks_after(gate: str) -> str:
    """`TURN_LOCKS_CTE` as a later entry of a `WITH`: the same locks, taken only when the
    earlier entry `gate` (a constant of the composing statement, never user input) has a row."""
    return ",\n" + _TURN_LOCKS.format(source=f"\n    FROM {gate}")


TURN_ROWS_CTE: Final = """, turn AS (
    INSERT INTO turns (company_id, id, user_id, chat_id, space_id, history_mode, language_model)
    SELECT :company_id, CAST(:turn_id AS uuid), :user_id, :chat_id, :space_id, :history_mode,
           :language_model
    FROM planned
), message AS (
    INSERT INTO chat_messages
        (company_id, user_id, chat_id, turn_id, role, content, source)
    SELECT :company_id, :user_id, :chat_id, CAST(:turn_id AS uuid), m.role, m.content, m.source
    FROM planned,
         unnest(CAST(:roles AS varchar[]), CAST(:contents AS varchar[]),
                CAST(:sources AS varchar[]))
             WITH ORDINALITY AS m(role, content, source, position)
    ORDER BY m.position
    RETURNING 1
)"""
"""The turn and its messages, in order; written only when the composed statement's `planned` entry
(which runs after `TURN_LOCKS_CTE`) has a row."""

# Written only while holding the key's advisory lock and after reading no live record, so the
# conflict branch only ever replaces an expired record; `stored = 0` means that did not hold.
IDEMPOTENCY_RECORD_CTE: Final = """, idempotency AS (
    INSERT INTO idempotency_keys AS k
        (company_id, user_id, key, request_hash, response_status, response_body, created_at,
         expires_at)
    SELECT :company_id, :user_id, :idempotency_key, :request_hash, :response_status,
           CAST(:response_body AS bytea), now(), now() + make_interval(hours => :ttl_hours)
    FROM planned
    ON CONFLICT (company_id, user_id, key) DO UPDATE
        SET request_hash = EXCLUDED.request_hash,
            response_status = EXCLUDED.response_status,
            response_body = EXCLUDED.response_body,
            created_at = EXCLUDED.created_at,
            expires_at = EXCLUDED.expires_at
        WHERE k.expires_at <= EXCLUDED.created_at
    RETURNING 1
)"""
"""The keyed request's record, written with the turn (only when `planned` has a row)."""


def turn_params(turn: NewTurn, messages: Sequence[NewMessage]) -> dict[str, object]:
    """The parameters of `TURN_LOCKS_CTE` and `TURN_ROWS_CTE` for `turn` and its `messages`."""
    return {
        "user_lock_key": user_history_lock_key(turn.company_id, turn.user_id),
        "chat_lock_key": chat_lock_key(turn.company_id, turn.user_id, turn.chat_id),
        "company_id": turn.company_id,
        "user_id": turn.user_id,
        "chat_id": turn.chat_id,
        "turn_id": turn.id,
        "space_id": turn.space_id,
        "history_mode": turn.history_mode,
        "language_model": turn.language_model,
        "roles": [m.role.value for m in messages],
        "contents": [m.content for m in messages],
        "sources": [m.source for m in messages],
    }


def record_params(record: NewIdempotencyRecord) -> dict[str, object]:
    """The parameters of `IDEMPOTENCY_RECORD_CTE`."""
    return {
        "idempotency_key": record.key,
        "request_hash": record.request_hash,
        "response_status": record.response_status,
        "response_body": record.response_body,
        "ttl_hours": record.ttl_hours,
    }


# --- the newest history as a fragment of the orchestrator's one-statement read (app/turns) -------

HISTORY_COLUMNS = """
    h.roles AS history_roles, h.contents AS history_contents, h.tokens AS history_tokens"""

# The newest :history_limit messages of (:company_id, :user_id, :chat_id), oldest first.
HISTORY_JOIN = """
LEFT JOIN LATERAL (
    SELECT array_agg(m.role ORDER BY m.id) AS roles, array_agg(m.content ORDER BY m.id) AS contents,
           array_agg(m.tokens ORDER BY m.id) AS tokens
    FROM (
        SELECT id, role, content, tokens FROM chat_messages
        WHERE company_id = :company_id AND user_id = :user_id AND chat_id = :chat_id
        ORDER BY id DESC LIMIT :history_limit
    ) m
) h ON true"""


_ROLES = {role.value: role for role in Role}  # a dict lookup, not an Enum call per message


@dataclass(frozen=True)
class StoredHistory:
    """The newest stored messages, oldest first, with the token counts stored with them (rows
    written before turn-save stopped counting; newer rows have none)."""

    messages: tuple[Message, ...]
    tokens: dict[str, int]  # content -> tokens (the same content always counts the same)


def stored_history_of(row: Mapping[str, Any]) -> StoredHistory:
    """The `HISTORY_COLUMNS` of a row (a chat without messages is an empty history)."""
    contents: list[str] = row["history_contents"] or []
    tokens: list[int | None] = row["history_tokens"] or []
    roles: list[str] = row["history_roles"] or []
    return StoredHistory(
        tuple(Message(_ROLES[r], c) for r, c in zip(roles, contents, strict=True)),
        {c: t for c, t in zip(contents, tokens, strict=True) if t is not None},
    )


_LIST_MESSAGES = text("""
SELECT id, role, content, source, turn_id, created_at
FROM chat_messages
WHERE company_id = :company_id AND user_id = :user_id AND chat_id = :chat_id AND id > :after_id
ORDER BY id
LIMIT :limit
""")


async def list_messages(
    session: AsyncSession,
    principal: Principal,
    chat_id: str,
    *,
    after_id: int,
    limit: int,
) -> list[StoredMessage]:
    """Up to `limit` of the caller's messages of the chat with id > `after_id`, oldest first."""
    params = {
        "company_id": principal.company_id,
        "user_id": principal.user_id,
        "chat_id": chat_id,
        "after_id": after_id,
        "limit": limit,
    }
    rows = await session.execute(_LIST_MESSAGES, params)
    return [
        StoredMessage(r.id, Role(r.role), r.content, r.source, r.turn_id, r.created_at)
        for r in rows
    ]


_DELETE_CHAT = text("""
WITH message AS (
    DELETE FROM chat_messages
    WHERE company_id = :company_id AND user_id = :user_id AND chat_id = :chat_id
    RETURNING 1
), turn AS (
    DELETE FROM turns
    WHERE company_id = :company_id AND user_id = :user_id AND chat_id = :chat_id
    RETURNING 1
)
SELECT (SELECT count(*) FROM message) + (SELECT count(*) FROM turn) AS deleted
""")


async def delete_chat(session: AsyncSession, company_id: str, user_id: str, chat_id: str) -> bool:
    """Delete the caller's messages and turns of the chat; False when there were none."""
    params = {"company_id": company_id, "user_id": user_id, "chat_id": chat_id}
    deleted = (await session.execute(_DELETE_CHAT, params)).scalar_one()
    return bool(deleted)


_CHAT_EXISTS = text("""
SELECT EXISTS (
    SELECT 1 FROM turns
    WHERE company_id = :company_id AND user_id = :user_id AND chat_id = :chat_id
) OR EXISTS (
    SELECT 1 FROM chat_messages
    WHERE company_id = :company_id AND user_id = :user_id AND chat_id = :chat_id
)
""")


async def chat_exists(session: AsyncSession, principal: Principal, chat_id: str) -> bool:
    """Whether the caller has anything stored in the chat: a turn or a message (what
    `delete_chat` would delete)."""
    params = {"company_id": principal.company_id, "user_id": principal.user_id, "chat_id": chat_id}
    return bool((await session.execute(_CHAT_EXISTS, params)).scalar_one())


@dataclass(frozen=True)
class HistoryDeletion:
    """What deleting a user's whole history removed (counts only)."""

    chats: int
    turns: int
    messages: int


_DELETE_USER_HISTORY = text("""
WITH message AS (
    DELETE FROM chat_messages WHERE company_id = :company_id AND user_id = :user_id
    RETURNING chat_id
), turn AS (
    DELETE FROM turns WHERE company_id = :company_id AND user_id = :user_id
    RETURNING chat_id
)
SELECT (SELECT count(*) FROM (SELECT chat_id FROM message UNION SELECT chat_id FROM turn) c)
           AS chats,
       (SELECT count(*) FROM turn) AS turns,
       (SELECT count(*) FROM message) AS messages
""")


async def delete_user_history(
    session: AsyncSession, company_id: str, user_id: str
) -> HistoryDeletion:
    """Delete every chat of the user: all their turns and messages, in the caller's transaction."""
    params = {"company_id": company_id, "user_id": user_id}
    row = (await session.execute(_DELETE_USER_HISTORY, params)).one()
    return HistoryDeletion(chats=row.chats, turns=row.turns, messages=row.messages)


# --- retention: the worker's housekeeping deletes old history -----------------------------------

_DELETE_OLD_MESSAGES = text("""
DELETE FROM chat_messages
WHERE (company_id, id) IN (
    SELECT company_id, id FROM chat_messages
    WHERE created_at < now() - make_interval(days => :days)
    LIMIT :batch
)
""")

# A turn past the retention whose messages are all gone (deleted above, or it saved none).
_DELETE_EMPTY_OLD_TURNS = text("""
DELETE FROM turns t
WHERE t.created_at < now() - make_interval(days => :days)
  AND NOT EXISTS (
      SELECT 1 FROM chat_messages m
      WHERE m.company_id = t.company_id AND m.user_id = t.user_id AND m.chat_id = t.chat_id
        AND m.turn_id = t.id
  )
""")


async def delete_history_older_than(engine: AsyncEngine, days: int, *, batch: int) -> int:
    """Delete stored messages older than `days` days, then the turns left without messages
    that are as old; returns the rows deleted.

    Messages go in batches of `batch`, each its own short transaction, so a first run over a
    large backlog never holds one long transaction or a lock on millions of rows.
    """
    deleted = 0
    while True:
        # retention is one setting of the instance, applied by age to every company at once
        async with engine.begin() as conn, across_companies(conn):
            result = await conn.execute(_DELETE_OLD_MESSAGES, {"days": days, "batch": batch})
        count = int(result.rowcount)
        deleted += count
        if count < batch:
            break
    async with engine.begin() as conn, across_companies(conn):
        result = await conn.execute(_DELETE_EMPTY_OLD_TURNS, {"days": days})
    return deleted + int(result.rowcount)
