"""SQL of the company export and import: every company table read in primary-key order, rows
inserted in batches, the import's lock and emptiness check, and the two touches an imported
history needs (the head number around its versions, the versions' original times).

Every statement filters by, or writes, one `company_id`. Flushes, never commits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from sqlalchemy import Select, Table, exists, func, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from app.conversations.models import IdempotencyKey
from app.enablement.models import AuditEvent, CompanyFeatureFlag
from app.jobs.models import Job
from app.portability.kinds import KINDS, RecordKind, table_of
from app.profiles.models import MemoryFile, MemoryVersion

COMPANY_TABLES: Final[tuple[Table, ...]] = (
    *(kind.table for kind in KINDS),
    table_of(Job),
    table_of(IdempotencyKey),
)
"""Every table holding rows of a company: an import needs all of them empty."""


# --- export -------------------------------------------------------------------------------------


def company_rows(kind: RecordKind, company_id: str) -> Select[Any]:
    """The company's rows of `kind`, its exported columns only, in the kind's order."""
    table = kind.table
    columns = [table.c[spec.name] for spec in kind.type.fields]
    return (
        select(*columns)
        .where(table.c.company_id == company_id)
        .order_by(*(table.c[name] for name in kind.order_by))
    )


async def snapshot_time(conn: AsyncConnection, company_id: str) -> datetime:
    """The start of the current transaction: the instant its snapshot shows. It reads one of
    the company's tables too: on a Citus cluster the snapshot on the node holding the company
    starts at the first statement that reaches it, and this must be that statement (on one
    PostgreSQL it is one index probe more)."""
    statement = select(func.now(), func.count()).where(CompanyFeatureFlag.company_id == company_id)
    moment: datetime = (await conn.execute(statement)).one()[0]
    return moment


# --- import -------------------------------------------------------------------------------------


async def lock_company_import(session: AsyncSession, company_id: str) -> None:
    """A transaction-scoped advisory lock: imports into one company run one at a time."""
    key = "\x1f".join(("company-import", company_id))
    await session.execute(select(func.pg_advisory_xact_lock(func.hashtextextended(key, 0))))


async def company_holds_data(session: AsyncSession, company_id: str) -> bool:
    """True when any company table has a row of `company_id` (one statement)."""
    held = or_(*(exists().where(table.c.company_id == company_id) for table in COMPANY_TABLES))
    found: bool = (await session.execute(select(held))).scalar_one()
    return found


async def newest_event(
    session: AsyncSession, company_id: str, action: str
) -> Mapping[str, object] | None:
    """`new` of the company's newest audit event `action` about the company itself."""
    statement = (
        select(AuditEvent.new)
        .where(
            AuditEvent.company_id == company_id,
            AuditEvent.action == action,
            AuditEvent.target_kind == "company",
            AuditEvent.target_id == company_id,
        )
        .order_by(AuditEvent.id.desc())
        .limit(1)
    )
    found: Mapping[str, object] | None = (await session.execute(statement)).scalar_one_or_none()
    return found


async def insert_rows(
    session: AsyncSession, kind: RecordKind, company_id: str, rows: Sequence[Mapping[str, object]]
) -> None:
    """Insert `rows` of `kind` into `company_id`, in order (renumbered ids come from the
    target's sequences, in this order)."""
    if rows:
        values = [{**row, "company_id": company_id} for row in rows]
        await session.execute(insert(kind.table), values)


async def set_head_version(
    session: AsyncSession,
    company_id: str,
    user_id: str,
    head_version: int,
    updated_at: datetime | None = None,
) -> None:
    """Put memory.md's head number where an imported history needs it (before its first
    version, so the compare-and-set writes continue from there; after the last, the source's)."""
    values: dict[str, object] = {"head_version": head_version}
    if updated_at is not None:
        values["updated_at"] = updated_at
    statement = (
        update(MemoryFile)
        .where(MemoryFile.company_id == company_id, MemoryFile.user_id == user_id)
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    await session.execute(statement)


async def set_version_time(
    session: AsyncSession, company_id: str, user_id: str, version: int, created_at: datetime
) -> None:
    """An imported version keeps the time it was written at its source."""
    statement = (
        update(MemoryVersion)
        .where(
            MemoryVersion.company_id == company_id,
            MemoryVersion.user_id == user_id,
            MemoryVersion.version == version,
        )
        .values(created_at=created_at)
        .execution_options(synchronize_session=False)
    )
    await session.execute(statement)
