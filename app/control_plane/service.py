"""Companies for operators: registered, read with their summary, listed; a user erased on an
operator's request; the company's spaces listed.

A summary is counted from the company's own rows (one shard each on Citus): users with a
memory profile, the last day anything of it was counted, and this month's usage report.
Listing companies reads every company's shard for the page's ids (`across_companies`), then
each company's summary from its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime

from sqlalchemy.ext.asyncio import AsyncSession

from app.companies import registry
from app.companies import repository as companies
from app.companies.repository import CompanyRecord
from app.control_plane.errors import CompanyBeingRemoved, CompanyNameTaken
from app.erasure.service import Erasure, erase_company_user
from app.kit.citus import across_companies
from app.kit.config import ModelPrice
from app.kit.pagination import Page, PageRequest, page_of
from app.kit.principal import Principal
from app.profiles.repository import count_users_with_memory
from app.usage import repository as usage
from app.usage.schemas import UsageTotalsOut
from app.usage.service import read_usage


@dataclass(frozen=True)
class CompanySummary:
    record: CompanyRecord
    users_with_memory: int
    last_activity: date | None
    usage_month: date
    usage_this_month: UsageTotalsOut


async def summary_of(
    session: AsyncSession, record: CompanyRecord, prices: Mapping[str, ModelPrice]
) -> CompanySummary:
    today = datetime.now(UTC).date()
    month = today.replace(day=1)
    report = await read_usage(session, record.company_id, month, today, prices)
    return CompanySummary(
        record,
        await count_users_with_memory(session, record.company_id),
        await usage.last_active_day(session, record.company_id),
        month,
        report.totals,
    )


async def create_company(
    session: AsyncSession, operator: Principal, company_id: str, display_name: str | None
) -> tuple[CompanyRecord, bool]:
    """Register a company (`operator` origin); (the record, whether it is new). Registering a
    registered company again with the same name (or none) is answered with its record; with
    another name it is a 409."""
    name = display_name or company_id
    created = await registry.register_company(session, operator, company_id, name, "operator")
    if created is not None:
        return created, True
    found = await companies.select_company(session, company_id)
    if found is None:  # registered and offboarded between the two statements
        raise CompanyBeingRemoved
    if display_name is not None and display_name != found.display_name:
        raise CompanyNameTaken(company_id, found.display_name)
    return found, False


async def read_company(
    session: AsyncSession, caller: Principal, company_id: str, prices: Mapping[str, ModelPrice]
) -> CompanySummary:
    """The company's record and summary (its own operators' first call registers it)."""
    found = await registry.known_company(session, caller, company_id)
    return await summary_of(session, found, prices)


async def list_companies(
    session: AsyncSession, page: PageRequest, prices: Mapping[str, ModelPrice]
) -> Page[CompanySummary]:
    """Companies in the order of their ids, keyset-paged, each with its summary."""
    # a page of the registry reaches every company's shard; each summary reads one
    async with across_companies(session):
        records = await companies.select_companies(
            session, after=page.text("company_id", max_length=128), limit=page.limit + 1
        )
    found = page_of(records, page.limit, lambda record: {"company_id": record.company_id})
    items = [await summary_of(session, record, prices) for record in found.items]
    return Page[CompanySummary](items=items, next_cursor=found.next_cursor)


@dataclass(frozen=True)
class UserErasure:
    company_id: str
    user_id: str
    erased_at: datetime
    erasure: Erasure


async def erase_user_on_request(
    session: AsyncSession, operator: Principal, company_id: str, user_id: str
) -> UserErasure:
    """Erase a user of `company_id` as `DELETE /v1/me` erases the caller, on the request of an
    operator of that company (authorised by the route); the `user.erased` event names the
    operator. Erasing a user the service holds nothing of answers zeros; a company that is
    not registered is a 404."""
    await registry.known_company(session, operator, company_id)
    erasure = await erase_company_user(session, operator, company_id, user_id)
    return UserErasure(company_id, user_id, datetime.now(UTC), erasure)
