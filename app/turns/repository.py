"""SQL of the orchestrator's two calls: the single SELECT behind `/context`, the settings read
and the single write of `/turns`, idempotency locks and records.

The hot statements are composed once, at import, from the fragments and row mappers their
owners export (enablement, profiles, folders, conversations), and run on a driver connection
(asyncpg): prepared once per connection, positional arguments, rows read as records. No ORM
objects, no per-request compilation, one round trip each. Never commits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from app.auth import Principal
from app.conversations.repository import (
    HISTORY_COLUMNS,
    HISTORY_JOIN,
    IDEMPOTENCY_RECORD_CTE,
    TURN_LOCKS_CTE,
    TURN_ROWS_CTE,
    NewIdempotencyRecord,
    NewMessage,
    NewTurn,
    StoredHistory,
    record_params,
    stored_history_of,
    turn_params,
)
from app.db import positional
from app.enablement.repository import (
    ENABLEMENT_COLUMNS,
    ENABLEMENT_JOINS,
    EnablementInputs,
    enablement_inputs_of,
    enablement_params,
)
from app.errors import Conflict
from app.folders.acl import FolderNode, user_folder_path
from app.folders.repository import (
    FOLDER_COLUMNS,
    folder_joins,
    folder_node_of,
    user_folder_key_share,
)
from app.jobs.enqueue import NewJob, enqueue_job_cte, enqueue_params
from app.profiles.repository import (
    HEAD_PROFILE_COLUMNS,
    HEAD_PROFILE_FOLDER_ID,
    HEAD_PROFILE_JOINS,
    StoredProfile,
    stored_profile_of,
)

# --- /context: ONE statement --------------------------------------------------------------------


@dataclass(frozen=True)
class ContextRow:
    settings: EnablementInputs
    profile: StoredProfile | None
    folder: FolderNode | None  # the folder holding the profile, with its parent
    history: StoredHistory | None  # None when loading was not asked for


def _context_select(*, with_history: bool) -> tuple[str, tuple[str, ...]]:
    history_columns = (
        HISTORY_COLUMNS
        if with_history
        else "NULL::text[] AS history_roles, NULL::text[] AS history_contents, "
        "NULL::int[] AS history_tokens"
    )
    # constant fragments of their owners, never user input
    sql = f"""
SELECT {ENABLEMENT_COLUMNS}, {HEAD_PROFILE_COLUMNS}, {FOLDER_COLUMNS}, {history_columns}
FROM (SELECT 1) AS one
{ENABLEMENT_JOINS}
{HEAD_PROFILE_JOINS}
{folder_joins(HEAD_PROFILE_FOLDER_ID)}
{HISTORY_JOIN if with_history else ""}"""  # noqa: S608
    return positional(sql)


_CONTEXT_WITH_HISTORY = _context_select(with_history=True)
_CONTEXT_WITHOUT_HISTORY = _context_select(with_history=False)


async def select_context(
    conn: asyncpg.Connection,
    principal: Principal,
    space_id: str,
    chat_id: str,
    *,
    history_limit: int | None,
) -> ContextRow:
    """Everything `/context` needs, in ONE statement: both company flags, the space and user
    settings, the head profile version (content and stored tokens), the folder holding it with
    its parent and both ACLs, and, when `history_limit` is given, the newest `history_limit`
    stored messages of the chat with their stored token counts.
    """
    params = enablement_params(principal.company_id, principal.user_id, space_id)
    if history_limit is None:
        sql, names = _CONTEXT_WITHOUT_HISTORY
    else:
        sql, names = _CONTEXT_WITH_HISTORY
        params |= {"chat_id": chat_id, "history_limit": history_limit}
    row = await conn.fetchrow(sql, *[params[name] for name in names])
    return ContextRow(
        enablement_inputs_of(row),
        stored_profile_of(row),
        folder_node_of(row),
        None if history_limit is None else stored_history_of(row),
    )


# --- /turns ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IdempotencyRecord:
    request_hash: str
    response_status: int
    response_body: bytes


@dataclass(frozen=True)
class TurnSettingsRow:
    settings: EnablementInputs
    user_folder_exists: bool
    record: IdempotencyRecord | None  # the live record of the request's Idempotency-Key


_TURN_SETTINGS = positional(f"""
SELECT {ENABLEMENT_COLUMNS},
    EXISTS (SELECT 1 FROM folders fo
            WHERE fo.company_id = :company_id AND fo.path = :folder_path) AS user_folder_exists,
    k.request_hash, k.response_status, k.response_body
FROM (SELECT 1) AS one
{ENABLEMENT_JOINS}
LEFT JOIN idempotency_keys k
    ON k.company_id = :company_id AND k.user_id = :user_id AND k.key = :idempotency_key
   AND k.expires_at > now()
