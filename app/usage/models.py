"""Tables of usage metering and the model budget.

Every table is keyed by company first (the distribution key, docs/scaling.md); none names a user,
so metering holds no personal data and an erasure has nothing to do here.
"""

from __future__ import annotations

from datetime import date, datetime

from sqlalchemy import BigInteger, CheckConstraint, SmallInteger, String, func
from sqlalchemy.orm import Mapped, mapped_column

from app.kit.db.base import Base

COUNTERS = (
    "turns_saved",
    "contexts_served",
    "consolidations_updated",
    "consolidations_noop",
    "consolidations_failed",
    "consolidations_deferred",
    "consolidations_offline",
)
"""The per-day counts of `usage_daily_counts` (see `app.usage.meter` for who counts which)."""
CALL_KINDS = ("gate", "operations", "rewrite", "condensation")
WHEN_SPENT = ("offline", "defer")
THRESHOLDS_PERCENT = (80, 100)
MODEL_NAME_MAX_LENGTH = 128


def _one_of(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(value) for value in values)})"


class UsageDailyCount(Base):
    """How many times `counter` happened for a company on a UTC day (added to, never set)."""

    __tablename__ = "usage_daily_counts"
    __table_args__ = (
        CheckConstraint(_one_of("counter", COUNTERS), name="counter"),
        CheckConstraint("count >= 0", name="count_not_negative"),
    )

    company_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    day: Mapped[date] = mapped_column(primary_key=True)
    counter: Mapped[str] = mapped_column(String(32), primary_key=True)
    count: Mapped[int] = mapped_column(BigInteger)


class UsageDailyModelCall(Base):
    """The model calls a company's consolidations made on a UTC day, by call kind and the model
    the provider says answered: answered calls and the tokens the provider reported for them.

    The primary key (company, day, ...) is also the index of the month's spend."""

    __tablename__ = "usage_daily_model_calls"
    __table_args__ = (
        CheckConstraint(_one_of("kind", CALL_KINDS), name="kind"),
        CheckConstraint(
            "calls >= 0 AND prompt_tokens >= 0 AND completion_tokens >= 0", name="not_negative"
        ),
    )

    company_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    day: Mapped[date] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    model: Mapped[str] = mapped_column(String(MODEL_NAME_MAX_LENGTH), primary_key=True)
    calls: Mapped[int] = mapped_column(BigInteger)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    completion_tokens: Mapped[int] = mapped_column(BigInteger)


class CompanyModelBudget(Base):
    """A company's monthly model budget (operators, audited); no row: no budget.

    `monthly_tokens` NULL is unlimited. Who changed it is in the audit trail only (an erasure
    anonymises it there), not on the row."""

    __tablename__ = "company_model_budgets"
    __table_args__ = (
        CheckConstraint(_one_of("when_spent", WHEN_SPENT), name="when_spent"),
        CheckConstraint("monthly_tokens IS NULL OR monthly_tokens >= 0", name="monthly_tokens"),
    )

    company_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    monthly_tokens: Mapped[int | None] = mapped_column(BigInteger)
    when_spent: Mapped[str] = mapped_column(String(16))
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())


class ModelBudgetCrossing(Base):
    """A threshold of a company's budget crossed in a month: the row is the once-only guard of
    the `model_budget_threshold_crossed_total` alert, whichever worker process sees it first."""

    __tablename__ = "model_budget_crossings"
    __table_args__ = (
        CheckConstraint(
            f"threshold_percent IN ({', '.join(str(t) for t in THRESHOLDS_PERCENT)})",
            name="threshold_percent",
        ),
    )

    company_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    period: Mapped[date] = mapped_column(primary_key=True)
    threshold_percent: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    crossed_at: Mapped[datetime] = mapped_column(server_default=func.now())
