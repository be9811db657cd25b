"""SQL of the profile domain: versions written by compare-and-set on `memory_files.head_version`,
reads of the head and of retained versions, retention, clearing, and the user's stored switch.

Flushes (executes), never commits: the caller owns the transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    CTE,
    ColumnElement,
    Integer,
    Row,
    Select,
    String,
    Table,
    and_,
    bindparam,
    delete,
    func,
    literal,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.dml import ReturningDelete, ReturningInsert, ReturningUpdate

from app.enablement.models import UserSettings
from app.kit.pagination import INTEGER_MAX, Page, PageRequest, page_of
from app.profiles.document import Profile, render
from app.profiles.errors import MemoryFileMissing, VersionConflict
from app.profiles.models import MemoryFile, MemoryVersion
from app.profiles.versions import (
    ExpectedHead,
    HeadState,
    VersionInfo,
    VersionRow,
    VersionSource,
    content_sha256,
    operations_json,
)

# The columns are named as the dataclass fields, which `_version_info/version_row` rely on.
_INFO_COLUMNS = tuple(getattr(MemoryVersion, field.name) for field in fields(VersionInfo))
_ROW_COLUMNS = (*_INFO_COLUMNS, MemoryVersion.content)


def _version_info(row: Row[Any]) -> VersionInfo:
    return VersionInfo(**{column.key: row._mapping[column.key] for column in _INFO_COLUMNS})


def version_row(row: Row[Any]) -> VersionRow:
    return VersionRow(**{column.key: row._mapping[column.key] for column in _ROW_COLUMNS})


def _owner(company_id: str, user_id: str) -> tuple[Any, ...]:
    return (MemoryVersion.company_id == company_id, MemoryVersion.user_id == user_id)


# The worker's statements, built once and bound per call (:owner_company, :owner_user, ...): each
# call then costs neither the statement's construction nor SQLAlchemy's cache key for it.
# (Not named as columns: an UPDATE reserves its columns' names for its SET clause.)
_COMPANY = bindparam("owner_company", type_=String)
_USER = bindparam("owner_user", type_=String)


def _owner_params(company_id: str, user_id: str) -> dict[str, object]:
    return {"owner_company": company_id, "owner_user": user_id}


# --- the compare-and-set write -------------------------------------------------------------------


_FILES = cast(Table, MemoryFile.__table__)


def _advance_head_statement() -> ReturningUpdate[tuple[int]]:
    """The compare-and-set: `head_version` becomes :next_head where it is :expected_head."""
    return (
        update(_FILES)
        .where(
            _FILES.c.company_id == _COMPANY,
            _FILES.c.user_id == _USER,
            _FILES.c.head_version == bindparam("expected_head", type_=Integer),
        )
        .values(head_version=bindparam("next_head", type_=Integer), updated_at=func.now())
        .returning(_FILES.c.head_version)
    )


_ADVANCE_HEAD = _advance_head_statement()


async def _advance_head(session: AsyncSession, head: ExpectedHead) -> bool:
    """The compare-and-set: `head_version` becomes `head.version + 1` if and only if it is
    `head.version` now (PostgreSQL re-checks the WHERE on the newest row after a row-lock wait);
    False when the head moved or the memory.md row is missing."""
    params = _owner_params(head.company_id, head.user_id) | {
        "expected_head": head.version,
        "next_head": head.version + 1,
    }
    return (await session.execute(_ADVANCE_HEAD, params)).scalar_one_or_none() is not None


_VERSIONS = cast(Table, MemoryVersion.__table__)
_VERSION_VALUES = (
    "company_id",
    "user_id",
    "version",
    "content",
    "sha256",
    "tokens",
    "reason",
    "operations",
    "source_turn_ids",
    "model",
    "tokens_in",
    "tokens_out",
    "job_id",
)


def _write_version_statement() -> ReturningInsert[tuple[datetime]]:
    """The compare-and-set and the version's insert in ONE statement (built once): the insert
    selects its row, bound as `v_<column>`, from the head's advance, so it happens only when
    the head advanced."""
    advanced = _advance_head_statement().cte("advanced")
    row = select(
        *(bindparam(f"v_{name}", type_=_VERSIONS.c[name].type) for name in _VERSION_VALUES)
    ).select_from(advanced)
    return (
        insert(_VERSIONS)
        .from_select(list(_VERSION_VALUES), row)
        .on_conflict_do_nothing(index_elements=["company_id", "user_id", "version"])
        .returning(_VERSIONS.c.created_at)
    )


_WRITE_VERSION = _write_version_statement()


async def write_version(
    session: AsyncSession,
    head: ExpectedHead,
    profile: Profile,
    *,
    source: VersionSource,
    tokens: int,
) -> VersionRow:
    """Write `profile` as version `head.version + 1`, if and only if the head is `head.version`.

    One statement: the compare-and-set `UPDATE memory_files SET head_version = expected + 1 ...
    WHERE head_version = expected`: concurrent writers of one user queue on the row lock and all
    but one find the head moved (PostgreSQL re-checks the WHERE on the newest row), raising
    `VersionConflict`; and, only when the head advanced, the version's insert: its primary key
    (company, user, version) is the unique constraint behind the CAS, and a conflict there is a
    `VersionConflict` too.
    After a `VersionConflict` the transaction holds a half-done write: roll it back.
    A missing memory.md row raises `MemoryFileMissing`. The frontmatter must already be the
    service's (see `versions.stamp`); `tokens` is stored as given, `source` as its columns.
    """
    company_id, user_id, expected_version = head.company_id, head.user_id, head.version
    if profile.user_id != user_id:
        raise ValueError("the profile's frontmatter must name its owner")
    content = render(profile)
    values = {
        "company_id": company_id,
        "user_id": user_id,
        "version": expected_version + 1,
        "content": content,
        "sha256": content_sha256(content),
        "tokens": tokens,
        "reason": source.reason,
        "operations": operations_json(source.operations),
        "source_turn_ids": list(source.source_turn_ids),
        "model": source.model,
        "tokens_in": source.tokens_in,
        "tokens_out": source.tokens_out,
        "job_id": source.job_id,
    }
    params = _owner_params(company_id, user_id) | {
        "expected_head": expected_version,
        "next_head": expected_version + 1,
    }
    params |= {f"v_{name}": value for name, value in values.items()}
    created_at = (await session.execute(_WRITE_VERSION, params)).scalar_one_or_none()
    if created_at is None:  # the head had moved (or the insert met the version: ours moved it)
        current = await select_head_version(session, company_id, user_id)
        if current is None:
            raise MemoryFileMissing
        raise VersionConflict(expected_version, current)
    return VersionRow(**values, created_at=created_at)  # type: ignore[arg-type]


# --- reads -------------------------------------------------------------------------------------


async def select_head_version(
    session: AsyncSession, company_id: str, user_id: str, *, lock: bool = False
) -> int | None:
    """memory.md's head version number (None without the row); `lock` row-locks it first,
    waiting for an in-flight writer, so that later reads in the transaction see its result."""
    statement = select(MemoryFile.head_version).where(
        MemoryFile.company_id == company_id, MemoryFile.user_id == user_id
    )
    if lock:
        statement = statement.with_for_update()
    return (await session.execute(statement)).scalar_one_or_none()


_SELECT_HEAD_STATE = (
    select(MemoryFile.head_version, *_ROW_COLUMNS)
    .select_from(MemoryFile)
    .outerjoin(
        MemoryVersion,
        and_(
            MemoryVersion.company_id == MemoryFile.company_id,
            MemoryVersion.user_id == MemoryFile.user_id,
            MemoryVersion.version == MemoryFile.head_version,
        ),
    )
    .where(MemoryFile.company_id == _COMPANY, MemoryFile.user_id == _USER)
)


async def select_head_state(
    session: AsyncSession, company_id: str, user_id: str
) -> HeadState | None:
    """memory.md's head number and head version in one statement; None without a memory.md."""
    params = _owner_params(company_id, user_id)
    row = (await session.execute(_SELECT_HEAD_STATE, params)).first()
    if row is None:
        return None
    head = None if row.version is None else version_row(row)
    return HeadState(company_id, user_id, row.head_version, head)


