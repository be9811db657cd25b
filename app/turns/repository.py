"""SQL of the orchestrator's two calls: the single SELECT behind `/context`, the settings read
of `/turns`, idempotency locks and records, and the rare condensation enqueue.

Hot-path reads are plain `text()` statements built once at import and read as tuples: no ORM
objects, no per-request compilation, one round trip each. Flushes, never commits.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import Row, RowMapping, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from app.consolidation.queue import PENDING_STATUSES, JobPayload, enqueue_job
from app.conversations.modes import Message, Role
from app.enablement.decision import (
    FLAG_ALLOW_WITH_WEB_SEARCH,
    FLAG_CONTEXT_MEMORY,
    CompanyFlags,
    UserState,
)
from app.enablement.repository import SpaceRecord, UserMemoryConfig
from app.folders.acl import AclEntry, FolderNode, Permission, user_folder_path

# --- the enablement inputs, shared by both reads ------------------------------------------------

_SETTINGS_COLUMNS = """
    (SELECT f.enabled FROM company_feature_flags f
     WHERE f.company_id = :company_id AND f.flag = :flag_context_memory) AS flag_context_memory,
    (SELECT f.enabled FROM company_feature_flags f
     WHERE f.company_id = :company_id AND f.flag = :flag_allow) AS flag_allow,
    s.space_id IS NOT NULL AS space_saved, s.context_memory AS space_context_memory,
    s.web_search, s.use_orchestrator_language_model, s.language_model, s.max_tokens,
    u.context_memory AS user_context_memory"""

_SETTINGS_JOINS = """
FROM (SELECT 1) AS one
LEFT JOIN space_settings s ON s.company_id = :company_id AND s.space_id = :space_id
LEFT JOIN user_settings u ON u.company_id = :company_id AND u.user_id = :user_id"""


@dataclass(frozen=True)
class SettingsRow:
    """What the enablement decision needs, and how the space consolidates."""

    flags: CompanyFlags
    space: SpaceRecord
    user: UserState | None


def _settings_params(company_id: str, user_id: str, space_id: str) -> dict[str, object]:
    return {
        "company_id": company_id,
        "user_id": user_id,
        "space_id": space_id,
        "flag_context_memory": FLAG_CONTEXT_MEMORY,
        "flag_allow": FLAG_ALLOW_WITH_WEB_SEARCH,
    }


def _settings(row: Row[tuple[object, ...]]) -> SettingsRow:
    m = row._mapping
    flags = CompanyFlags(
        context_memory=bool(m["flag_context_memory"]), allow_with_web_search=bool(m["flag_allow"])
    )
    space = SpaceRecord()
    if m["space_saved"]:
        config = UserMemoryConfig(
            bool(m["use_orchestrator_language_model"]),
            str(m["language_model"]),
            int(m["max_tokens"]),
        )
        space = SpaceRecord(
            context_memory=m["space_context_memory"],
            web_search=bool(m["web_search"]),
            user_memory=config,
            saved=True,
        )
    user_setting = m["user_context_memory"]
    user = None if user_setting is None else UserState(bool(user_setting))
    return SettingsRow(flags, space, user)


# --- /context: ONE statement --------------------------------------------------------------------


@dataclass(frozen=True)
class StoredProfile:
    version: int
    content: str
    tokens: int


@dataclass(frozen=True)
class StoredHistory:
    """The newest stored messages, oldest first, with the token counts stored at save time."""

    messages: tuple[Message, ...]
    tokens: dict[str, int]  # content -> tokens (the same content always counts the same)


@dataclass(frozen=True)
class ContextRow:
    settings: SettingsRow
    profile: StoredProfile | None
    folder: FolderNode | None  # the folder holding the profile, with its parent
    history: StoredHistory | None  # None when loading was not asked for


def _acl_lateral(folder: str, alias: str) -> str:
    # `folder` and `alias` are constants of this module, never user input
    return f"""
