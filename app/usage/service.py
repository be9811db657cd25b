"""The operators' usage report and the company's model budget (read, and saved audited)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Final

from sqlalchemy.ext.asyncio import AsyncSession

from app.enablement import audit
from app.jobs.lifecycle import bring_forward
from app.kit.audited_setting import Actor, AuditedSetting, Stored
from app.kit.config import ModelPrice
from app.kit.errors import Unprocessable
from app.kit.principal import Principal
from app.usage import repository
from app.usage.budget import Budget, BudgetStatus, period_of
from app.usage.report import usage_report
from app.usage.schemas import UsageReportOut

MAX_RANGE_DAYS: Final = 366
NO_BUDGET: Final = Budget(monthly_tokens=None, when_spent="offline")


def _day(field: str, text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise Unprocessable.field(
            f"query.{field}", f"`{field}` must be a calendar date as YYYY-MM-DD."
        ) from None


def usage_range(first_text: str, last_text: str) -> tuple[date, date]:
    """The report's days from the query (`from`, `to`, both included): real dates, in order,
    at most `MAX_RANGE_DAYS` days."""
    first, last = _day("from", first_text), _day("to", last_text)
    if first > last:
        raise Unprocessable.field("query.to", "`to` must not be before `from`.")
    if (last - first).days + 1 > MAX_RANGE_DAYS:
        raise Unprocessable.field(
            "query.to", f"A report covers at most {MAX_RANGE_DAYS} days; ask for a shorter range."
        )
    return first, last


async def read_usage(
    session: AsyncSession,
    company_id: str,
    first: date,
    last: date,
    prices: Mapping[str, ModelPrice],
) -> UsageReportOut:
    """The company's usage from `first` to `last` (two reads by primary key range)."""
    counts = await repository.select_counts(session, company_id, first, last)
    calls = await repository.select_model_calls(session, company_id, first, last)
    return usage_report(company_id, (first, last), counts, calls, prices)


# --- the model budget ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelBudgetView:
    company_id: str
    status: BudgetStatus
    default: bool
    updated_at: datetime | None


def _budget_fields(budget: Budget) -> dict[str, object]:
    return {"monthly_tokens": budget.monthly_tokens, "when_spent": budget.when_spent}


MODEL_BUDGET: Final = AuditedSetting(
    repository.MODEL_BUDGETS,
    audit.AUDIT_LOG,
    action="model_budget.set",
    target_kind="model_budget",
    default=NO_BUDGET,
    audited=_budget_fields,
)


async def _view(
    session: AsyncSession, company_id: str, record: Stored[Budget] | None
) -> ModelBudgetView:
    period = period_of(datetime.now(UTC).date())
    spent = await repository.month_spend(session, company_id, period)
    budget = NO_BUDGET if record is None else record.value
    status = BudgetStatus(budget, spent, period)
    return ModelBudgetView(
        company_id, status, record is None, None if record is None else record.updated_at
    )


async def read_model_budget(session: AsyncSession, company_id: str) -> ModelBudgetView:
    """The company's budget (none: unlimited) and this month's spend."""
    stored = await repository.MODEL_BUDGETS.select(session, company_id)
    return await _view(session, company_id, stored)


async def set_model_budget(
    session: AsyncSession, actor: Principal, company_id: str, budget: Budget
) -> ModelBudgetView:
    """Replace the company's budget, audited with the changed fields old -> new, under a row
    lock; a budget equal to the one in force (no budget, for a company that saved none)
    writes nothing. Workers read it before their next model call; consolidations deferred
    until next month are due again now, for the worker to decide anew under this budget."""
    saved = await MODEL_BUDGET.save(session, Actor.of(actor), company_id, change=lambda _: budget)
    if saved.changed:
        period = period_of(datetime.now(UTC).date())
        await bring_forward(session, company_id, period.end_instant)
    return await _view(session, company_id, saved.stored)
