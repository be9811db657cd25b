"""The usage report's rule (pure): stored rows of a company's days become one entry per day of
the range, each with its model calls by kind and model, tokens and estimated cost, and the
totals of the range."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import date, timedelta
from decimal import Decimal

from app.kit.config import ModelPrice
from app.usage.cost import call_cost, total_cost
from app.usage.repository import CallTotals
from app.usage.schemas import (
    ConsolidationsOut,
    DayUsageOut,
    ModelCallsOut,
    UsageReportOut,
    UsageTotalsOut,
)

CountRow = tuple[date, str, int]
CallRow = tuple[date, str, str, CallTotals]


def _as_number(cost: Decimal | None) -> float | None:
    return None if cost is None else float(cost)


def _totals(
    counts: Mapping[str, int],
    calls: Mapping[tuple[str, str], CallTotals],
    prices: Mapping[str, ModelPrice],
) -> UsageTotalsOut:
    rows: list[ModelCallsOut] = []
    costs: list[Decimal | None] = []
    for (kind, model), totals in sorted(calls.items()):
        cost = call_cost(prices, model, totals.prompt_tokens, totals.completion_tokens)
        costs.append(cost)
        rows.append(
            ModelCallsOut(
                kind=kind,
                model=model,
                calls=totals.calls,
                prompt_tokens=totals.prompt_tokens,
                completion_tokens=totals.completion_tokens,
                estimated_cost=_as_number(cost),
            )
        )
    return UsageTotalsOut(
        turns_saved=counts.get("turns_saved", 0),
        contexts_served=counts.get("contexts_served", 0),
        consolidations=ConsolidationsOut(
            updated=counts.get("consolidations_updated", 0),
            noop=counts.get("consolidations_noop", 0),
            failed=counts.get("consolidations_failed", 0),
            deferred=counts.get("consolidations_deferred", 0),
            offline=counts.get("consolidations_offline", 0),
        ),
        model_calls=rows,
        prompt_tokens=sum(row.prompt_tokens for row in rows),
        completion_tokens=sum(row.completion_tokens for row in rows),
        estimated_cost=_as_number(total_cost(costs)),
    )


def usage_report(
    company_id: str,
    days_range: tuple[date, date],
    counts: Iterable[CountRow],
    calls: Iterable[CallRow],
    prices: Mapping[str, ModelPrice],
) -> UsageReportOut:
    """Every day of `days_range` (first, last; zeros where nothing happened) and the range's
    totals."""
    first, last = days_range
    day_counts: dict[date, dict[str, int]] = {}
    all_counts: dict[str, int] = {}
    for day, counter, n in counts:
        day_counts.setdefault(day, {})[counter] = n
        all_counts[counter] = all_counts.get(counter, 0) + n
    day_calls: dict[date, dict[tuple[str, str], CallTotals]] = {}
    all_calls: dict[tuple[str, str], CallTotals] = {}
    for day, kind, model, totals in calls:
        day_calls.setdefault(day, {})[(kind, model)] = totals
        held = all_calls.get((kind, model))
        all_calls[(kind, model)] = totals if held is None else held + totals
    days = []
    for offset in range((last - first).days + 1):
        day = first + timedelta(days=offset)
        of_day = _totals(day_counts.get(day, {}), day_calls.get(day, {}), prices)
        days.append(DayUsageOut(day=day, **of_day.model_dump()))
    return UsageReportOut(
        company_id=company_id,
        from_=first,
        to=last,
        days=days,
        totals=_totals(all_counts, all_calls, prices),
        unpriced_models=sorted({model for _, model in all_calls if model not in prices}),
    )