LEFT JOIN LATERAL (
    SELECT array_agg(a.principal_kind) AS kinds, array_agg(a.principal_id) AS principals,
           array_agg(a.permission) AS permissions
    FROM folder_acl a WHERE a.company_id = {folder}.company_id AND a.folder_id = {folder}.id
) {alias} ON true"""  # noqa: S608


_CONTEXT_SELECT = f"""
SELECT {_SETTINGS_COLUMNS},
    v.version AS profile_version, v.content AS profile_content, v.tokens AS profile_tokens,
    fo.path AS folder_path, fo.inherit_access AS folder_inherit,
    fa.kinds AS folder_kinds, fa.principals AS folder_principals,
    fa.permissions AS folder_permissions,
    pf.path AS parent_path, pf.inherit_access AS parent_inherit,
    pa.kinds AS parent_kinds, pa.principals AS parent_principals,
    pa.permissions AS parent_permissions,
    {{history_columns}}
{_SETTINGS_JOINS}
LEFT JOIN memory_files mf ON mf.company_id = :company_id AND mf.user_id = :user_id
LEFT JOIN memory_versions v
    ON v.company_id = mf.company_id AND v.user_id = mf.user_id AND v.version = mf.head_version
LEFT JOIN folders fo ON fo.company_id = mf.company_id AND fo.id = mf.folder_id
LEFT JOIN folders pf ON pf.company_id = fo.company_id AND pf.id = fo.parent_id
{_acl_lateral("fo", "fa")}
{_acl_lateral("pf", "pa")}
{{history_join}}"""

_HISTORY_COLUMNS = (
    "h.roles AS history_roles, h.contents AS history_contents, h.tokens AS history_tokens"
)
_HISTORY_JOIN = """
LEFT JOIN LATERAL (
    SELECT array_agg(m.role ORDER BY m.id) AS roles, array_agg(m.content ORDER BY m.id) AS contents,
           array_agg(m.tokens ORDER BY m.id) AS tokens
    FROM (
        SELECT id, role, content, tokens FROM chat_messages
        WHERE company_id = :company_id AND user_id = :user_id AND chat_id = :chat_id
        ORDER BY id DESC LIMIT :history_limit
    ) m
) h ON true"""
_NO_HISTORY_COLUMNS = (
    "NULL::text[] AS history_roles, NULL::text[] AS history_contents, NULL::int[] AS history_tokens"
)

_CONTEXT_WITH_HISTORY = text(
    _CONTEXT_SELECT.format(history_columns=_HISTORY_COLUMNS, history_join=_HISTORY_JOIN)
)
_CONTEXT_WITHOUT_HISTORY = text(
    _CONTEXT_SELECT.format(history_columns=_NO_HISTORY_COLUMNS, history_join="")
)


async def select_context(
    session: AsyncSession,
    company_id: str,
    user_id: str,
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
    params = _settings_params(company_id, user_id, space_id)
    if history_limit is None:
        statement = _CONTEXT_WITHOUT_HISTORY
    else:
        statement = _CONTEXT_WITH_HISTORY
        params |= {"chat_id": chat_id, "history_limit": history_limit}
    row = (await session.execute(statement, params)).one()
    m = row._mapping
    profile = None
    if m["profile_version"] is not None:
        profile = StoredProfile(m["profile_version"], m["profile_content"], m["profile_tokens"])
    folder = None
    if m["folder_path"] is not None:
        parent = None
        if m["parent_path"] is not None:
            # the tree is two levels deep; a grandparent's entries are never read (under-grants)
            parent = FolderNode(
                m["parent_path"], m["parent_inherit"], _entries(m, "parent"), parent=None
            )
        folder = FolderNode(m["folder_path"], m["folder_inherit"], _entries(m, "folder"), parent)
    history = None
    if history_limit is not None:
        contents: list[str] = m["history_contents"] or []
        tokens: list[int] = m["history_tokens"] or []
        roles: list[str] = m["history_roles"] or []
        history = StoredHistory(
            tuple(Message(Role(r), c) for r, c in zip(roles, contents, strict=True)),
            dict(zip(contents, tokens, strict=True)),
        )
    return ContextRow(_settings(row), profile, folder, history)


def _entries(m: RowMapping, prefix: str) -> tuple[AclEntry, ...]:
    kinds = m[f"{prefix}_kinds"] or []
    principals = m[f"{prefix}_principals"] or []
    permissions = m[f"{prefix}_permissions"] or []
    return tuple(
        AclEntry("user" if kind == "user" else "group", principal, Permission(permission))
        for kind, principal, permission in zip(kinds, principals, permissions, strict=True)
        if kind is not None
    )


# --- /turns ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IdempotencyRecord:
    request_hash: str
    response_status: int
    response_body: bytes


@dataclass(frozen=True)
class TurnSettingsRow:
    settings: SettingsRow
    user_folder_exists: bool
    record: IdempotencyRecord | None  # the live record of the request's Idempotency-Key


_TURN_SETTINGS = text(f"""
SELECT {_SETTINGS_COLUMNS},
    EXISTS (SELECT 1 FROM folders fo
            WHERE fo.company_id = :company_id AND fo.path = :folder_path) AS user_folder_exists,
    k.request_hash, k.response_status, k.response_body
{_SETTINGS_JOINS}
LEFT JOIN idempotency_keys k
    ON k.company_id = :company_id AND k.user_id = :user_id AND k.key = :idempotency_key
   AND k.expires_at > now()
