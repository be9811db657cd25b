"""The worker's metering: each answered model call recorded right after the call, in a short
transaction of its own (`UsageRecorder`), and the budget read before the model is called, with
its gauge and its once-a-month threshold alerts (`BudgetWatch`).

A call is recorded when the provider answered it with a completion, whatever happens next: the
answer cut off (`finish_reason=length`), refused, unusable, or the job failing later; a retried
call counts each answered attempt. An HTTP error answer, a timeout or a refused connection bill
nothing and record nothing. If the write fails (the database is gone), the totals stay in the
recorder's buffer and are written with its next write or at the worker's stop.
"""

from __future__ import annotations

import logging
from datetime import date

from app.kit.db.engine import Database
from app.kit.llm import ChatUsage
from app.kit.observability import Metrics
from app.usage import repository
from app.usage.budget import BudgetStatus, period_of
from app.usage.meter import UsageBuffer
from app.usage.models import MODEL_NAME_MAX_LENGTH
from app.usage.repository import CallTotals

logger = logging.getLogger("app.usage")


class UsageRecorder:
    """Writes the worker's usage as it happens; shared by the worker's concurrent runs."""

    def __init__(self, database: Database) -> None:
        self.buffer = UsageBuffer(database)

    async def model_call(self, company_id: str, day: date, kind: str, usage: ChatUsage) -> None:
        """One answered call of `kind`, with the tokens the provider reported for it."""
        key = (company_id, day, kind, usage.model[:MODEL_NAME_MAX_LENGTH])
        self.buffer.add_call(key, CallTotals(1, usage.tokens_in, usage.tokens_out))
        await self.buffer.flush()

    async def count(self, company_id: str, day: date, counter: str) -> None:
        """One more `counter` for the company's day, outside any other transaction."""
        self.buffer.add_count(company_id, day, counter)
        await self.buffer.flush()

    async def flush(self) -> bool:
        """Write what earlier writes could not (at the worker's stop)."""
        return await self.buffer.flush()


class BudgetWatch:
    """Reads a company's budget and month's spend, keeps the gauge current and fires each
    alert threshold once per company and month (a row in `model_budget_crossings` decides
    which process fires it; the first to insert it)."""

    def __init__(self, database: Database, metrics: Metrics) -> None:
        self.database = database
        self.metrics = metrics
        self._fired: set[tuple[str, date, int]] = set()

    async def check(self, company_id: str, day: date) -> BudgetStatus | None:
        """The company's budget status for the month of `day`; None without a budget. One
        statement (the budget row and the month's rows of the spend, by primary key), in
        autocommit: a read on its own needs no BEGIN and ROLLBACK around it."""
        period = period_of(day)
        async with self.database.engine.connect() as conn:
            reader = await conn.execution_options(isolation_level="AUTOCOMMIT")
            status = await repository.select_budget_status(reader, company_id, period)
        await self.observe(company_id, status)
        return status

    async def observe(self, company_id: str, status: BudgetStatus | None) -> None:
        """Keep the gauge current and fire the alerts `status` (read by the caller: None
        without a budget) has reached."""
        if status is None:
            return
        share = status.used_share
        if share is None:
            return
        self.metrics.model_budget_used_ratio.labels(company_id).set(share)
        start = status.period.start
        due = [
            percent
            for percent in (round(t * 100) for t in status.crossed)
            if (company_id, start, percent) not in self._fired
        ]
        if not due:
            return
        async with self.database.sessionmaker() as session, session.begin():
            first = await repository.record_crossings(session, company_id, status.period, due)
        for percent in due:
            self._fired.add((company_id, start, percent))
        for percent in first:
            self.metrics.model_budget_threshold_crossed.labels(f"{percent / 100:.1f}").inc()
            logger.warning(
                "company %s crossed %d %% of its monthly model budget", company_id, percent
            )
