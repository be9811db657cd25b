"""SQL of the company registry, the platform log and the offboarding records. Flushes, never
commits: the caller owns the transaction.

`companies` is a company table: each statement here names one company, except the listing,
which the caller runs inside `across_companies`. The two platform tables are reference tables
on Citus: a statement on them is one statement wherever it runs.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, insert, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.companies.models import Company, CompanyOffboarding, PlatformEvent


@dataclass(frozen=True)
class CompanyRecord:
    company_id: str
    display_name: str
    origin: str
    created_at: datetime


_COMPANY_COLUMNS = (Company.company_id, Company.display_name, Company.origin, Company.created_at)


async def insert_company(
    session: AsyncSession, company_id: str, display_name: str, origin: str
) -> CompanyRecord | None:
    """Register a company; None when it is registered already (the row is left as it is)."""
    row = (
        await session.execute(
            pg_insert(Company)
            .values(company_id=company_id, display_name=display_name, origin=origin)
            .on_conflict_do_nothing(index_elements=[Company.company_id])
            .returning(*_COMPANY_COLUMNS)
        )
    ).one_or_none()
    return None if row is None else CompanyRecord(*row)


async def select_company(session: AsyncSession, company_id: str) -> CompanyRecord | None:
    row = (
        await session.execute(select(*_COMPANY_COLUMNS).where(Company.company_id == company_id))
    ).one_or_none()
    return None if row is None else CompanyRecord(*row)


async def select_companies(
    session: AsyncSession, *, after: str | None, limit: int
) -> list[CompanyRecord]:
    """Up to `limit` companies in the order of their ids, after `after`. Every company's shard
    on Citus: the caller surrounds it with `across_companies`."""
    statement = select(*_COMPANY_COLUMNS).order_by(Company.company_id).limit(limit)
    if after is not None:
        statement = statement.where(Company.company_id > after)
    return [CompanyRecord(*row) for row in await session.execute(statement)]


# --- the platform log ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PlatformEventRecord:
    id: int
    occurred_at: datetime
    subject_company: str
    actor_company_id: str
    actor_id: str
    action: str
    detail: dict[str, Any] | None


async def record_platform_event(
    session: AsyncSession,
    subject_company: str,
    *,
    actor: tuple[str, str],
    action: str,
    detail: dict[str, Any] | None = None,
) -> None:
    """Append a platform event about `subject_company` by `actor` (company, user id)."""
    actor_company_id, actor_id = actor
    await session.execute(
        insert(PlatformEvent).values(
            subject_company=subject_company,
            actor_company_id=actor_company_id,
            actor_id=actor_id,
            action=action,
            detail=detail,
        )
    )


async def select_platform_events(
    session: AsyncSession, subject_company: str
) -> list[PlatformEventRecord]:
    """The platform events naming `subject_company`, oldest first."""
    rows = await session.execute(
        select(
            PlatformEvent.id,
            PlatformEvent.occurred_at,
            PlatformEvent.subject_company,
            PlatformEvent.actor_company_id,
            PlatformEvent.actor_id,
            PlatformEvent.action,
            PlatformEvent.detail,
        )
        .where(PlatformEvent.subject_company == subject_company)
        .order_by(PlatformEvent.id)
    )
    return [PlatformEventRecord(*row) for row in rows]


async def anonymise_platform_actor(
    session: AsyncSession, company_id: str, user_id: str, erased_actor: str
) -> int:
    """An erased user's platform events name `erased_actor` instead of them; the count."""
    result = await session.execute(
        update(PlatformEvent)
        .where(PlatformEvent.actor_company_id == company_id, PlatformEvent.actor_id == user_id)
        .values(actor_id=erased_actor)
        .returning(PlatformEvent.id)
    )
    return len(result.all())


# --- offboardings -------------------------------------------------------------------------------


@dataclass(frozen=True)
class OffboardingRecord:
    id: uuid.UUID
    subject_company: str
    status: str
    requested_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    erased: dict[str, int]
    passes: int


_OFFBOARDING_COLUMNS = (
    CompanyOffboarding.id,
    CompanyOffboarding.subject_company,
    CompanyOffboarding.status,
    CompanyOffboarding.requested_at,
    CompanyOffboarding.started_at,
    CompanyOffboarding.finished_at,
    CompanyOffboarding.erased,
    CompanyOffboarding.passes,
)


