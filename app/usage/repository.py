"""SQL of usage metering and the model budget: additive upserts of counts and model calls, the
report's reads, the worker's one-statement read of a budget and its month's spend, the
crossings' once-only insert, and the budget's table. Flushes, never commits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any, Final, cast

from sqlalchemy import (
    ARRAY,
    CTE,
    ColumnElement,
    Date,
    String,
    Table,
    Text,
    bindparam,
    func,
    select,
    text,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects.postgresql import Insert, insert
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from app.kit.audited_setting import SettingTable
from app.usage.budget import Budget, BudgetStatus, Period, WhenSpent
from app.usage.models import (
    CompanyModelBudget,
    ModelBudgetCrossing,
    UsageDailyCount,
    UsageDailyModelCall,
)

COUNTS = cast(Table, UsageDailyCount.__table__)
MODEL_CALLS = cast(Table, UsageDailyModelCall.__table__)
BUDGETS = cast(Table, CompanyModelBudget.__table__)
CROSSINGS = cast(Table, ModelBudgetCrossing.__table__)
Executor = AsyncSession | AsyncConnection

CountKey = tuple[str, date, str]
"""(company_id, day, counter)"""
CallKey = tuple[str, date, str, str]
"""(company_id, day, kind, model)"""


@dataclass(frozen=True)
class CallTotals:
    """Answered calls and the tokens the provider reported for them."""

    calls: int
    prompt_tokens: int
    completion_tokens: int

    def __add__(self, other: CallTotals) -> CallTotals:
        return CallTotals(
            self.calls + other.calls,
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
        )


# --- writes: additive, so any number of processes may write the same rows ----------------------


_ROWS = "rows_"
"""The prefix of `_additive_upsert`'s parameters (an array per column): named apart from any
column, so that a statement of which the upsert is a CTE can be an UPDATE (SQLAlchemy takes a
parameter named as a column of an UPDATE for a value to set)."""


def _additive_upsert(
    table: Table,
    keys: tuple[str, ...],
    amounts: tuple[str, ...],
    when: ColumnElement[bool] | None = None,
) -> Insert:
    """`INSERT ... SELECT FROM unnest(arrays) ... ON CONFLICT (keys) DO UPDATE` adding each
    amount to its row: one statement for any number of rows, built once (its rows come as one
    array parameter per column, named `_ROWS` + the column's name), so that neither SQLAlchemy
    nor PostgreSQL plans it again per call. Rows are inserted in array order; none unless
    `when` holds."""
    # the company is one scalar parameter, not an array: every row of one statement is one
    # company's, so the statement names the company it touches (routable by company_id)
    columns = (*keys[1:], *amounts)
    # text, not varchar(n), for the strings: an explicit cast to varchar(n) would cut a longer
    # value where the insert's own assignment refuses it
    types = [
        Text() if isinstance(table.c[name].type, String) else table.c[name].type for name in columns
    ]
    rows = (
        func.unnest(
            *(
                sql_cast(bindparam(_ROWS + name), ARRAY(kind))
                for name, kind in zip(columns, types, strict=True)
            )
        )
        .table_valued(*columns, with_ordinality="n")
        .render_derived()
    )
    company = sql_cast(bindparam(_ROWS + "company", type_=Text()), Text())
    source = select(company, *(rows.c[name] for name in columns)).order_by(rows.c.n)
    if when is not None:
        source = source.where(when)
    statement = insert(table).from_select([keys[0], *columns], source)
    return statement.on_conflict_do_update(
        index_elements=[table.c[name] for name in keys],
        set_={name: table.c[name] + statement.excluded[name] for name in amounts},
    )


_COUNT_KEYS = ("company_id", "day", "counter")
_ADD_COUNTS = _additive_upsert(COUNTS, _COUNT_KEYS, ("count",))
_CALL_AMOUNTS = ("calls", "prompt_tokens", "completion_tokens")
_CALL_KEYS = ("company_id", "day", "kind", "model")
_ADD_MODEL_CALLS = _additive_upsert(MODEL_CALLS, _CALL_KEYS, _CALL_AMOUNTS)


def _columns(names: tuple[str, ...], rows: Sequence[tuple[object, ...]]) -> list[dict[str, object]]:
    """One parameter set per company (the rows' first value), in key order; each binds the
    company and an array per other column."""
    by_company: dict[object, list[tuple[object, ...]]] = {}
    for row in rows:
        by_company.setdefault(row[0], []).append(row[1:])
    return [
        {_ROWS + "company": company}
        | {_ROWS + name: [row[i] for row in held] for i, name in enumerate(names[1:])}
        for company, held in by_company.items()
    ]


def _company_counts(counts: Mapping[CountKey, int]) -> list[dict[str, object]]:
    rows = [(*key, count) for key, count in sorted(counts.items())]
    return _columns((*_COUNT_KEYS, "count"), rows)


def counts_params(counts: Mapping[CountKey, int]) -> dict[str, object]:
    """The parameters of `add_counts_cte` for one company's counts: the rows in key order, so
    concurrent writers lock them in the same order."""
    [params] = _company_counts(counts)
    return params


def add_counts_cte(when: ColumnElement[bool]) -> CTE:
    """`add_counts` as a data-modifying CTE of another statement (built once by its caller),
    adding only when `when` holds; bound by `counts_params`."""
    return _additive_upsert(COUNTS, _COUNT_KEYS, ("count",), when).cte("counted")


async def add_counts(executor: Executor, counts: Mapping[CountKey, int]) -> None:
    """Add each count to its (company, day, counter) row, creating it; one statement per
    company (one, in every caller but a flush spanning companies)."""
    for params in _company_counts(counts):
        await executor.execute(_ADD_COUNTS, params)


async def add_model_calls(executor: Executor, calls: Mapping[CallKey, CallTotals]) -> None:
    """Add each total to its (company, day, kind, model) row, creating it; one statement per
    company.

    Rows are written in key order, so concurrent writers lock them in the same order."""
    if not calls:
        return
    rows = [
        (*key, totals.calls, totals.prompt_tokens, totals.completion_tokens)
        for key, totals in sorted(calls.items())
    ]
    names = (*_CALL_KEYS, *_CALL_AMOUNTS)
    for params in _columns(names, rows):
        await executor.execute(_ADD_MODEL_CALLS, params)


# --- the report ---------------------------------------------------------------------------------


async def select_counts(
    session: AsyncSession, company_id: str, first: date, last: date
) -> list[tuple[date, str, int]]:
    """(day, counter, count) of the company's days from `first` to `last`, both included."""
    rows = await session.execute(
        select(COUNTS.c.day, COUNTS.c.counter, COUNTS.c.count.label("n"))
        .where(COUNTS.c.company_id == company_id, COUNTS.c.day.between(first, last))
        .order_by(COUNTS.c.day, COUNTS.c.counter)
    )
    return [(row.day, row.counter, int(row.n)) for row in rows]


async def select_model_calls(
    session: AsyncSession, company_id: str, first: date, last: date
) -> list[tuple[date, str, str, CallTotals]]:
    """(day, kind, model, totals) of the company's days from `first` to `last`, both included."""
    rows = await session.execute(
        select(MODEL_CALLS)
        .where(MODEL_CALLS.c.company_id == company_id, MODEL_CALLS.c.day.between(first, last))
        .order_by(MODEL_CALLS.c.day, MODEL_CALLS.c.kind, MODEL_CALLS.c.model)
    )
    return [
        (
            row.day,
            row.kind,
            row.model,
            CallTotals(int(row.calls), int(row.prompt_tokens), int(row.completion_tokens)),
        )
        for row in rows
    ]


# --- the budget ---------------------------------------------------------------------------------


MODEL_BUDGETS: Final = SettingTable[Budget](
    BUDGETS,
    columns=("monthly_tokens", "when_spent"),
    to_row=lambda budget: {
        "monthly_tokens": budget.monthly_tokens,
        "when_spent": budget.when_spent,
    },
    of_row=lambda row: Budget(row["monthly_tokens"], cast(WhenSpent, row["when_spent"])),
    editor=None,  # who changed it is in the audit trail only
)
"""A company's budget, one row per company that saved one (an audited setting)."""


_SPEND = select(
    func.coalesce(func.sum(MODEL_CALLS.c.prompt_tokens + MODEL_CALLS.c.completion_tokens), 0)
).where(
    MODEL_CALLS.c.company_id == bindparam("company_id", type_=String),
    MODEL_CALLS.c.day >= bindparam("period_start", type_=Date),
    MODEL_CALLS.c.day < bindparam("period_end", type_=Date),
)
"""Prompt plus completion tokens of a company's model calls in a period (`_spend_params`)."""


def _spend_params(company_id: str, period: Period) -> dict[str, object]:
    return {"company_id": company_id, "period_start": period.start, "period_end": period.end}


async def month_spend(executor: Executor, company_id: str, period: Period) -> int:
    """Prompt plus completion tokens of the company's model calls in `period`."""
    spent = await executor.scalar(_SPEND, _spend_params(company_id, period))
    return int(spent or 0)


BUDGET_STATUS_COLUMNS: Final = """
    budget.monthly_tokens AS budget_monthly_tokens, budget.when_spent AS budget_when_spent,
    (SELECT coalesce(sum(mc.prompt_tokens + mc.completion_tokens), 0)
     FROM usage_daily_model_calls mc
     WHERE budget.company_id IS NOT NULL AND mc.company_id = :company_id
       AND mc.day >= :budget_period_start AND mc.day < :budget_period_end) AS budget_spent"""
BUDGET_STATUS_JOINS: Final = """
LEFT JOIN company_model_budgets budget ON budget.company_id = :company_id"""
"""The company's budget and its spend in a period, over two primary keys, as columns of a
statement of one row that binds :company_id (`budget_status_params` binds the rest;
`budget_status_of` reads them): the worker's check before a model call, alone
(`select_budget_status`) or in the read of a claim."""

_BUDGET_STATUS = text(
    f"SELECT {BUDGET_STATUS_COLUMNS}\nFROM (SELECT 1) AS one{BUDGET_STATUS_JOINS}"
)


def budget_status_params(period: Period) -> dict[str, object]:
    return {"budget_period_start": period.start, "budget_period_end": period.end}


def budget_status_of(row: Mapping[str, Any] | RowMapping, period: Period) -> BudgetStatus | None:
    """The `BUDGET_STATUS_COLUMNS` of a row; None when the company has no budget."""
    when_spent = row["budget_when_spent"]
    if when_spent is None:
        return None
    budget = Budget(row["budget_monthly_tokens"], cast(WhenSpent, when_spent))
    return BudgetStatus(budget, int(row["budget_spent"]), period)


async def select_budget_status(
    executor: Executor, company_id: str, period: Period
) -> BudgetStatus | None:
    """The worker's check before a model call, in ONE statement: the company's budget and its
    spend in `period`. None when the company has no budget."""
    params = {"company_id": company_id} | budget_status_params(period)
    row = (await executor.execute(_BUDGET_STATUS, params)).one()
    return budget_status_of(row._mapping, period)


async def record_crossings(
    executor: Executor, company_id: str, period: Period, thresholds_percent: Sequence[int]
) -> list[int]:
    """Record the thresholds as crossed in `period`; returns those that were not yet: the
    caller that gets a threshold back is the only one, across all processes, to get it."""
    if not thresholds_percent:
        return []
    statement = (
        insert(CROSSINGS)
        .values(
            [
                {"company_id": company_id, "period": period.start, "threshold_percent": t}
                for t in sorted(thresholds_percent)
            ]
        )
        .on_conflict_do_nothing()
        .returning(CROSSINGS.c.threshold_percent)
    )
    return sorted(int(t) for t in (await executor.execute(statement)).scalars())


async def last_active_day(session: AsyncSession, company_id: str) -> date | None:
    """The last UTC day anything of the company was counted (a turn saved, a context served, a
    consolidation run); None for a company with no traffic yet."""
    day: date | None = await session.scalar(
        select(func.max(COUNTS.c.day)).where(COUNTS.c.company_id == company_id)
    )
    return day