""")  # noqa: S608 - constant fragments of their owners


async def select_turn_settings(
    conn: asyncpg.Connection,
    company_id: str,
    user_id: str,
    space_id: str,
    idempotency_key: str | None,
) -> TurnSettingsRow:
    """The enablement inputs, whether the per-user folder exists, and the live idempotency
    record of `idempotency_key` (expired records read as absent), in ONE statement.

    Run it after `try_lock_idempotency_key`: as a new statement it sees a record committed by
    the previous holder of the lock even if that commit happened just before we got it.
    """
    params = enablement_params(company_id, user_id, space_id) | {
        "folder_path": user_folder_path(user_id),
        "idempotency_key": idempotency_key,
    }
    sql, names = _TURN_SETTINGS
    row = await conn.fetchrow(sql, *[params[name] for name in names])
    record = None
    if row["request_hash"] is not None:
        record = IdempotencyRecord(
            row["request_hash"], row["response_status"], bytes(row["response_body"])
        )
    return TurnSettingsRow(enablement_inputs_of(row), bool(row["user_folder_exists"]), record)


def idempotency_lock_key(company_id: str, user_id: str, key: str) -> str:
    """The advisory-lock key of an Idempotency-Key, scoped to its (company, user)."""
    return f"turns.idempotency\x1f{company_id}\x1f{user_id}\x1f{key}"


# The write goes ahead (`planned` has a row) once the turn's locks are held and, when it queues
# a job, while the user's memory folder still exists: it is held until commit (see `write_turn`).
_PLANNED = ", planned AS MATERIALIZED (SELECT 1 FROM turn_locks)"
_PLANNED_WITH_FOLDER = f", planned AS MATERIALIZED ({user_folder_key_share('turn_locks')}\n)"


def _turn_write(with_job: bool, with_record: bool) -> tuple[str, tuple[str, ...]]:
    stored = "(SELECT count(*) FROM idempotency)" if with_record else "0"
    # constant fragments of their owners, never user input
    parts = [
        TURN_LOCKS_CTE,
        _PLANNED_WITH_FOLDER if with_job else _PLANNED,
        TURN_ROWS_CTE,
        enqueue_job_cte("planned") if with_job else "",
        IDEMPOTENCY_RECORD_CTE if with_record else "",
        "\nSELECT (SELECT count(*) FROM planned) AS planned,"  # noqa: S608
        f" (SELECT count(*) FROM message) AS saved, {stored} AS stored",
    ]
    return positional("".join(parts))


_TURN_WRITE = {
    (job, record): _turn_write(job, record) for job in (False, True) for record in (False, True)
}


async def write_turn(
    conn: asyncpg.Connection,
    turn: NewTurn,
    messages: Sequence[NewMessage],
    *,
    job: NewJob | None = None,
    record: NewIdempotencyRecord | None = None,
) -> bool:
    """Write the turn, its messages (in order) and optionally its job and idempotency record,
    in ONE statement (atomic on its own, or part of the caller's transaction); True when
    written, False when nothing was written because the user's memory folder is gone.

    The statement first takes the user's history lock shared and the chat's lock
    (`TURN_LOCKS_CTE`: an erasure of the user waits for the write to commit, or the write
    waits for the erasure to commit; turns of one chat commit in order). With a job, it then
    key-share-locks the user's memory folder and writes only if the folder is still there:
    the settings that planned the job were read before, and an erasure or opt-out may have
    deleted the memory since, even while this statement waited for its locks. Held until
    commit, the folder is deleted, with the pending jobs, only after this turn is written.
    False asks the caller to plan the turn again on what is stored now.
    """
    params = turn_params(turn, messages)
    if job is not None:
        params |= enqueue_params(job) | {"folder_path": user_folder_path(turn.user_id)}
    if record is not None:
        params |= record_params(record)
    sql, names = _TURN_WRITE[(job is not None, record is not None)]
    row = await conn.fetchrow(sql, *[params[name] for name in names])
    if not row["planned"]:
        return False
    if record is not None and row["stored"] != 1:
        # a live record appeared although we hold its lock: never save the turn twice
        raise Conflict("This Idempotency-Key was used concurrently; retry the request.")
    return True


_TRY_LOCK = "SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))"


async def try_lock_idempotency_key(
    conn: asyncpg.Connection, company_id: str, user_id: str, key: str
) -> bool:
    """Take the key's transaction-level advisory lock without waiting; False while another
    request with the same key is in flight (the lock is released when that one commits).
    Call it inside a transaction: outside one the lock would end with the statement."""
    lock_key = idempotency_lock_key(company_id, user_id, key)
    return bool(await conn.fetchval(_TRY_LOCK, lock_key))


_PRUNE = text("DELETE FROM idempotency_keys WHERE expires_at <= now()")


async def prune_idempotency_keys(executor: AsyncSession | AsyncConnection | AsyncEngine) -> int:
    """Delete expired idempotency records; returns how many. Given an engine, commits its own
    transaction; given a session or connection, runs in the caller's."""
    if isinstance(executor, AsyncEngine):
        async with executor.begin() as conn:
            return await prune_idempotency_keys(conn)
    result = await executor.execute(_PRUNE)
    return int(result.rowcount)  # type: ignore[attr-defined]


_DELETE_USER_KEYS = text(
    "DELETE FROM idempotency_keys WHERE company_id = :company_id AND user_id = :user_id"
)


async def delete_user_idempotency_keys(session: AsyncSession, company_id: str, user_id: str) -> int:
    """Erasure: delete every idempotency record of the user, live or expired; returns how many."""
    params = {"company_id": company_id, "user_id": user_id}
    result = await session.execute(_DELETE_USER_KEYS, params)
    return int(result.rowcount)  # type: ignore[attr-defined]