def _writer_state_statement() -> Select[Any]:
    head = _SELECT_HEAD_STATE.lateral("head")
    one = select(literal(1).label("one")).subquery("one")
    setting = (
        select(UserSettings.context_memory)
        .where(UserSettings.company_id == _COMPANY, UserSettings.user_id == _USER)
        .scalar_subquery()
        .label("user_setting")
    )
    return select(setting, *head.c).select_from(one.outerjoin(head, true()))


_SELECT_WRITER_STATE = _writer_state_statement()


async def select_writer_state(
    session: AsyncSession, company_id: str, user_id: str
) -> tuple[bool | None, HeadState | None]:
    """What a write of the worker reads under the user's memory lock, in one statement: the
    user's stored switch (`select_user_setting`) and the head (`select_head_state`)."""
    row = (await session.execute(_SELECT_WRITER_STATE, _owner_params(company_id, user_id))).one()
    if row.head_version is None:
        return row.user_setting, None
    head = None if row.version is None else version_row(row)
    return row.user_setting, HeadState(company_id, user_id, row.head_version, head)


async def read_head(session: AsyncSession, company_id: str, user_id: str) -> VersionRow | None:
    """The current version, or None when the user has no profile (none yet, or cleared)."""
    state = await select_head_state(session, company_id, user_id)
    return None if state is None else state.row