async def insert_offboarding(
    session: AsyncSession, subject_company: str, erased: dict[str, int]
) -> OffboardingRecord:
    """Queue an offboarding of `subject_company`, `erased` already (its registry row, deleted
    by the caller, whose row lock keeps a second unfinished one from being inserted; a unique
    index says so too)."""
    row = (
        await session.execute(
            insert(CompanyOffboarding)
            .values(id=uuid.uuid4(), subject_company=subject_company, erased=erased)
            .returning(*_OFFBOARDING_COLUMNS)
        )
    ).one()
    return OffboardingRecord(**row._asdict())


async def select_latest_offboarding(
    session: AsyncSession, subject_company: str
) -> OffboardingRecord | None:
    """The newest offboarding of `subject_company` (an unfinished one first)."""
    row = (
        await session.execute(
            select(*_OFFBOARDING_COLUMNS)
            .where(CompanyOffboarding.subject_company == subject_company)
            .order_by(
                (CompanyOffboarding.status == "done").asc(),
                CompanyOffboarding.requested_at.desc(),
            )
            .limit(1)
        )
    ).one_or_none()
    return None if row is None else OffboardingRecord(*row)


async def select_unfinished_offboardings(session: AsyncSession) -> list[uuid.UUID]:
    rows = await session.execute(
        select(CompanyOffboarding.id)
        .where(CompanyOffboarding.status != "done")
        .order_by(CompanyOffboarding.requested_at)
    )
    return [row.id for row in rows]


async def claim_offboarding(
    session: AsyncSession, offboarding_id: uuid.UUID
) -> OffboardingRecord | None:
    """The unfinished offboarding, locked until the caller's transaction ends; None when it is
    done, or another process holds it (`SKIP LOCKED`: that one carries on)."""
    row = (
        await session.execute(
            select(*_OFFBOARDING_COLUMNS)
            .where(CompanyOffboarding.id == offboarding_id, CompanyOffboarding.status != "done")
            .with_for_update(skip_locked=True)
        )
    ).one_or_none()
    return None if row is None else OffboardingRecord(*row)


# the time is a parameter: Citus refuses a volatile function inside coalesce in a modification
_ADD_ERASED = text(
    "UPDATE company_offboardings SET status = 'running',"
    " started_at = coalesce(started_at, :now),"
    " erased = erased || jsonb_build_object(CAST(:table AS text),"
    "   coalesce((erased ->> CAST(:table AS text))::bigint, 0) + :count)"
    " WHERE id = :id"
)


async def add_erased(
    session: AsyncSession, offboarding_id: uuid.UUID, table: str, count: int
) -> None:
    """Add `count` rows of `table` to what the offboarding erased (in the transaction that
    deleted them), and mark it running."""
    await session.execute(
        _ADD_ERASED,
        {"id": offboarding_id, "table": table, "count": count, "now": datetime.now(UTC)},
    )


async def finish_offboarding(
    session: AsyncSession, offboarding_id: uuid.UUID, *, passes: int
) -> OffboardingRecord:
    now = datetime.now(UTC)  # bound, not now(): see _ADD_ERASED
    row = (
        await session.execute(
            update(CompanyOffboarding)
            .where(CompanyOffboarding.id == offboarding_id)
            .values(
                status="done",
                started_at=func.coalesce(CompanyOffboarding.started_at, now),
                finished_at=now,
                passes=CompanyOffboarding.passes + passes,
            )
            .returning(*_OFFBOARDING_COLUMNS)
        )
    ).one()
    return OffboardingRecord(**row._asdict())


async def delete_company_rows(session: AsyncSession, table: str, company_id: str) -> int:
    """Delete every row of `company_id` in the company table `table` (a name from the models'
    metadata, never input); the count. One shard on Citus (the distribution column)."""
    result = await session.execute(
        text(f'DELETE FROM "{table}" WHERE company_id = :company_id'),  # noqa: S608
        {"company_id": company_id},
    )
    return int(result.rowcount)  # type: ignore[attr-defined]
