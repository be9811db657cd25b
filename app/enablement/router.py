"""HTTP routes of the enablement domain: company flags, the company's memory policy, space
settings, the caller's enablement decision, and the audit log. (`/v1/me/settings`, whose off
switch deletes the memory, is served by `app.profiles.router`.)
"""

from __future__ import annotations

from typing import Annotated, Any, Final

from fastapi import APIRouter, Body, Depends, Path, Query

from app.companies.dependencies import UNREGISTERED_RESPONSE, RegisteredCompanyDep
from app.enablement import service
from app.enablement.decision import FLAG_CONTEXT_MEMORY, KNOWN_FLAGS
from app.enablement.schemas import (
    AuditEventOut,
    DecisionOut,
    FeatureFlagIn,
    FeatureFlagOut,
    FeatureFlagsOut,
    MemoryPolicyIn,
    MemoryPolicyOut,
    SpacePatch,
    SpaceSettingsOut,
)
from app.kit.api_tags import OPERATOR, SPACE_ADMIN, USER
from app.kit.auth.dependencies import CompanyOperatorDep, PrincipalDep, require_role
from app.kit.deps import CompanyIdPath, PageDep, SessionDep
from app.kit.pagination import Page
from app.kit.principal import Principal
from app.kit.schemas import IDENTIFIER_PATTERN

router = APIRouter()  # full paths, no prefix: metrics label by template; a tag per caller

SpaceAdminDep = Annotated[Principal, Depends(require_role("space_admin"))]

_SPACE_EXAMPLES: Final = {"space": {"summary": "A space of the company", "value": "space-1"}}
SpaceIdPath = Annotated[str, Path(pattern=IDENTIFIER_PATTERN, openapi_examples=_SPACE_EXAMPLES)]
# the service names the known flags in its 422; the schema lists them for clients and tools
FlagPath = Annotated[
    str,
    Path(
        max_length=128,
        json_schema_extra={"enum": list(KNOWN_FLAGS)},
        description="The flag's name",
        openapi_examples={
            "context_memory": {"summary": "Context memory itself", "value": FLAG_CONTEXT_MEMORY}
        },
    ),
]
SpaceIdQuery = Annotated[
    str,
    Query(
        pattern=IDENTIFIER_PATTERN,
        description="The space of the turn",
        openapi_examples=_SPACE_EXAMPLES,
    ),
]

# Request examples, as Swagger UI's "Try it out" sends them (`tests/test_openapi_examples.py`)
FLAG_EXAMPLES: Final[dict[str, Any]] = {
    "on": {"summary": "Switch it on for the company", "value": {"enabled": True}},
}
MEMORY_POLICY_EXAMPLES: Final[dict[str, Any]] = {
    "strict": {
        "summary": "Drop every category, keep Recent Topics 30 days, erase memories idle a year",
        "value": {
            "secrets": "drop",
            "payment_cards": "drop",
            "bank_accounts": "drop",
            "national_ids": "drop",
            "email_addresses": "drop",
            "phone_numbers": "drop",
            "instructions": "drop",
            "recent_topics_days": 30,
            "inactive_memory_days": 365,
        },
    },
    "defaults": {
        "summary": "The defaults: drop all but e-mail addresses and phone numbers (redacted)",
        "value": {
            "secrets": "drop",
            "payment_cards": "drop",
            "bank_accounts": "drop",
            "national_ids": "drop",
            "email_addresses": "redact",
            "phone_numbers": "redact",
            "instructions": "drop",
            "recent_topics_days": 90,
            "inactive_memory_days": 0,
        },
    },
}
SPACE_EXAMPLES: Final[dict[str, Any]] = {
    "memory_on": {"summary": "Context memory on in the space", "value": {"context_memory": True}},
    "budget": {
        "summary": "A larger memory budget",
        "value": {"user_memory": {"max_tokens": 3000}},
    },
}


# --- operator -----------------------------------------------------------------------------------


@router.get(
    "/v1/companies/{company_id}/feature-flags",
    tags=[OPERATOR],
    summary="The company's context memory flags",
    description="Called by an operator to see whether context memory is switched on for a "
    "company, and whether it may run beside web search; a flag never set is off.",
)
async def list_feature_flags(
    company_id: CompanyIdPath, _operator: CompanyOperatorDep, session: SessionDep
) -> FeatureFlagsOut:
    flags = await service.list_feature_flags(session, company_id)
    return FeatureFlagsOut(
        company_id=company_id, flags=[FeatureFlagOut.model_validate(f) for f in flags]
    )


