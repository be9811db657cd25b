"""The periodic quota check, a housekeeping step of the worker: it counts every user's stored
chat messages and every company's stored bytes and marks, in `user_quota_marks` and
`company_quota_marks`, exactly those at or over their quota. Turn-saves read the marks.

Between two checks a subject can add what it stores in one interval and one check beyond its
quota (the overshoot `docs/operations.md` bounds); a subject back under its quota is let through
again at the next check. The worker knows no domain: `main` hands it the step this module builds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncEngine

from app.jobs.worker import Maintenance
from app.kit.citus import across_companies
from app.quotas import repository
from app.quotas.rule import Quota

logger = logging.getLogger("app.quotas")


@dataclass
class _Interval:
    """Runs at most once per `seconds` (per process: the worker calls its steps every few
    minutes; a restart checks at once)."""

    seconds: float
    clock: Callable[[], float] = time.monotonic
    last: float | None = field(default=None)

    def due(self) -> bool:
        now = self.clock()
        if self.last is not None and now - self.last < self.seconds:
            return False
        self.last = now
        return True


def quota_check_step(
    *,
    user_history_messages: int,
    company_storage_bytes: int,
    interval_seconds: float,
    clock: Callable[[], float] = time.monotonic,
) -> Maintenance:
    """The step checking the stored-amount quotas (0: none, and its marks are all deleted) at
    most once per `interval_seconds`; it returns the marks written or deleted."""
    interval = _Interval(interval_seconds, clock)

    async def check_stored_quotas(engine: AsyncEngine) -> int:
        if not interval.due():
            return 0
        users: list[repository.UserUsage] = []
        companies: list[repository.CompanyUsage] = []
        # counts every company's history and storage, grouped by company
        async with engine.connect() as conn, across_companies(conn):
            if user_history_messages > 0:
                users = await repository.users_over_history(conn, user_history_messages)
            if company_storage_bytes > 0:
                companies = await repository.companies_over_storage(conn, company_storage_bytes)
        touched = await repository.mark_users(
            engine, Quota.USER_HISTORY_MESSAGES, user_history_messages, users
        )
        touched += await repository.mark_companies(
            engine, Quota.COMPANY_STORAGE_BYTES, company_storage_bytes, companies
        )
        if users or companies:
            logger.info(
                "quota check: %d user(s) over their history quota, %d company(ies) over "
                "their storage quota",
                len(users),
                len(companies),
            )
        return touched

    return check_stored_quotas
