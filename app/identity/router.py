"""`GET /v1/me`: who the bearer token says the caller is, read from the token alone."""

from __future__ import annotations

from fastapi import APIRouter

from app.identity.schemas import Me
from app.kit.api_tags import USER
from app.kit.auth.dependencies import PrincipalDep

router = APIRouter(tags=[USER])  # beside DELETE /v1/me; full paths, no prefix


@router.get(
    "/v1/me",
    summary="Who the bearer token says the caller is",
    description="Called by anyone holding a token, first of all to check it: the user, company "
    "and known roles the service reads from it, without touching the database. Every refused "
    "token is the same 401, which does not say why.",
)
async def who_am_i(principal: PrincipalDep) -> Me:
    return Me(
        user_id=principal.user_id, company_id=principal.company_id, roles=sorted(principal.roles)
    )
