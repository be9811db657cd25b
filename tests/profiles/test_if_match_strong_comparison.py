"""`If-Match` compares strongly (RFC 9110 §13.1.1): a weak entity tag never matches, alone or in
a list, on every route that takes the header; `*` and a strong tag of the current version do.

The routes are found in the app (every route with an `If-Match` header parameter), so a new
conditional write cannot be left out of `WRITES`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import httpx
import pytest
from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, iter_route_contexts

from app.profiles.document import Section
from tests.helpers.apps import AuthFactory
from tests.helpers.profiles import memory_md
from tests.helpers.settings import enable_company

ME = "/v1/me/memory"
CURRENT = 2  # the head of every test: version 2, over version 1


def content(phase: str) -> str:
    return memory_md({Section.WORK: [f"Phase {phase}."]})


@dataclass(frozen=True)
class Write:
    """A conditional write of the caller's memory, and the status of its success."""

    method: str
    url: str
    body: Callable[[], object] | None
    success: int


WRITES: dict[tuple[str, str], Write] = {
    ("PUT", ME): Write("PUT", ME, lambda: {"content": content("new")}, 200),
    ("DELETE", ME): Write("DELETE", ME, None, 204),
    ("POST", f"{ME}/versions/{{n}}/restore"): Write("POST", f"{ME}/versions/1/restore", None, 201),
    ("POST", f"{ME}/import"): Write(
        "POST", f"{ME}/import", lambda: {"profile": {"content": content("imported")}}, 200
    ),
}

# The head is "2": none of these names it strongly.
REFUSED = [
    'W/"2"',
    'W/"1", W/"2"',
    '"1", W/"2"',
    'W/"2", "3"',
    'w/"2"',  # not a weak tag either (the prefix is case-sensitive): a malformed member
    '"W/2"',  # an opaque tag that is not the version
    'W/"2", *',  # `*` only stands alone
]
ACCEPTED = ['"2"', '"1", "2"', 'W/"1", "2"', "*"]


def header_names(dependant: Dependant) -> set[str]:
    names = {param.alias.lower() for param in dependant.header_params}
    for sub in dependant.dependencies:
        names |= header_names(sub)
    return names


def conditional_routes(app: FastAPI) -> set[tuple[str, str]]:
    """Every (method, path) of the app whose route takes an `If-Match` header."""
    found: set[tuple[str, str]] = set()
    for context in iter_route_contexts(app.routes):
        route = context.original_route
        if isinstance(route, APIRoute) and "if-match" in header_names(route.dependant):
            found.update(
                (method, str(context.path)) for method in (route.methods or set()) - {"HEAD"}
            )
    return found


async def two_versions(client: httpx.AsyncClient, auth: AuthFactory) -> None:
    await enable_company(client, auth)
    first = await client.put(
        ME, json={"content": content("1")}, headers={**auth(), "If-None-Match": "*"}
    )
    assert first.status_code == 201, first.text
    second = await client.put(
        ME, json={"content": content("2")}, headers={**auth(), "If-Match": '"1"'}
    )
    assert second.status_code == 200, second.text
    assert second.headers["etag"] == f'"{CURRENT}"'


async def send(
    client: httpx.AsyncClient, auth: AuthFactory, write: Write, if_match: str
) -> httpx.Response:
    body = None if write.body is None else write.body()
    headers = {**auth(), "If-Match": if_match}
    return await client.request(write.method, write.url, json=body, headers=headers)


def test_every_route_taking_if_match_is_in_the_table(app: FastAPI) -> None:
    assert conditional_routes(app) == set(WRITES)


@pytest.mark.parametrize("route", sorted(WRITES), ids=" ".join)
async def test_a_weak_tag_never_matches_and_nothing_changes(
    client: httpx.AsyncClient, auth: AuthFactory, route: tuple[str, str]
) -> None:
    await two_versions(client, auth)
    before = (await client.get(ME, headers=auth())).json()
    for if_match in REFUSED:
        answer = await send(client, auth, WRITES[route], if_match)
        assert answer.status_code == 412, (if_match, answer.text)
        assert answer.headers["content-type"] == "application/problem+json"
        assert "If-Match does not name the current version" in answer.json()["detail"]
    assert (await client.get(ME, headers=auth())).json() == before


@pytest.mark.parametrize("if_match", ACCEPTED)
@pytest.mark.parametrize("route", sorted(WRITES), ids=" ".join)
async def test_a_strong_tag_of_the_head_or_a_star_matches(
    client: httpx.AsyncClient, auth: AuthFactory, route: tuple[str, str], if_match: str
) -> None:
    await two_versions(client, auth)
    answer = await send(client, auth, WRITES[route], if_match)
    assert answer.status_code == WRITES[route].success, answer.text
