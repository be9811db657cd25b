"""HTTP route of the folders domain: the read-only view of the company's `user-memory` root."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from app.folders import service
from app.folders.schemas import FolderOut
from app.kit.api_tags import SPACE_ADMIN
from app.kit.auth.dependencies import PrincipalDep, require_operator_or_company_admin, role_check
from app.kit.deps import CompanyIdPath, SessionDep
from app.kit.principal import Principal

router = APIRouter(tags=[SPACE_ADMIN])  # full paths, no prefix: metrics label by template


@role_check
async def company_reader(principal: PrincipalDep, company_id: CompanyIdPath) -> Principal:
    """Operators, or a space admin of `company_id` (another company's space admin gets 404)."""
    require_operator_or_company_admin(principal, company_id, space_admin_may_read=True)
    return principal


@router.get(
    "/v1/companies/{company_id}/folders/user-memory",
    summary="The company's user-memory root folder and its ACL (never per-user folders)",
    description="Called by a space admin of that company, or an operator of any, to check "
    "where users' memory is kept and who may read it. Each user's own folder never shows: "
    "only its owner reads it.",
    responses={404: {"description": "Not created yet, or not your company"}},
)
async def get_root_folder(
    company_id: CompanyIdPath,
    _reader: Annotated[Principal, Depends(company_reader)],
    session: SessionDep,
) -> FolderOut:
    return FolderOut.of(await service.read_root_folder(session, company_id))