async def read_version(
    session: AsyncSession, company_id: str, user_id: str, version: int
) -> VersionRow | None:
    statement = select(*_ROW_COLUMNS).where(
        *_owner(company_id, user_id), MemoryVersion.version == version
    )
    row = (await session.execute(statement)).first()
    return None if row is None else version_row(row)


async def list_versions(
    session: AsyncSession, company_id: str, user_id: str, page: PageRequest
) -> Page[VersionInfo]:
    """Retained versions without content, newest first, cursor on the version number."""
    before = page.integer("version", maximum=INTEGER_MAX)
    statement = select(*_INFO_COLUMNS).where(*_owner(company_id, user_id))
    if before is not None:
        statement = statement.where(MemoryVersion.version < before)
    statement = statement.order_by(MemoryVersion.version.desc()).limit(page.limit + 1)
    rows = [_version_info(row) for row in (await session.execute(statement)).all()]
    return page_of(rows, page.limit, lambda info: {"version": info.version})


def every_version(company_id: str, user_id: str) -> Select[Any]:
    """Every retained version with content, oldest first, as `version_row` reads it (the export
    streams it)."""
    return select(*_ROW_COLUMNS).where(*_owner(company_id, user_id)).order_by(MemoryVersion.version)


async def read_all_versions(
    session: AsyncSession, company_id: str, user_id: str
) -> list[VersionRow]:
    """Every retained version with content, oldest first."""
    rows = (await session.execute(every_version(company_id, user_id))).all()
    return [version_row(row) for row in rows]


async def previous_version_number(
    session: AsyncSession, company_id: str, user_id: str, before: int
) -> int | None:
    """The newest retained version older than `before`, or None."""
    statement = select(func.max(MemoryVersion.version)).where(
        *_owner(company_id, user_id), MemoryVersion.version < before
    )
    return (await session.execute(statement)).scalar_one_or_none()


# --- retention and clearing ----------------------------------------------------------------------


def _prune_versions_statement() -> ReturningDelete[int]:
    owner = (MemoryVersion.company_id == _COMPANY, MemoryVersion.user_id == _USER)
    newest = (
        select(MemoryVersion.version)
        .where(*owner)
        .order_by(MemoryVersion.version.desc())
        .limit(bindparam("keep", type_=Integer))
        .subquery()
    )
    cutoff = select(func.min(newest.c.version)).scalar_subquery()
    head = (
        select(MemoryFile.head_version)
        .where(MemoryFile.company_id == _COMPANY, MemoryFile.user_id == _USER)
        .scalar_subquery()
    )
    return (
        delete(MemoryVersion)
        .where(*owner, MemoryVersion.version < cutoff)
        .where(MemoryVersion.version != head)
        .returning(MemoryVersion.version)
        .execution_options(synchronize_session=False)
    )


_PRUNE_VERSIONS = _prune_versions_statement()


def prune_params(company_id: str, user_id: str, keep: int) -> dict[str, object]:
    """The parameters of `prune_versions`'s statement and of `prune_versions_cte`."""
    if keep < 1:
        raise ValueError("keep at least the head")
    return _owner_params(company_id, user_id) | {"keep": keep}


def prune_versions_cte(when: ColumnElement[bool]) -> CTE:
    """`prune_versions` as a data-modifying CTE of another statement (built once by its
    caller, in the transaction that wrote the version), deleting only when `when` holds;
    bound by `prune_params`."""
    return _prune_versions_statement().where(when).cte("pruned")


async def prune_versions(session: AsyncSession, company_id: str, user_id: str, keep: int) -> int:
    """Delete all but the newest `keep` versions (never the head); the number deleted.

    Versions are contiguous, so what remains is the contiguous newest run. Call it in the
    transaction that wrote the version: the CAS row lock then serialises it per user.
    """
    params = prune_params(company_id, user_id, keep)
    return len((await session.execute(_PRUNE_VERSIONS, params)).all())


async def delete_profile(
    session: AsyncSession, company_id: str, user_id: str, head_version: int
) -> int:
    """Clear the profile: delete every version and advance the head past them, by CAS.

    The memory.md row, the folder and the settings stay. The head number is *not* reset: it
    becomes `head_version + 1` with no version row (a cleared head), so numbering continues
    and an ETag is never reused — a client holding `"5"` from before the clear gets 412, never
    overwrites the next profile. Raises `VersionConflict` if the head moved. Returns the number
    of versions deleted.
    """
    if not await _advance_head(session, ExpectedHead(company_id, user_id, head_version)):
        raise VersionConflict(head_version, await select_head_version(session, company_id, user_id))
    statement = (
        delete(MemoryVersion)
        .where(*_owner(company_id, user_id))
        .returning(MemoryVersion.version)
        .execution_options(synchronize_session=False)
    )
    return len((await session.execute(statement)).all())


