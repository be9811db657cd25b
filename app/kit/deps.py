"""The request's database, a list route's page and an operator route's `company_id`, as FastAPI
dependencies and parameters (the plumbing itself, framework-free, is in `app/kit/db/`,
`app/kit/pagination.py` and `app/kit/schemas.py`).

A request gets one transaction from `SessionDep`; it is committed after the route returns and
*before* the response is sent (`Depends(scope="function")`), so a failed commit can never reach
the client as a 2xx.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Depends, Path, Query, Request
from sqlalchemy.ext.asyncio import AsyncSession

from app.kit.db.engine import Database
from app.kit.pagination import (
    DEFAULT_LIMIT,
    MAX_CURSOR_CHARS,
    MAX_LIMIT,
    PageRequest,
    decode_cursor,
)
from app.kit.schemas import COMPANY_ID_PATTERN


def database(request: Request) -> Database:
    db: Database = request.app.state.database
    return db


async def _request_session(request: Request) -> AsyncIterator[AsyncSession]:
    """One transaction per request: commit on success, roll back on any error."""
    async with database(request).sessionmaker() as session, session.begin():
        yield session


SessionDep = Annotated[AsyncSession, Depends(_request_session, scope="function")]


async def _page_request(
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="Page size")] = DEFAULT_LIMIT,
    cursor: Annotated[
        str | None, Query(max_length=MAX_CURSOR_CHARS, description="From `next_cursor`")
    ] = None,
) -> PageRequest:
    return PageRequest(limit=limit, position=decode_cursor(cursor) if cursor else None)


PageDep = Annotated[PageRequest, Depends(_page_request)]


def company_id_path(example: str, summary: str) -> Any:
    """The `company_id` of an operator's route, with the example its documentation shows."""
    return Path(
        min_length=1,
        max_length=128,
        pattern=COMPANY_ID_PATTERN,
        description="The company, as the tokens of its users name it (`company_id`)",
        openapi_examples={"company": {"summary": summary, "value": example}},
    )


CompanyIdPath = Annotated[str, company_id_path("acme", "The development company")]
