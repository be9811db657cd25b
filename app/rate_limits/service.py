"""The operators' rate-limit overrides: read them with the limits in force, replace them
(audited), and keep every process's copy fresh."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from app.enablement import audit
from app.kit.audited_setting import Actor, AuditedSetting, Stored
from app.kit.config import Settings
from app.kit.principal import Principal
from app.rate_limits import repository
from app.rate_limits.limiter import NO_LIMITS, Overrides, RateLimiter
from app.rate_limits.policy import ClassLimits, Limit, RouteClass, Scope, in_force

logger = logging.getLogger("app.rate_limits")


@dataclass(frozen=True)
class RateLimitsView:
    """A company's limits in force per class, which scopes its overrides set, and who saved
    them last (None for a company that never saved any)."""

    company_id: str
    limits: dict[RouteClass, ClassLimits]
    overrides: Overrides
    processes: int
    record: Stored[Overrides] | None


def view_of(
    limiter: RateLimiter, company_id: str, record: Stored[Overrides] | None
) -> RateLimitsView:
    """The limits `record`'s overrides put in force over `limiter`'s defaults (whatever this
    process holds for the company now)."""
    overrides: Overrides = {} if record is None else record.value
    limits = {
        route_class: in_force(
            limiter.defaults.get(route_class, NO_LIMITS), overrides.get(route_class)
        )
        for route_class in RouteClass
    }
    return RateLimitsView(company_id, limits, overrides, limiter.processes, record)


async def read_rate_limits(
    session: AsyncSession, limiter: RateLimiter, company_id: str
) -> RateLimitsView:
    stored = await repository.RATE_LIMIT_OVERRIDES.select(session, company_id)
    return view_of(limiter, company_id, stored)


def _fields(overrides: Overrides) -> dict[str, object]:
    """The audit trail's form: class -> scope -> `"QUOTA/WINDOW"`, `"off"` or `"default"`."""
    return {
        route_class.value: {
            scope.value: _describe(overrides.get(route_class, {}), scope) for scope in Scope
        }
        for route_class in RouteClass
    }


def _describe(scopes: Mapping[Scope, Limit | None], scope: Scope) -> str:
    if scope not in scopes:
        return "default"
    limit = scopes[scope]
    return "off" if limit is None else str(limit)


RATE_LIMITS: Final = AuditedSetting(
    repository.RATE_LIMIT_OVERRIDES,
    audit.AUDIT_LOG,
    action="rate_limits.set",
    target_kind="rate_limits",
    default={},
    audited=_fields,
)


async def set_rate_limits(
    session: AsyncSession,
    limiter: RateLimiter,
    actor: Principal,
    company_id: str,
    overrides: Overrides,
) -> RateLimitsView:
    """Replace the company's overrides (every class; a class or scope left out is the
    default), audited with the changed fields old -> new, under a row lock. Equal to the ones
    saved, nothing is written nor recorded. This process applies them at once, the others at
    their next refresh (`RATE_LIMIT_REFRESH_SECONDS`)."""
    saved = await RATE_LIMITS.save(session, Actor.of(actor), company_id, change=lambda _: overrides)
    if saved.changed:
        limiter.set_overrides(company_id, overrides)
    return view_of(limiter, company_id, saved.stored)


async def refresh_overrides(engine: AsyncEngine, limiter: RateLimiter) -> None:
    """Read every company's overrides into `limiter`."""
    async with engine.connect() as conn:
        limiter.replace_overrides(await repository.select_all_overrides(conn))


async def refresh_or_keep(engine: AsyncEngine, limiter: RateLimiter) -> None:
    """One refresh; a failed read (the database away) keeps the last copy."""
    try:
        await refresh_overrides(engine, limiter)
    except Exception as exc:
        logger.warning("rate-limit overrides not refreshed: %s", type(exc).__name__)


async def keep_overrides_fresh(engine: AsyncEngine, limiter: RateLimiter, interval: float) -> None:
    """Refresh the overrides every `interval` seconds until cancelled. The process read them
    once before serving (`refresh_or_keep` at start-up), so it never serves its first requests
    on the defaults while the first read is still under way."""
    while True:
        await asyncio.sleep(interval)
        await refresh_or_keep(engine, limiter)


def last_saved(view: RateLimitsView) -> tuple[datetime | None, str | None, str | None]:
    record = view.record
    if record is None:
        return None, None, None
    return record.updated_at, record.updated_by_company_id, record.updated_by


def limiter_for(settings: Settings) -> RateLimiter:
    """This process's limiter: the `RATE_LIMIT_*` defaults, and its share of them (one of
    `RATE_LIMIT_REPLICAS` x `API_WORKERS` processes)."""
    defaults = {
        route_class: ClassLimits(
            user=Limit.parse(getattr(settings, f"rate_limit_{route_class.value}_user")),
            company=Limit.parse(getattr(settings, f"rate_limit_{route_class.value}_company")),
        )
        for route_class in RouteClass
    }
    return RateLimiter(
        defaults,
        processes=settings.rate_limit_replicas * settings.api_workers,
        refusal_delay_seconds=settings.rate_limit_refusal_delay_seconds,
    )
