"""HTTP routes of the control plane: companies (platform operators), offboarding and its
receipt, a user's erasure on request and the company's spaces (the company's own operators
too). Thin: each calls one service function."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Final

from fastapi import APIRouter, BackgroundTasks, Body, Depends, Path, Request, Response, status

from app.companies.registry import known_company
from app.companies.repository import OffboardingRecord
from app.control_plane import offboarding, service
from app.control_plane.offboarding import Offboarder
from app.control_plane.schemas import CompanyIn, CompanyOut, OffboardingOut, UserErasureOut
from app.control_plane.service import CompanySummary
from app.enablement import service as enablement
from app.enablement.router import SPACE_EXAMPLES, SpaceIdPath
from app.enablement.schemas import SpacePatch, SpaceSettingsOut
from app.erasure.schemas import AnonymisedOut, DeletedOut
from app.kit.api_tags import OPERATOR
from app.kit.auth.dependencies import CompanyOperatorDep, PlatformOperatorDep
from app.kit.config import ModelPrice, Settings
from app.kit.deps import CompanyIdPath, PageDep, SessionDep, database
from app.kit.pagination import Page

router = APIRouter()  # full paths, no prefix: metrics label by template

Responses = dict[int | str, dict[str, Any]]
_UNKNOWN: Final[Responses] = {
    404: {"description": "No such company (a platform operator is told how to register it)"}
}

UserIdPath = Annotated[
    str,
    Path(
        min_length=1,
        max_length=256,
        pattern=r"^[^\x00-\x1f\x7f]+$",
        description="The user, as the company's tokens name them (`sub`)",
        openapi_examples={"user": {"summary": "A user of the company", "value": "bob"}},
    ),
]
COMPANY_EXAMPLES: Final[dict[str, Any]] = {
    "named": {
        "summary": "A company and the name people know it by",
        "value": {"company_id": "initech", "display_name": "Initech"},
    },
}


async def _operated_company(
    company_id: CompanyIdPath, caller: CompanyOperatorDep, session: SessionDep
) -> str:
    await known_company(session, caller, company_id)
    return company_id


OperatedCompanyDep = Annotated[str, Depends(_operated_company)]
"""The company of the path, for a platform operator or that company's operator, once the
registry knows it (its own operator's first call registers it; else 404 with the way out)."""


async def _prices(request: Request) -> Mapping[str, ModelPrice]:
    settings: Settings = request.app.state.settings
    return settings.model_prices


PricesDep = Annotated[Mapping[str, ModelPrice], Depends(_prices)]


def _company_out(summary: CompanySummary) -> CompanyOut:
    record = summary.record
    return CompanyOut(
        company_id=record.company_id,
        display_name=record.display_name,
        origin=record.origin,
        created_at=record.created_at,
        users_with_memory=summary.users_with_memory,
        last_activity=summary.last_activity,
        usage_month=summary.usage_month,
        usage_this_month=summary.usage_this_month,
    )


def _receipt(record: OffboardingRecord) -> OffboardingOut:
    return OffboardingOut(
        offboarding_id=record.id,
        company_id=record.subject_company,
        status=record.status,
        requested_at=record.requested_at,
        started_at=record.started_at,
        finished_at=record.finished_at,
        erased=record.erased,
        erased_rows=sum(record.erased.values()),
    )


# --- companies ----------------------------------------------------------------------------------


@router.get(
    "/v1/companies",
    tags=[OPERATOR],
    summary="Every company the service serves, with a summary each (platform operators)",
    description="Called by a platform operator (the admin console's company list): companies "
    "in the order of their ids, each with its users with memory, its last day of activity and "
    "this month's usage.",
)
async def list_companies(
    _operator: PlatformOperatorDep, page: PageDep, prices: PricesDep, session: SessionDep
) -> Page[CompanyOut]:
    found = await service.list_companies(session, page, prices)
    return Page[CompanyOut](
        items=[_company_out(item) for item in found.items], next_cursor=found.next_cursor
    )


@router.post(
    "/v1/companies",
    tags=[OPERATOR],
    status_code=status.HTTP_201_CREATED,
    summary="Register a company (platform operators)",
    description="Called by a platform operator onboarding a company, before its flags are set: "
    "201 with the new record; 200 with the record when it is registered already (the same "
    "request sent again), 409 when it is registered under another display name.",
    responses={
        200: {"description": "Registered already: its record", "model": CompanyOut},
        409: {"description": "Registered already under another display name"},
        422: {"description": "An id that is not 1..128 of `A-Za-z0-9._:-`, or an unknown field"},
    },
)
async def create_company(
    body: Annotated[CompanyIn, Body(openapi_examples=COMPANY_EXAMPLES)],
    operator: PlatformOperatorDep,
    prices: PricesDep,
    response: Response,
    session: SessionDep,
) -> CompanyOut:
    record, created = await service.create_company(
        session, operator, body.company_id, body.display_name
    )
    if not created:
        response.status_code = status.HTTP_200_OK
    return _company_out(await service.summary_of(session, record, prices))


@router.get(
    "/v1/companies/{company_id}",
    tags=[OPERATOR],
    summary="A company's record and summary",
    description="Called by a platform operator, or by an operator of that company "
    "(`company_operator`, whose first call registers it): its name, origin, users with memory, "
    "last activity and this month's usage. Another company's operator gets 404.",
    responses=_UNKNOWN,
)
async def read_company(
    company_id: CompanyIdPath,
    caller: CompanyOperatorDep,
    prices: PricesDep,
    session: SessionDep,
) -> CompanyOut:
    return _company_out(await service.read_company(session, caller, company_id, prices))


@router.delete(
    "/v1/companies/{company_id}",
    tags=[OPERATOR],
    status_code=status.HTTP_202_ACCEPTED,
    summary="Offboard a company: erase everything it holds (platform operators, audited)",
    description="Called by a platform operator when a company leaves (its issuer removed "
    "first): its registration ends at once and every row it holds, in every table, is erased "
    "by a durable job; the answer is the receipt, which `GET .../offboarding` follows to "
    "`done`. Sending it again answers the same receipt. Recorded in the platform log, which "
    "outlives the company.",
    responses=_UNKNOWN,
)
async def offboard_company(
    company_id: CompanyIdPath,
    operator: PlatformOperatorDep,
    request: Request,
    background: BackgroundTasks,
    session: SessionDep,
) -> OffboardingOut:
    record = await offboarding.request_offboarding(session, operator, company_id)
    if record.status != "done":
        offboarder: Offboarder = request.app.state.offboarder
        background.add_task(offboarder.run_after_answer, database(request).engine, record.id)
    return _receipt(record)


@router.get(
    "/v1/companies/{company_id}/offboarding",
    tags=[OPERATOR],
    summary="The receipt of a company's offboarding (platform operators)",
    description="Called by a platform operator after `DELETE /v1/companies/{company_id}`: the "
    "status, and the rows erased per table, with the times; never content. Readable after the "
    "company is gone.",
    responses={404: {"description": "The company was never offboarded"}},
)
async def read_offboarding(
    company_id: CompanyIdPath, _operator: PlatformOperatorDep, session: SessionDep
) -> OffboardingOut:
    return _receipt(await offboarding.read_offboarding(session, company_id))


# --- a user's erasure on request ----------------------------------------------------------------


@router.delete(
    "/v1/companies/{company_id}/users/{user_id}",
    tags=[OPERATOR],
    summary="Erase a user of the company on request (its operators, audited)",
    description="Called by an operator of the company (or a platform operator) on a person's "
    "erasure request: everything the service holds about the user goes, as `DELETE /v1/me` "
    "does it, in one transaction; the answer is the receipt with the counts. The company's "
    "audit log keeps one `user.erased` event naming the operator. A user with nothing stored "
    "answers zeros.",
    responses=_UNKNOWN,
)
async def erase_company_user(
    company_id: CompanyIdPath,
    user_id: UserIdPath,
    operator: CompanyOperatorDep,
    session: SessionDep,
) -> UserErasureOut:
    done = await service.erase_user_on_request(session, operator, company_id, user_id)
    counts = done.erasure
    return UserErasureOut(
        company_id=done.company_id,
        user_id=done.user_id,
        erased_at=done.erased_at,
        deleted=DeletedOut.model_validate(counts.deleted),
        anonymised=AnonymisedOut.model_validate(counts.anonymised),
    )


# --- the company's spaces -----------------------------------------------------------------------


@router.get(
    "/v1/companies/{company_id}/spaces",
    tags=[OPERATOR],
    summary="The company's configured spaces, with their settings",
    description="Called by an operator of the company (or a platform operator): every space "
    "whose settings were saved, by space id, as `GET /v1/spaces/{space_id}` shows it. A space "
    "never configured is at its defaults and not listed.",
    responses=_UNKNOWN,
)
async def list_company_spaces(
    company: OperatedCompanyDep,
    page: PageDep,
    session: SessionDep,
) -> Page[SpaceSettingsOut]:
    found = await enablement.list_spaces(session, company, page)
    return Page[SpaceSettingsOut](
        items=[SpaceSettingsOut.of(view) for view in found.items], next_cursor=found.next_cursor
    )


@router.get(
    "/v1/companies/{company_id}/spaces/{space_id}/settings",
    tags=[OPERATOR],
    summary="A space's context memory settings, for the company's operators",
    description="Called by an operator of the company (or a platform operator): what "
    "`GET /v1/spaces/{space_id}` shows the company's space admins. A space never configured "
    "reads as the defaults.",
    responses=_UNKNOWN,
)
async def read_company_space(
    company: OperatedCompanyDep, space_id: SpaceIdPath, session: SessionDep
) -> SpaceSettingsOut:
    return SpaceSettingsOut.of(await enablement.read_space(session, company, space_id))


@router.put(
    "/v1/companies/{company_id}/spaces/{space_id}/settings",
    tags=[OPERATOR],
    summary="Change a space's context memory settings, for the company's operators (audited)",
    description="Called by an operator of the company (or a platform operator) with what a "
    "space admin's `PATCH /v1/spaces/{space_id}` takes: fields left out keep their value. "
    "Audited in the company's log like the space admin's changes, naming the operator.",
    responses={
        **_UNKNOWN,
        409: {"description": "A concurrent save of the space won; send the request again"},
        422: {"description": "Invalid value, or memory switched on behind web search"},
    },
)
async def set_company_space(
    company: OperatedCompanyDep,
    space_id: SpaceIdPath,
    body: Annotated[SpacePatch, Body(openapi_examples=SPACE_EXAMPLES)],
    caller: CompanyOperatorDep,
    session: SessionDep,
) -> SpaceSettingsOut:
    view = await enablement.update_space(session, caller, space_id, body, company_id=company)
    return SpaceSettingsOut.of(view)
