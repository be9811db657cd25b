"""Tampered pagination cursors: every route that takes `?cursor=` answers a well-formed cursor
holding a value its query cannot carry (an id past the column's range, a boolean for a number,
a timestamp with no UTC twin) with a 422 naming `query.cursor`, never a 500.

The paginated routes are found in the app (every route with a `cursor` query parameter), and
each must have a row in `CURSOR_KEYS`, so a new one cannot be left out: its valid cursor is
answered 200 first (the keys are right and the route reaches its query), then each key is
replaced by every hostile value of its kind.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import httpx
import pytest
from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, iter_route_contexts

from app.kit.pagination import BIGINT_MAX, INTEGER_MAX
from app.profiles.document import Section
from tests.helpers.apps import COMPANY, OPERATOR, USER, AuthFactory
from tests.helpers.profiles import memory_md
from tests.helpers.settings import enable_company
from tests.helpers.turns import save_turn, user
from tests.test_route_policy import ROUTE_POLICIES

CHAT = "chat-cursors"
VALID_INSTANT = "2026-06-17T12:00:00+00:00"
VALID_UUID = "0b7e5c1e-6d0f-4c1b-9a57-3f1e2a9d8c41"


@dataclass(frozen=True)
class Key:
    """A cursor key as its route reads it: an integer column (and its range), a timestamp or
    a UUID."""

    kind: Literal["integer", "instant", "uuid", "text"]
    maximum: int = BIGINT_MAX


CURSOR_KEYS: dict[str, dict[str, Key]] = {
    "/v1/me/memory/versions": {"version": Key("integer", INTEGER_MAX)},
    "/v1/me/memory/policy-actions": {"id": Key("integer")},
    "/v1/chats/{chat_id}/messages": {"id": Key("integer")},
    "/v1/companies/{company_id}/jobs": {"created_at": Key("instant"), "id": Key("uuid")},
    "/v1/companies/{company_id}/audit-events": {"id": Key("integer")},
    "/v1/companies": {"company_id": Key("text", 128)},
    "/v1/companies/{company_id}/spaces": {"space_id": Key("text", 128)},
}
PATH_VALUES = {"chat_id": CHAT, "company_id": COMPANY}

NOT_A_NUMBER: tuple[object, ...] = (True, False, None, "7", 7.5, 1e300, [7], {"n": 7})
NOT_TEXT: tuple[object, ...] = (True, None, 7, 2**64 - 1, 1e300, ["x"], {"x": 1})


def hostile_values(key: Key) -> list[object]:
    """Values a client can put in a cursor's JSON that the key's query cannot take."""
    if key.kind == "integer":
        above = [key.maximum + 1, 2**63, 2**64 - 1] if key.maximum < 2**63 else [2**63]
        return [*above, 2**64 - 1, -1, -(2**63) - 1, *NOT_A_NUMBER]
    if key.kind == "instant":
        return [
            "0000-01-01T00:00:00+00:00",  # year 0
            "10000-01-01T00:00:00+00:00",  # year 10000
            "0001-01-01T00:00:00+05:00",  # before year 1 in UTC
            "9999-12-31T23:59:59-05:00",  # after year 9999 in UTC
            "2026-06-17T12:00:00",  # no offset
            "2026-02-30T00:00:00+00:00",
            "2026-06-17T12:00:00+00:00\x00",
            "",
            *NOT_TEXT,
            10**20,  # a huge epoch, as a number
            "99999999999999999999",  # and as text
        ]
    if key.kind == "text":
        return ["", "x" * (key.maximum + 1), "acme\x00", *NOT_TEXT]
    return [
        "not-a-uuid",
        "",
        f"{VALID_UUID}\x00",
        VALID_UUID[:-1],
        f"{{{VALID_UUID}}}",  # a form UUID() reads, not the one the service writes
        *NOT_TEXT,
    ]


def valid_value(key: Key) -> object:
    return {"integer": 1, "instant": VALID_INSTANT, "uuid": VALID_UUID, "text": "a"}[key.kind]


def cursor_of(position: Mapping[str, object]) -> str:
    """A cursor as the service writes one (base64url JSON, unpadded): only its values lie.
    (`json`, not orjson: it writes integers past 64 bits too.)"""
    text = json.dumps(position, separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def query_names(dependant: Dependant) -> set[str]:
    """The query parameters of a route's dependency tree (by the name a client sends)."""
    names = {param.alias for param in dependant.query_params}
    for sub in dependant.dependencies:
        names |= query_names(sub)
    return names


