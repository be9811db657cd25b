"""HTTP routes of the enablement domain: company flags, space settings, the caller's enablement
decision, and the audit log. (`/v1/me/settings`, whose off switch deletes the memory, is served
by `app.profiles.router`.)
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query

from app.auth import Principal, PrincipalDep, require_role
from app.db import SessionDep
from app.enablement import service
from app.enablement.decision import KNOWN_FLAGS
from app.enablement.schemas import (
    AuditEventOut,
    DecisionOut,
    FeatureFlagIn,
    FeatureFlagOut,
    FeatureFlagsOut,
    SpacePatch,
    SpaceSettingsOut,
)
from app.pagination import Page, PageDep

router = APIRouter(tags=["settings"])  # full paths, no prefix: metrics label by template

OperatorDep = Annotated[Principal, Depends(require_role("operator"))]
SpaceAdminDep = Annotated[Principal, Depends(require_role("space_admin"))]

_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"
CompanyIdPath = Annotated[str, Path(min_length=1, max_length=128)]
SpaceIdPath = Annotated[str, Path(pattern=_ID_PATTERN)]
# the service names the known flags in its 422; the schema lists them for clients and tools
FlagPath = Annotated[
    str,
    Path(
        max_length=128, json_schema_extra={"enum": list(KNOWN_FLAGS)}, description="The flag's name"
    ),
]
SpaceIdQuery = Annotated[str, Query(pattern=_ID_PATTERN, description="The space of the turn")]


# --- operator -----------------------------------------------------------------------------------


@router.get(
    "/v1/companies/{company_id}/feature-flags", summary="The company's context memory flags"
)
async def list_feature_flags(
    company_id: CompanyIdPath, _operator: OperatorDep, session: SessionDep
) -> FeatureFlagsOut:
    flags = await service.list_feature_flags(session, company_id)
    return FeatureFlagsOut(company_id=company_id, flags=[FeatureFlagOut.of(f) for f in flags])


@router.put(
    "/v1/companies/{company_id}/feature-flags/{flag}",
    summary="Turn a company feature flag on or off (audited)",
    responses={422: {"description": "Unknown flag, or an invalid body"}},
)
async def set_feature_flag(
    company_id: CompanyIdPath,
    flag: FlagPath,
    body: FeatureFlagIn,
    operator: OperatorDep,
    session: SessionDep,
) -> FeatureFlagOut:
    saved = await service.set_feature_flag(session, operator, company_id, flag, body.enabled)
    return FeatureFlagOut.of(saved)


@router.get(
    "/v1/companies/{company_id}/audit-events",
    summary="Who changed which setting, when, old -> new (newest first)",
)
async def list_audit_events(
    company_id: CompanyIdPath, _operator: OperatorDep, page: PageDep, session: SessionDep
) -> Page[AuditEventOut]:
    return AuditEventOut.page(await service.list_audit_events(session, company_id, page))


# --- space admin (the space always belongs to the token's company) ------------------------------


@router.get("/v1/spaces/{space_id}", summary="A space's context memory settings")
async def get_space(
    space_id: SpaceIdPath, admin: SpaceAdminDep, session: SessionDep
) -> SpaceSettingsOut:
    return SpaceSettingsOut.of(await service.read_space(session, admin.company_id, space_id))


@router.patch(
    "/v1/spaces/{space_id}",
    summary="Change a space's context memory settings (partial, audited)",
    responses={422: {"description": "Invalid value, or memory switched on behind web search"}},
)
async def patch_space(
    space_id: SpaceIdPath, body: SpacePatch, admin: SpaceAdminDep, session: SessionDep
) -> SpaceSettingsOut:
    return SpaceSettingsOut.of(await service.update_space(session, admin, space_id, body))


# --- the caller ---------------------------------------------------------------------------------


@router.get(
    "/v1/me/memory/enablement",
    summary="Whether context memory is active for you in a space, with every condition",
)
async def get_my_enablement(
    space_id: SpaceIdQuery, principal: PrincipalDep, session: SessionDep
) -> DecisionOut:
    context = await service.load_enablement(
        session, principal.company_id, space_id, principal.user_id
    )
    return DecisionOut.of(context.decision)
