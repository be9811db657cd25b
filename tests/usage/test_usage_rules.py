"""The pure rules of metering: the month a day belongs to, when a budget is spent and which
alerts it crosses, the cost of tokens at configured prices, and a report built from rows."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

import pytest

from app.kit.config import ModelPrice
from app.usage.budget import Budget, BudgetStatus, period_of
from app.usage.cost import call_cost, total_cost
from app.usage.report import usage_report
from app.usage.repository import CallTotals

PRICES = {"small": ModelPrice(prompt_per_million=0.15, completion_per_million=0.6)}


@pytest.mark.parametrize(
    ("day", "start", "end"),
    [
        (date(2026, 12, 1), date(2026, 12, 1), date(2027, 1, 1)),
        (date(2026, 12, 31), date(2026, 12, 1), date(2027, 1, 1)),
        (date(2027, 2, 28), date(2027, 2, 1), date(2027, 3, 1)),
        (date(2028, 2, 29), date(2028, 2, 1), date(2028, 3, 1)),
    ],
)
def test_a_day_belongs_to_its_utc_month(day: date, start: date, end: date) -> None:
    period = period_of(day)

    assert (period.start, period.end) == (start, end)
    assert period.end_instant == datetime(end.year, end.month, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("monthly", "spent", "share", "exhausted", "crossed"),
    [
        (None, 10**9, None, False, ()),
        (1000, 0, 0.0, False, ()),
        (1000, 799, 0.799, False, ()),
        (1000, 800, 0.8, False, (0.8,)),
        (1000, 999, 0.999, False, (0.8,)),
        (1000, 1000, 1.0, True, (0.8, 1.0)),
        (1000, 1500, 1.5, True, (0.8, 1.0)),
        (0, 0, 1.0, True, (0.8, 1.0)),
    ],
)
def test_a_budget_is_spent_at_its_limit_and_alerts_at_80_and_100_percent(
    monthly: int | None,
    spent: int,
    share: float | None,
    exhausted: bool,
    crossed: tuple[float, ...],
) -> None:
    status = BudgetStatus(Budget(monthly, "offline"), spent, period_of(date(2026, 12, 5)))

    assert status.used_share == share
    assert status.exhausted is exhausted
    assert status.crossed == crossed


def test_cost_is_tokens_times_the_price_per_million_and_none_without_a_price() -> None:
    assert call_cost(PRICES, "small", 1_000_000, 1_000_000) == Decimal("0.75")
    assert call_cost(PRICES, "small", 1234, 56) == Decimal("0.000219")  # 0.0001851 + 0.0000336
    assert call_cost(PRICES, "unknown", 1234, 56) is None
    assert total_cost([Decimal("0.5"), Decimal("0.25")]) == Decimal("0.75")
    assert total_cost([Decimal("0.5"), None]) is None
    assert total_cost([]) == Decimal(0)


def test_a_report_lists_every_day_of_the_range_and_totals_them() -> None:
    first, last = date(2026, 12, 1), date(2026, 12, 3)
    counts = [
        (date(2026, 12, 1), "turns_saved", 3),
        (date(2026, 12, 3), "turns_saved", 2),
        (date(2026, 12, 3), "consolidations_updated", 1),
    ]
    calls = [
        (date(2026, 12, 1), "gate", "small", CallTotals(2, 100, 2)),
        (date(2026, 12, 3), "gate", "small", CallTotals(1, 50, 1)),
        (date(2026, 12, 3), "operations", "big", CallTotals(1, 400, 60)),
    ]

    report = usage_report("acme", (first, last), counts, calls, PRICES)

    assert [day.day for day in report.days] == [first, date(2026, 12, 2), last]
    assert [day.turns_saved for day in report.days] == [3, 0, 2]
    assert report.days[1].model_calls == []
    assert report.days[1].estimated_cost == 0
    assert report.days[0].estimated_cost == pytest.approx(0.000016)  # 100 x 0.15 + 2 x 0.6
    assert report.days[2].estimated_cost is None  # "big" has no price
    totals = report.totals
    assert (totals.turns_saved, totals.consolidations.updated) == (5, 1)
    assert [(c.kind, c.model, c.calls, c.prompt_tokens) for c in totals.model_calls] == [
        ("gate", "small", 3, 150),
        ("operations", "big", 1, 400),
    ]
    assert (totals.prompt_tokens, totals.completion_tokens) == (550, 63)
    assert totals.estimated_cost is None
    assert report.unpriced_models == ["big"]
