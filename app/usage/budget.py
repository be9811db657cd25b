"""The model budget's rule (pure): the month a day belongs to, how much of a budget is used,
which alert thresholds that crosses, and what the worker does about it.

A month is a UTC calendar month; spend is the prompt plus completion tokens the provider
reported for the company's answered model calls on the days of that month.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Final, Literal

WhenSpent = Literal["offline", "defer"]
ALERT_THRESHOLDS: Final = (0.8, 1.0)
"""Shares of the budget at which `model_budget_threshold_crossed_total` fires, once a month."""


@dataclass(frozen=True)
class Period:
    """One UTC month: `start` (its first day) up to `end` (the next month's first day)."""

    start: date
    end: date

    @property
    def end_instant(self) -> datetime:
        """The instant the next period starts: when deferred jobs run again."""
        return datetime(self.end.year, self.end.month, 1, tzinfo=UTC)


def period_of(day: date) -> Period:
    start = day.replace(day=1)
    end = date(start.year + 1, 1, 1) if start.month == 12 else date(start.year, start.month + 1, 1)
    return Period(start, end)


@dataclass(frozen=True)
class Budget:
    """A company's budget: `monthly_tokens` None is unlimited."""

    monthly_tokens: int | None
    when_spent: WhenSpent


@dataclass(frozen=True)
class BudgetStatus:
    """A budget and the month's spend as read before a model call."""

    budget: Budget
    spent: int
    period: Period

    @property
    def used_share(self) -> float | None:
        """Spent over the budget (1.0 and more: spent); None when unlimited. A budget of 0 is
        spent from the start."""
        limit = self.budget.monthly_tokens
        if limit is None:
            return None
        if limit == 0:
            return 1.0
        return self.spent / limit

    @property
    def exhausted(self) -> bool:
        """The model may not be called any more this month."""
        share = self.used_share
        return share is not None and share >= 1.0

    @property
    def crossed(self) -> tuple[float, ...]:
        """The alert thresholds this spend has reached."""
        share = self.used_share
        return () if share is None else tuple(t for t in ALERT_THRESHOLDS if share >= t)