@router.put(
    "/v1/companies/{company_id}/feature-flags/{flag}",
    tags=[OPERATOR],
    summary="Turn a company feature flag on or off (audited)",
    description="Called by an operator when a company starts (or stops) using context memory: "
    "the first step before any memory is kept for its users. The change is in the audit trail.",
    responses={422: {"description": "Unknown flag, or an invalid body"}, **UNREGISTERED_RESPONSE},
)
async def set_feature_flag(
    company_id: CompanyIdPath,
    _registered: RegisteredCompanyDep,
    flag: FlagPath,
    body: Annotated[FeatureFlagIn, Body(openapi_examples=FLAG_EXAMPLES)],
    operator: CompanyOperatorDep,
    session: SessionDep,
) -> FeatureFlagOut:
    saved = await service.set_feature_flag(session, operator, company_id, flag, body.enabled)
    return FeatureFlagOut.model_validate(saved)


@router.get(
    "/v1/companies/{company_id}/memory-policy",
    tags=[OPERATOR],
    summary="What the company allows in its users' memories",
    description="Called by an operator to see, per category of content (secrets, payment "
    "cards, bank accounts, national ids, e-mail addresses, phone numbers, instructions to the "
    "assistant), whether a memory drops it, redacts it or keeps it, and how long memories "
    "live; `default` says the company never changed the defaults.",
)
async def get_memory_policy(
    company_id: CompanyIdPath, _operator: CompanyOperatorDep, session: SessionDep
) -> MemoryPolicyOut:
    return MemoryPolicyOut.of(await service.read_company_memory_policy(session, company_id))


@router.put(
    "/v1/companies/{company_id}/memory-policy",
    tags=[OPERATOR],
    summary="Set what the company allows in its users' memories (whole policy, audited)",
    description="Called by an operator to set the company's memory policy: every category and "
    "both retention fields, each required. It applies from the next write of any memory of the "
    "company (what is stored already is not rewritten). The change is in the audit trail; a "
    "policy equal to the one in force changes nothing and is not recorded.",
    responses={
        422: {"description": "A field missing, unknown or out of range"},
        **UNREGISTERED_RESPONSE,
    },
)
async def put_memory_policy(
    company_id: CompanyIdPath,
    _registered: RegisteredCompanyDep,
    body: Annotated[MemoryPolicyIn, Body(openapi_examples=MEMORY_POLICY_EXAMPLES)],
    operator: CompanyOperatorDep,
    session: SessionDep,
) -> MemoryPolicyOut:
    view = await service.set_company_memory_policy(session, operator, company_id, body.to_policy())
    return MemoryPolicyOut.of(view)


@router.get(
    "/v1/companies/{company_id}/audit-events",
    tags=[OPERATOR],
    summary="Who changed which setting, when, old -> new (newest first)",
    description="Called by an operator (or an auditor through one) to answer who switched "
    "memory on or off where: flags, space settings, users' switches and erasures.",
)
async def list_audit_events(
    company_id: CompanyIdPath, _operator: CompanyOperatorDep, page: PageDep, session: SessionDep
) -> Page[AuditEventOut]:
    return AuditEventOut.page(await service.list_audit_events(session, company_id, page))


# --- space admin (the space always belongs to the token's company) ------------------------------


@router.get(
    "/v1/spaces/{space_id}",
    tags=[SPACE_ADMIN],
    summary="A space's context memory settings",
    description="Called by a space admin of the token's company, from the space's settings "
    "page: the stored and effective settings, the memory switch users see, and the company "
    "conditions. A space never configured reads as the defaults.",
)
async def get_space(
    space_id: SpaceIdPath, admin: SpaceAdminDep, session: SessionDep
) -> SpaceSettingsOut:
    return SpaceSettingsOut.of(await service.read_space(session, admin.company_id, space_id))


@router.patch(
    "/v1/spaces/{space_id}",
    tags=[SPACE_ADMIN],
    summary="Change a space's context memory settings (partial, audited)",
    description="Called by a space admin of the token's company to switch context memory on or "
    "off in a space, or to set its memory budget and model; fields left out keep their value.",
    responses={
        409: {"description": "A concurrent save of the space won; send the request again"},
        422: {"description": "Invalid value, or memory switched on behind web search"},
    },
)
async def patch_space(
    space_id: SpaceIdPath,
    body: Annotated[SpacePatch, Body(openapi_examples=SPACE_EXAMPLES)],
    admin: SpaceAdminDep,
    session: SessionDep,
) -> SpaceSettingsOut:
    return SpaceSettingsOut.of(await service.update_space(session, admin, space_id, body))


# --- the caller ---------------------------------------------------------------------------------


@router.get(
    "/v1/me/memory/enablement",
    tags=[USER],
    summary="Whether context memory is active for you in a space, with every condition",
    description="Called for the person, e.g. by a settings page or a chat UI showing a memory "
    "indicator: whether memory is active for them in this space, and each company, space and "
    "user condition behind the answer.",
)
async def get_my_enablement(
    space_id: SpaceIdQuery, principal: PrincipalDep, session: SessionDep
) -> DecisionOut:
    context = await service.load_enablement(
        session, principal.company_id, space_id, principal.user_id
    )
    return DecisionOut.of(context.decision)
