"""SQL of the rate-limit overrides: every company's (the processes' refresh), and one company's,
an audited setting (`app.kit.audited_setting`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from app.kit.audited_setting import SettingTable
from app.kit.citus import across_companies
from app.rate_limits.limiter import Overrides
from app.rate_limits.models import CompanyRateLimits
from app.rate_limits.policy import Limit, RouteClass, Scope


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


RATE_LIMIT_OVERRIDES: Final = SettingTable[Overrides](
    CompanyRateLimits,
    columns=("limits",),
    to_row=lambda overrides: {"limits": overrides_json(overrides)},
    of_row=lambda row: overrides_of(row["limits"]),
)
"""A company's overrides, one row per company an operator changed."""
