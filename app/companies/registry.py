"""Which companies the service knows, and the one check of every operator write to a company:
the company must be registered, or the caller one of its own (its first use registers it).

A platform operator naming a company that is not registered gets a 404 with the way out
(`POST /v1/companies`), so that a typo in a company id never creates settings for a company
nobody serves. A token of the company itself (a `company_operator`, or an `operator` whose
token names that company) registers it on first use, as `first_use`, with its id as its name.
"""

from __future__ import annotations

from typing import Final

from sqlalchemy.ext.asyncio import AsyncSession

from app.companies import repository
from app.companies.errors import UnknownCompany
from app.companies.repository import CompanyRecord
from app.kit.principal import Principal

REGISTERED: Final = "company.registered"
"""The platform event of a registration (`detail`: its origin and display name)."""


async def register_company(
    session: AsyncSession, actor: Principal, company_id: str, display_name: str, origin: str
) -> CompanyRecord | None:
    """Register `company_id` with a platform event naming `actor`; None when it was registered
    already (nothing is written then)."""
    created = await repository.insert_company(session, company_id, display_name, origin)
    if created is not None:
        await repository.record_platform_event(
            session,
            company_id,
            actor=(actor.company_id, actor.user_id),
            action=REGISTERED,
            detail={"origin": origin, "display_name": display_name},
        )
    return created


async def known_company(session: AsyncSession, actor: Principal, company_id: str) -> CompanyRecord:
    """The registered company of an operator's write; registered now when `actor`'s token is
    of that company (first use); `UnknownCompany` otherwise."""
    found = await repository.select_company(session, company_id)
    if found is not None:
        return found
    if actor.company_id == company_id:
        await register_company(session, actor, company_id, company_id, "first_use")
        found = await repository.select_company(session, company_id)
    if found is None:
        raise UnknownCompany(company_id)
    return found