def paginated_routes(app: FastAPI) -> set[tuple[str, str]]:
    """Every (method, path) of the app whose route takes a `cursor` query parameter."""
    found: set[tuple[str, str]] = set()
    for context in iter_route_contexts(app.routes):
        route = context.original_route
        if isinstance(route, APIRoute) and "cursor" in query_names(route.dependant):
            found.update(
                (method, str(context.path)) for method in (route.methods or set()) - {"HEAD"}
            )
    return found


def headers_for(auth: AuthFactory, method: str, path: str) -> dict[str, str]:
    """A caller the route's declared policy admits on the company and user seeded here."""
    policy = ROUTE_POLICIES[(method, path)]
    if policy in {"operator", "company_read", "company_operator"}:
        return auth("olga", "platform", OPERATOR)
    if policy == "user":
        return auth(USER, COMPANY)
    raise AssertionError(f"{method} {path}: no caller for policy {policy!r}")


def concrete(path: str) -> str:
    for name, value in PATH_VALUES.items():
        path = path.replace(f"{{{name}}}", value)
    assert "{" not in path, f"{path}: a path parameter without a value in PATH_VALUES"
    return path


async def seed(client: httpx.AsyncClient, auth: AuthFactory) -> None:
    """What the routes need to reach their query: a company with memory on (an audit event),
    alice's profile and a chat of hers (and the job its turn queued)."""
    await enable_company(client, auth)
    created = await client.put(
        "/v1/me/memory",
        json={"content": memory_md({Section.WORK: ["Writes the IFRS 9 report."]})},
        headers={**auth(USER, COMPANY), "If-None-Match": "*"},
    )
    assert created.status_code == 201, created.text
    await save_turn(client, auth, CHAT, [user("I moved to Lyon.")], "Noted.")


def test_every_paginated_route_has_its_cursor_keys_declared(app: FastAPI) -> None:
    routes = paginated_routes(app)
    assert len(routes) >= len(CURSOR_KEYS)  # the search itself still finds them
    undeclared = sorted(path for _, path in routes if path not in CURSOR_KEYS)
    assert not undeclared, f"paginated routes without a row in CURSOR_KEYS: {undeclared}"
    stale = sorted(CURSOR_KEYS.keys() - {path for _, path in routes})
    assert not stale, f"CURSOR_KEYS rows of routes that take no cursor: {stale}"


async def test_a_tampered_cursor_is_a_422_naming_the_cursor_on_every_paginated_route(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await seed(client, auth)
    failures: list[str] = []
    tried = 0
    for method, path in sorted(paginated_routes(app)):
        keys = CURSOR_KEYS[path]
        url, headers = concrete(path), headers_for(auth, method, path)
        valid = {name: valid_value(key) for name, key in keys.items()}
        answer = await client.request(
            method, url, params={"cursor": cursor_of(valid)}, headers=headers
        )
        if answer.status_code != 200:
            failures.append(f"{method} {path} valid {valid}: {answer.status_code} {answer.text}")
            continue
        for name, key in keys.items():
            for value in hostile_values(key):
                position = {**valid, name: value}
                params = {"cursor": cursor_of(position)}
                answer = await client.request(method, url, params=params, headers=headers)
                tried += 1
                fields = [e.get("field") for e in answer.json().get("errors", [])]
                if answer.status_code != 422 or fields != ["query.cursor"]:
                    failures.append(f"{method} {path} {position!r}: {answer.status_code} {fields}")
                elif answer.headers["content-type"] != "application/problem+json":
                    failures.append(f"{method} {path} {position!r}: not problem+json")
    assert not failures, "\n".join(failures)
    assert tried >= 5 * 10


@pytest.mark.parametrize(
    "cursor",
    [
        "e30",  # {}
        cursor_of({"version": 1, "id": 1})[:-2],  # cut short
        base64.urlsafe_b64encode(b'{"id": 1} trailing').decode(),
        base64.urlsafe_b64encode(b'{"id": 18446744073709551616}').decode(),  # past 64 bits
        base64.urlsafe_b64encode(b"[1]").decode(),
        base64.urlsafe_b64encode(b'"id"').decode(),
        "!!!!",
        "x" * 513,
    ],
)
async def test_a_cursor_that_is_not_one_of_ours_is_a_422_on_every_paginated_route(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, cursor: str
) -> None:
    await seed(client, auth)
    for method, path in sorted(paginated_routes(app)):
        headers = headers_for(auth, method, path)
        answer = await client.request(
            method, concrete(path), params={"cursor": cursor}, headers=headers
        )
        assert answer.status_code == 422, (method, path, answer.text)
        assert "query.cursor" in [e["field"] for e in answer.json()["errors"]], (method, path)
