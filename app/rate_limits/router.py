"""Operators' routes of the rate limits: a company's limits in force, and its overrides."""

from __future__ import annotations

from typing import Annotated, Any, Final

from fastapi import APIRouter, Body, Request

from app.companies.dependencies import UNREGISTERED_RESPONSE, RegisteredCompanyDep
from app.kit.api_tags import OPERATOR
from app.kit.auth.dependencies import CompanyOperatorDep
from app.kit.deps import CompanyIdPath, SessionDep
from app.rate_limits import service
from app.rate_limits.limiter import RateLimiter
from app.rate_limits.schemas import RateLimitsIn, RateLimitsOut

router = APIRouter()

RATE_LIMITS_EXAMPLES: Final[dict[str, Any]] = {
    "bigger_turns": {
        "summary": "More turn-saves per user, no company-wide limit on them",
        "value": {"turns": {"user": {"quota": 240, "window_seconds": 60}, "company": "unlimited"}},
    },
    "defaults": {"summary": "Back to the service's defaults", "value": {}},
}


def _limiter(request: Request) -> RateLimiter:
    limiter: RateLimiter = request.app.state.rate_limiter
    return limiter


@router.get(
    "/v1/companies/{company_id}/rate-limits",
    tags=[OPERATOR],
    summary="The company's rate limits in force",
    description="Called by an operator to see, per class of routes (context, turns, "
    "consolidations, exports, memory writes), the limit per user and for the whole company, "
    "and which of them the company's overrides set.",
)
async def get_rate_limits(
    company_id: CompanyIdPath, _operator: CompanyOperatorDep, session: SessionDep, request: Request
) -> RateLimitsOut:
    view = await service.read_rate_limits(session, _limiter(request), company_id)
    return RateLimitsOut.of(view)


@router.put(
    "/v1/companies/{company_id}/rate-limits",
    tags=[OPERATOR],
    summary="Set the company's rate-limit overrides (whole set, audited)",
    description="Called by an operator to give a company other limits than the service's "
    "defaults: per class, per user and for the whole company, a limit, `unlimited`, or the "
    "default (left out). Replaces the whole set. The change is in the audit trail and applies "
    "at once on this process, within RATE_LIMIT_REFRESH_SECONDS on the others.",
    responses={422: {"description": "A field unknown or out of range"}, **UNREGISTERED_RESPONSE},
)
async def put_rate_limits(
    company_id: CompanyIdPath,
    _registered: RegisteredCompanyDep,
    body: Annotated[RateLimitsIn, Body(openapi_examples=RATE_LIMITS_EXAMPLES)],
    operator: CompanyOperatorDep,
    session: SessionDep,
    request: Request,
) -> RateLimitsOut:
    view = await service.set_rate_limits(
        session, _limiter(request), operator, company_id, body.to_overrides()
    )
    return RateLimitsOut.of(view)
