"""Request and response bodies of the usage report and the model budget routes.

The budget's request forbids unknown fields and takes strict JSON types (`"1000"` is not an
integer; `1000.0` is, as JSON Schema says)."""

from __future__ import annotations

from datetime import date, datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from app.kit.contract import WHOLE_NUMBER
from app.usage.budget import WhenSpent

MAX_MONTHLY_TOKENS = 10**15
"""A bound far above any real budget, so that a typo cannot overflow anything downstream."""

MonthlyTokens = Annotated[StrictInt, Field(ge=0, le=MAX_MONTHLY_TOKENS), WHOLE_NUMBER]
_COST = (
    "Estimated from `MODEL_PRICES` (per million tokens, in the currency they are written in); "
    "null when a model involved has no configured price (see `unpriced_models`)."
)


# --- the usage report ---------------------------------------------------------------------------


class ConsolidationsOut(BaseModel):
    """Consolidation runs that finished, by outcome (a run may cover several queued turns)."""

    updated: int = Field(description="Runs that wrote a new version of a memory.")
    noop: int = Field(description="Runs that found nothing to change.")
    failed: int = Field(description="Runs that failed (retried or dead-lettered).")
    deferred: int = Field(
        description="Runs put back until next month: the model budget was spent (`defer`)."
    )
    offline: int = Field(
        description="Of the updated and noop runs, those decided by the offline engine because "
        "the model budget was spent (`offline`)."
    )


class ModelCallsOut(BaseModel):
    kind: str = Field(description="`gate`, `operations`, `rewrite` or `condensation`.")
    model: str = Field(description="The model the provider says answered.")
    calls: int = Field(description="Calls the provider answered with a completion.")
    prompt_tokens: int = Field(description="As the provider reported them.")
    completion_tokens: int = Field(description="As the provider reported them.")
    estimated_cost: float | None = Field(description=_COST)


class UsageTotalsOut(BaseModel):
    turns_saved: int = Field(
        description="Turns saved by `POST /v1/chats/{chat_id}/turns` (an idempotent replay is "
        "not a new turn)."
    )
    contexts_served: int = Field(description="Successful `POST /v1/chats/{chat_id}/context`.")
    consolidations: ConsolidationsOut
    model_calls: list[ModelCallsOut] = Field(description="By call kind and model.")
    prompt_tokens: int
    completion_tokens: int
    estimated_cost: float | None = Field(description=_COST)


class DayUsageOut(UsageTotalsOut):
    day: date = Field(description="A UTC day.")


class UsageReportOut(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    company_id: str
    from_: date = Field(alias="from", description="The first UTC day, included.")
    to: date = Field(description="The last UTC day, included.")
    days: list[DayUsageOut] = Field(description="Every day of the range, oldest first.")
    totals: UsageTotalsOut = Field(description="The whole range.")
    unpriced_models: list[str] = Field(
        description="Models in the range without a price in `MODEL_PRICES`: their cost, and "
        "every total that includes them, is null."
    )


# --- the model budget ---------------------------------------------------------------------------


class ModelBudgetIn(BaseModel):
    """The whole budget: both fields are required."""

    model_config = ConfigDict(extra="forbid")

    monthly_tokens: MonthlyTokens | None = Field(
        description="Prompt plus completion tokens a UTC month, as the provider reports them; "
        "null: unlimited."
    )
    when_spent: WhenSpent = Field(
        description="Once spent: `offline` consolidates with the offline rule engine, `defer` "
        "keeps the consolidations queued until the next month starts."
    )


class ModelBudgetOut(BaseModel):
    company_id: str
    monthly_tokens: int | None
    when_spent: WhenSpent
    default: bool = Field(description="True when the company never saved a budget (none).")
    updated_at: datetime | None = Field(description="Who changed it is in the audit trail.")
    period_start: date = Field(description="The current UTC month's first day.")
    period_end: date = Field(description="The next month's first day, when the budget renews.")
    spent_tokens: int = Field(description="Prompt plus completion tokens spent this month.")
    used_share: float | None = Field(description="Spent over the budget; null when unlimited.")
