"""SQL of the rate-limit overrides: every company's (the processes' refresh), and one company's
locked read and save (flushes, never commits)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from app.enablement.audit import Actor
from app.kit.citus import across_companies
from app.rate_limits.limiter import Overrides
from app.rate_limits.models import CompanyRateLimits
from app.rate_limits.policy import Limit, RouteClass, Scope


@dataclass(frozen=True)
class OverridesRecord:
    """A company's saved overrides and who saved them last."""

    overrides: Overrides
    updated_at: datetime
    updated_by_company_id: str
    updated_by: str


def overrides_json(overrides: Overrides) -> dict[str, dict[str, str]]:
    """The stored form: class -> scope -> `"QUOTA/WINDOW"` or `"off"`."""
    return {
        route_class.value: {
            scope.value: "off" if limit is None else str(limit) for scope, limit in scopes.items()
        }
        for route_class, scopes in overrides.items()
        if scopes
    }


def overrides_of(stored: Mapping[str, object]) -> Overrides:
    """The stored overrides; a class, scope or value this build does not understand is
    skipped, so it reads as the default."""
    classes = {c.value: c for c in RouteClass}
    scopes = {s.value: s for s in Scope}
    parsed: dict[RouteClass, dict[Scope, Limit | None]] = {}
    for class_name, by_scope in stored.items():
        if class_name not in classes or not isinstance(by_scope, Mapping):
            continue
        for scope_name, value in by_scope.items():
            if scope_name not in scopes or not isinstance(value, str):
                continue
            try:
                limit = Limit.parse(value)
            except ValueError:
                continue
            parsed.setdefault(classes[class_name], {})[scopes[scope_name]] = limit
    return parsed


async def select_all_overrides(conn: AsyncConnection) -> dict[str, Overrides]:
    """Every company's overrides (a small table: only companies an operator changed)."""
    # each process holds every company's overrides, reloaded every RATE_LIMIT_REFRESH_SECONDS
    async with across_companies(conn):
        rows = await conn.execute(select(CompanyRateLimits.company_id, CompanyRateLimits.limits))
    return {row.company_id: overrides_of(row.limits) for row in rows}


async def select_overrides(
    session: AsyncSession, company_id: str, *, for_update: bool = False
) -> OverridesRecord | None:
    """The saved overrides, or None when the company never saved any; `for_update` row-locks."""
    statement = select(
        CompanyRateLimits.limits,
        CompanyRateLimits.updated_at,
        CompanyRateLimits.updated_by_company_id,
        CompanyRateLimits.updated_by,
    ).where(CompanyRateLimits.company_id == company_id)
    if for_update:
        statement = statement.with_for_update()
    row = (await session.execute(statement)).first()
    if row is None:
        return None
    return OverridesRecord(
        overrides_of(row.limits), row.updated_at, row.updated_by_company_id, row.updated_by
    )


async def upsert_overrides(
    session: AsyncSession, company_id: str, overrides: Overrides, editor: Actor
) -> OverridesRecord:
    """Save the company's whole set of overrides, naming `editor` as its last editor."""
    values = insert(CompanyRateLimits).values(
        company_id=company_id,
        limits=overrides_json(overrides),
        updated_by_company_id=editor.company_id,
        updated_by=editor.user_id,
        updated_at=func.now(),
    )
    # the time through EXCLUDED: Citus refuses a function in DO UPDATE SET
    statement = values.on_conflict_do_update(
        index_elements=[CompanyRateLimits.company_id],
        set_={
            "limits": values.excluded.limits,
            "updated_by_company_id": values.excluded.updated_by_company_id,
            "updated_by": values.excluded.updated_by,
            "updated_at": values.excluded.updated_at,
        },
    ).returning(CompanyRateLimits.updated_at)
    updated_at = (await session.execute(statement)).scalar_one()
    return OverridesRecord(overrides, updated_at, editor.company_id, editor.user_id)


async def anonymise_editor(
    session: AsyncSession, company_id: str, user_id: str, marker: str
) -> int:
    """Erasure: the overrides last changed by the user (both ids matching, in any company)
    keep their values but name `marker` as `updated_by`; returns how many rows."""
    result = await session.execute(
        update(CompanyRateLimits)
        .where(
            CompanyRateLimits.updated_by_company_id == company_id,
            CompanyRateLimits.updated_by == user_id,
        )
        .values(updated_by=marker)
        .returning(CompanyRateLimits.company_id)
    )
    return len(result.all())