# --- the memory file's life: created with the user's folder, locked and deleted at opt-out -----


_INSERT_MEMORY_FILE = insert(_FILES).on_conflict_do_nothing(
    index_elements=["company_id", "user_id"]
)


async def insert_memory_file(
    session: AsyncSession, company_id: str, user_id: str, folder_id: uuid.UUID
) -> None:
    """The user's `memory.md` row, never indexed and hidden in chat; kept as is when it exists."""
    values = {"company_id": company_id, "user_id": user_id, "folder_id": folder_id}
    await session.execute(
        _INSERT_MEMORY_FILE, values | {"skip_ingestion": True, "hidden_in_chat": True}
    )


_LOCK_USER_MEMORY = select(
    func.pg_advisory_xact_lock(func.hashtextextended(bindparam("key", type_=String), 0))
)


async def lock_user_memory(session: AsyncSession, company_id: str, user_id: str) -> None:
    """A transaction-scoped advisory lock on one user's memory (ids are printable, so the unit
    separator cannot be forged; a hash collision only serialises two users needlessly)."""
    key = "\x1f".join(("user-memory", company_id, user_id))
    await session.execute(_LOCK_USER_MEMORY, {"key": key})


async def lock_memory_file(session: AsyncSession, company_id: str, user_id: str) -> bool:
    """Row-lock the user's `memory.md` (waiting for an in-flight writer); True when it exists."""
    statement = (
        select(MemoryFile.head_version)
        .where(MemoryFile.company_id == company_id, MemoryFile.user_id == user_id)
        .with_for_update()
    )
    return (await session.execute(statement)).first() is not None


async def delete_memory_versions(session: AsyncSession, company_id: str, user_id: str) -> int:
    deleted = (
        delete(MemoryVersion)
        .where(MemoryVersion.company_id == company_id, MemoryVersion.user_id == user_id)
        .returning(MemoryVersion.version)
        .cte("deleted")
    )
    return (await session.execute(select(func.count()).select_from(deleted))).scalar_one()


async def delete_memory_file(session: AsyncSession, company_id: str, user_id: str) -> bool:
    statement = (
        delete(MemoryFile)
        .where(MemoryFile.company_id == company_id, MemoryFile.user_id == user_id)
        .returning(MemoryFile.user_id)
        .execution_options(synchronize_session=False)
    )
    return (await session.execute(statement)).first() is not None


# --- the user's stored context-memory switch -------------------------------------------------


_SELECT_USER_SETTING = select(UserSettings.context_memory).where(
    UserSettings.company_id == _COMPANY, UserSettings.user_id == _USER
)


async def select_user_setting(session: AsyncSession, company_id: str, user_id: str) -> bool | None:
    params = _owner_params(company_id, user_id)
    return (await session.execute(_SELECT_USER_SETTING, params)).scalar_one_or_none()


# --- the head profile as a fragment of the orchestrator's one-statement read (app/turns) ---------

# Joins `memory_files mf` and its head version `v` for (:company_id, :user_id); `mf.folder_id`
# is the folder holding the profile, for `folders.repository.folder_joins`.
HEAD_PROFILE_COLUMNS = """
    v.version AS profile_version, v.content AS profile_content, v.tokens AS profile_tokens"""

HEAD_PROFILE_JOINS = """
LEFT JOIN memory_files mf ON mf.company_id = :company_id AND mf.user_id = :user_id
LEFT JOIN memory_versions v
    ON v.company_id = :company_id AND v.user_id = mf.user_id AND v.version = mf.head_version"""

HEAD_PROFILE_FOLDER_ID = "mf.folder_id"


@dataclass(frozen=True)
class StoredProfile:
    """The head version as stored: its number, its document and the tokens of its body."""

    version: int
    content: str
    tokens: int


def stored_profile_of(row: Mapping[str, Any]) -> StoredProfile | None:
    """The `HEAD_PROFILE_COLUMNS` of a row; None when the user has no profile yet."""
    if row["profile_version"] is None:
        return None
    return StoredProfile(row["profile_version"], row["profile_content"], row["profile_tokens"])


async def count_users_with_memory(session: AsyncSession, company_id: str) -> int:
    """How many users of the company have a memory profile (a `memory.md`)."""
    count = await session.scalar(
        select(func.count()).select_from(MemoryFile).where(MemoryFile.company_id == company_id)
    )
    return int(count or 0)
