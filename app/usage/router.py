"""Operator routes of usage metering: a company's usage per day, and its model budget."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Final

from fastapi import APIRouter, Body, Depends, Query, Request

from app.companies.dependencies import UNREGISTERED_RESPONSE, RegisteredCompanyDep
from app.kit.api_tags import OPERATOR
from app.kit.auth.dependencies import CompanyOperatorDep
from app.kit.config import ModelPrice, Settings
from app.kit.deps import CompanyIdPath, SessionDep
from app.usage import service
from app.usage.budget import Budget
from app.usage.schemas import ModelBudgetIn, ModelBudgetOut, UsageReportOut
from app.usage.service import MAX_RANGE_DAYS, ModelBudgetView

router = APIRouter()  # full paths, no prefix: metrics label by template

_DATE_PATTERN = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"
FromQuery = Annotated[
    str,
    Query(
        alias="from",
        pattern=_DATE_PATTERN,
        description="The first UTC day of the report, included (YYYY-MM-DD)",
        json_schema_extra={"format": "date"},
        openapi_examples={"first": {"summary": "A month's first day", "value": "2026-12-01"}},
    ),
]
ToQuery = Annotated[
    str,
    Query(
        pattern=_DATE_PATTERN,
        description=f"The last UTC day, included (YYYY-MM-DD); at most {MAX_RANGE_DAYS} days "
        "after `from`",
        json_schema_extra={"format": "date"},
        openapi_examples={"last": {"summary": "That month's last day", "value": "2026-12-31"}},
    ),
]

MODEL_BUDGET_EXAMPLES: Final[dict[str, Any]] = {
    "offline": {
        "summary": "Five million tokens a month, then the offline engine",
        "value": {"monthly_tokens": 5_000_000, "when_spent": "offline"},
    },
    "defer": {
        "summary": "Twenty million tokens a month, then wait for the next month",
        "value": {"monthly_tokens": 20_000_000, "when_spent": "defer"},
    },
}


async def _prices(request: Request) -> Mapping[str, ModelPrice]:
    settings: Settings = request.app.state.settings
    return settings.model_prices


PricesDep = Annotated[Mapping[str, ModelPrice], Depends(_prices)]


@router.get(
    "/v1/companies/{company_id}/usage",
    tags=[OPERATOR],
    summary="The company's usage per UTC day: turns, contexts, consolidations, model tokens",
    description="Called by an operator (billing, capacity) for a range of at most "
    f"{MAX_RANGE_DAYS} days: per day and in total, turns saved, contexts served, consolidation "
    "runs by outcome, and the model calls by kind and model with the prompt and completion "
    "tokens the provider reported, and a cost estimated from `MODEL_PRICES`.",
    responses={
        422: {
            "description": "A date that is not YYYY-MM-DD, `to` before `from`, or a range too long"
        }
    },
)
async def get_usage(
    company_id: CompanyIdPath,
    first: FromQuery,
    to: ToQuery,
    _operator: CompanyOperatorDep,
    session: SessionDep,
    prices: PricesDep,
) -> UsageReportOut:
    first_day, last_day = service.usage_range(first, to)
    return await service.read_usage(session, company_id, first_day, last_day, prices)


def _budget_out(view: ModelBudgetView) -> ModelBudgetOut:
    status = view.status
    return ModelBudgetOut(
        company_id=view.company_id,
        monthly_tokens=status.budget.monthly_tokens,
        when_spent=status.budget.when_spent,
        default=view.default,
        updated_at=view.updated_at,
        period_start=status.period.start,
        period_end=status.period.end,
        spent_tokens=status.spent,
        used_share=status.used_share,
    )


@router.get(
    "/v1/companies/{company_id}/model-budget",
    tags=[OPERATOR],
    summary="The company's monthly model budget and this month's spend",
    description="Called by an operator to see how many model tokens the company may spend a "
    "UTC month, what happens once they are spent, and how much is spent this month; "
    "`default` says the company never had a budget (unlimited).",
)
async def get_model_budget(
    company_id: CompanyIdPath, _operator: CompanyOperatorDep, session: SessionDep
) -> ModelBudgetOut:
    return _budget_out(await service.read_model_budget(session, company_id))


@router.put(
    "/v1/companies/{company_id}/model-budget",
    tags=[OPERATOR],
    summary="Set the company's monthly model budget (whole budget, audited)",
    description="Called by an operator to cap the model tokens a company's consolidations "
    "spend a UTC month (`monthly_tokens`, null: unlimited) and choose what happens once they "
    "are spent: `offline` (the offline rule engine consolidates) or `defer` (consolidations "
    "wait, queued, for the next month). Workers read it before their next model call. The "
    "change is in the audit trail; a budget equal to the one in force records nothing.",
    responses={
        422: {"description": "A field missing, unknown or out of range"},
        **UNREGISTERED_RESPONSE,
    },
)
async def put_model_budget(
    company_id: CompanyIdPath,
    _registered: RegisteredCompanyDep,
    body: Annotated[ModelBudgetIn, Body(openapi_examples=MODEL_BUDGET_EXAMPLES)],
    operator: CompanyOperatorDep,
    session: SessionDep,
) -> ModelBudgetOut:
    budget = Budget(body.monthly_tokens, body.when_spent)
    return _budget_out(await service.set_model_budget(session, operator, company_id, budget))
