"""`DELETE /v1/me`: erase everything the service holds about the caller."""

from __future__ import annotations

from fastapi import APIRouter

from app.erasure import service
from app.erasure.schemas import ErasureOut
from app.kit.api_tags import USER
from app.kit.auth.dependencies import PrincipalDep
from app.kit.deps import SessionDep

router = APIRouter(tags=[USER])  # beside GET /v1/me; full paths, no prefix


@router.delete(
    "/v1/me",
    summary="Erase everything the service holds about you (memory, chats, jobs, settings)",
    description="Called by the person (or by the product on their behalf) who wants the "
    "service to forget them: memory, chats, settings, jobs and idempotency records go in one "
    "transaction. Keeps one audit event naming you, with these counts. Idempotent: a second "
    "call finds nothing and answers zeros.",
)
async def erase_me(principal: PrincipalDep, session: SessionDep) -> ErasureOut:
    return ErasureOut.model_validate(await service.erase_user(session, principal))