""")  # noqa: S608 - constant fragments of this module


async def select_turn_settings(
    session: AsyncSession,
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
    params = _settings_params(company_id, user_id, space_id) | {
        "folder_path": user_folder_path(user_id),
        "idempotency_key": idempotency_key,
    }
    row = (await session.execute(_TURN_SETTINGS, params)).one()
    m = row._mapping
    record = None
    if m["request_hash"] is not None:
        record = IdempotencyRecord(
            m["request_hash"], m["response_status"], bytes(m["response_body"])
        )
    return TurnSettingsRow(_settings(row), bool(m["user_folder_exists"]), record)


def idempotency_lock_key(company_id: str, user_id: str, key: str) -> str:
    """The advisory-lock key of an Idempotency-Key, scoped to its (company, user)."""
    return f"turns.idempotency\x1f{company_id}\x1f{user_id}\x1f{key}"


_TRY_LOCK = text("SELECT pg_try_advisory_xact_lock(hashtextextended(:lock_key, 0))")


async def try_lock_idempotency_key(
    session: AsyncSession, company_id: str, user_id: str, key: str
) -> bool:
    """Take the key's transaction-level advisory lock without waiting; False while another
    request with the same key is in flight (the lock is released when that one commits)."""
    lock_key = idempotency_lock_key(company_id, user_id, key)
    return bool((await session.execute(_TRY_LOCK, {"lock_key": lock_key})).scalar_one())


_PRUNE = text("DELETE FROM idempotency_keys WHERE expires_at <= now()")


async def prune_idempotency_keys(executor: AsyncSession | AsyncConnection | AsyncEngine) -> int:
    """Delete expired idempotency records; returns how many. Given an engine, commits its own
    transaction; given a session or connection, runs in the caller's."""
    if isinstance(executor, AsyncEngine):
        async with executor.begin() as conn:
            return await prune_idempotency_keys(conn)
    result = await executor.execute(_PRUNE)
    return int(result.rowcount)  # type: ignore[attr-defined]


# --- the rare path: a profile over its budget ----------------------------------------------------

_LOCK_USER_CONDENSATION = text("SELECT pg_advisory_xact_lock(hashtextextended(:lock_key, 0))")
_PENDING_CONDENSATION = text("""
SELECT id FROM jobs
WHERE company_id = :company_id AND user_id = :user_id AND kind = 'condensation'
  AND status = ANY(CAST(:pending AS varchar[]))
ORDER BY created_at
LIMIT 1
""")


async def enqueue_condensation_once(
    session: AsyncSession,
    company_id: str,
    user_id: str,
    *,
    payload: JobPayload,
    max_attempts: int,
) -> tuple[uuid.UUID, bool]:
    """The user's pending condensation job, queued now if there is none: (job id, queued now).

    Concurrent callers are serialised by an advisory lock on the user held until commit, and the
    check runs as a new statement after it, so two loads never queue two condensations.
    """
    lock_key = f"turns.condensation\x1f{company_id}\x1f{user_id}"
    await session.execute(_LOCK_USER_CONDENSATION, {"lock_key": lock_key})
    params = {"company_id": company_id, "user_id": user_id, "pending": list(PENDING_STATUSES)}
    pending = (await session.execute(_PENDING_CONDENSATION, params)).scalar_one_or_none()
    if pending is not None:
        return pending, False
    job_id = await enqueue_job(
        session,
        company_id=company_id,
        user_id=user_id,
        kind="condensation",
        payload=payload,
        max_attempts=max_attempts,
    )
    return job_id, True
