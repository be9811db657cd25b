"""The registry's check as a FastAPI dependency of the operator routes (`RegisteredCompanyDep`):
the route's company is registered, or registered now by a token of its own (see registry.py)."""

from __future__ import annotations

from typing import Annotated, Any, Final

from fastapi import Depends

from app.companies.registry import known_company
from app.kit.auth.dependencies import CompanyOperatorDep
from app.kit.deps import CompanyIdPath, SessionDep


async def _registered_company(
    company_id: CompanyIdPath, operator: CompanyOperatorDep, session: SessionDep
) -> str:
    await known_company(session, operator, company_id)
    return company_id


UNREGISTERED_RESPONSE: Final[dict[int | str, dict[str, Any]]] = {
    404: {"description": "The company is not registered: register it with POST /v1/companies"}
}
"""The documented answer of a route whose company must be registered."""

RegisteredCompanyDep = Annotated[str, Depends(_registered_company)]
"""An operator route's `company_id`, checked after the role: registered (or registered now by
its own token), else 404 with the way to register it."""
