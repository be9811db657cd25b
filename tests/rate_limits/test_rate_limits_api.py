"""Rate limits over HTTP: the 429 with `Retry-After`, the `RateLimit-Policy` / `RateLimit`
fields on every answer of a limited route, each route class, nothing written by a refused
request, and the operators' audited per-company overrides."""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.rate_limits.service import refresh_overrides
from tests.helpers.apps import OPERATOR, AuthFactory, app_with, client_of, client_with
from tests.helpers.db import admin_session
from tests.helpers.settings import enable_company, register_company
from tests.helpers.turns import new_chat, turn_body, user

PROBLEM = "application/problem+json"
PLATFORM_OPERATOR = ("olga", "platform", OPERATOR)
RATE_LIMIT_FIELD = re.compile(
    r'^"[a-z_]+-(user|company)";r=\d+;t=\d+(, "[a-z_]+-(user|company)";r=\d+;t=\d+)*$'
)


@pytest.fixture(autouse=True)
async def _registered_companies(client: httpx.AsyncClient, auth: AuthFactory) -> None:
    """The companies these tests' operators write to are registered (`POST /v1/companies`)."""
    for company in ("acme", "globex"):
        await register_company(client, auth, company)


async def save(
    client: httpx.AsyncClient, auth: AuthFactory, sub: str = "alice", company: str = "acme"
) -> httpx.Response:
    body = turn_body([user("I like tea.")], "Noted.")
    return await client.post(f"/v1/chats/{new_chat()}/turns", json=body, headers=auth(sub, company))


async def stored_turns(engine: AsyncEngine, user_id: str) -> int:
    async with admin_session(engine) as session:
        count = await session.scalar(
            text("SELECT count(*) FROM turns WHERE user_id = :u"), {"u": user_id}
        )
    return int(count or 0)


async def test_a_user_over_the_turn_limit_gets_429_and_nothing_is_written(
    database_url: str, auth: AuthFactory, engine: AsyncEngine
) -> None:
    async with client_with(database_url, rate_limit_turns_user="3/60") as client:
        answers = [await save(client, auth) for _ in range(5)]
    assert [a.status_code for a in answers] == [201, 201, 201, 429, 429]
    refused = answers[3]
    assert refused.headers["content-type"] == PROBLEM
    problem = refused.json()
    assert problem["type"] == "urn:context-memory:problem:rate-limited"
    assert problem["status"] == 429
    assert "turns-user" in problem["detail"]
    assert refused.headers["retry-after"] == "20"  # one request per 60/3 s
    assert await stored_turns(engine, "alice") == 3
    for answer in answers:  # on every answer, the 2xx and the 429 alike
        assert (
            answer.headers["ratelimit-policy"]
            == '"turns-user";q=3;w=60, "turns-company";q=3000;w=60'
        )
        assert RATE_LIMIT_FIELD.match(answer.headers["ratelimit"]), answer.headers["ratelimit"]
    assert answers[0].headers["ratelimit"].startswith('"turns-user";r=2;t=20')
    assert refused.headers["ratelimit"].startswith('"turns-user";r=0;')


async def test_the_limit_is_per_user_and_per_company(database_url: str, auth: AuthFactory) -> None:
    async with client_with(
        database_url, rate_limit_turns_user="2/60", rate_limit_turns_company="3/60"
    ) as client:
        statuses = [(await save(client, auth, "alice")).status_code for _ in range(3)]
        assert statuses == [201, 201, 429]
        assert (await save(client, auth, "bob")).status_code == 201  # alice's refusal took none
        refused = await save(client, auth, "carol")
        assert refused.status_code == 429
        assert "turns-company" in refused.json()["detail"]
        assert (await save(client, auth, "alice", "globex")).status_code == 201


async def test_a_refused_request_is_refused_before_its_body_is_read(
    database_url: str, auth: AuthFactory
) -> None:
    async with client_with(database_url, rate_limit_context_user="1/60") as client:
        url = f"/v1/chats/{new_chat()}/context"
        first = await client.post(url, json={"no": "such body"}, headers=auth())
        second = await client.post(url, json={"no": "such body"}, headers=auth())
        unauthenticated = await client.post(url, json={})
    assert first.status_code == 422  # counted, and its answer carries the state
    assert first.headers["ratelimit"].startswith('"context-user";r=0;')
    assert second.status_code == 429
    assert unauthenticated.status_code == 401
    assert "ratelimit" not in unauthenticated.headers


Call = Callable[[httpx.AsyncClient, AuthFactory], Awaitable[httpx.Response]]


async def _consolidate(client: httpx.AsyncClient, auth: AuthFactory) -> httpx.Response:
    body = {"space_id": "space-1", "messages": [user("I like tea.")]}
    return await client.post("/v1/me/memory/consolidations", json=body, headers=auth())


async def _put_memory(client: httpx.AsyncClient, auth: AuthFactory) -> httpx.Response:
    body = {"content": "# About me\n- I like tea.\n"}
    return await client.put("/v1/me/memory", json=body, headers=auth() | {"If-None-Match": "*"})


async def _clear_memory(client: httpx.AsyncClient, auth: AuthFactory) -> httpx.Response:
    return await client.delete("/v1/me/memory", headers=auth())


async def _export(client: httpx.AsyncClient, auth: AuthFactory) -> httpx.Response:
    return await client.get("/v1/me/memory/export", headers=auth())


async def _company_export(client: httpx.AsyncClient, auth: AuthFactory) -> httpx.Response:
    return await client.get("/v1/companies/acme/export", headers=auth(*PLATFORM_OPERATOR))


@pytest.mark.parametrize(
    ("setting", "policy", "call"),
    [
        ("rate_limit_consolidations_user", "consolidations-user", _consolidate),
        ("rate_limit_memory_writes_user", "memory_writes-user", _put_memory),
        ("rate_limit_memory_writes_user", "memory_writes-user", _clear_memory),
        ("rate_limit_exports_user", "exports-user", _export),
        ("rate_limit_exports_user", "exports-user", _company_export),
    ],
)
async def test_every_route_class_is_limited(
    database_url: str, auth: AuthFactory, setting: str, policy: str, call: Call
) -> None:
    async with client_with(database_url, **{setting: "2/3600"}) as client:
        await enable_company(client, auth)
        answers = [await call(client, auth) for _ in range(3)]
    assert [a.status_code == 429 for a in answers] == [False, False, True], [
        (a.status_code, a.text[:200]) for a in answers
    ]
    assert answers[2].headers["retry-after"] == "1800"
    for answer in answers:
        assert answer.headers["ratelimit-policy"].startswith(f'"{policy}";q=2;w=3600')


async def test_limits_set_to_off_send_no_fields(database_url: str, auth: AuthFactory) -> None:
    async with client_with(
        database_url, rate_limit_turns_user="off", rate_limit_turns_company="0"
    ) as client:
        answers = [await save(client, auth) for _ in range(5)]
    assert {a.status_code for a in answers} == {201}
    assert all("ratelimit" not in a.headers for a in answers)


async def test_each_process_enforces_its_share_of_the_limit(
    database_url: str, auth: AuthFactory
) -> None:
    async with client_with(
        database_url, rate_limit_turns_user="10/60", rate_limit_replicas=2, api_workers=2
    ) as client:
        statuses = [(await save(client, auth)).status_code for _ in range(4)]
        view = await client.get("/v1/companies/acme/rate-limits", headers=auth(*PLATFORM_OPERATOR))
    assert statuses == [201, 201, 429, 429]  # 10 // (2 replicas x 2 processes)
    assert view.json()["processes"] == 4
    assert view.json()["turns"]["user"]["limit"] == {"quota": 10, "window_seconds": 60}


# --- the operators' overrides ------------------------------------------------------------------


async def get_limits(
    client: httpx.AsyncClient, auth: AuthFactory, company: str = "acme"
) -> dict[str, Any]:
    response = await client.get(
        f"/v1/companies/{company}/rate-limits", headers=auth(*PLATFORM_OPERATOR)
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def put_limits(
    client: httpx.AsyncClient, auth: AuthFactory, body: Any, company: str = "acme"
) -> httpx.Response:
    return await client.put(
        f"/v1/companies/{company}/rate-limits", json=body, headers=auth(*PLATFORM_OPERATOR)
    )


async def test_a_company_without_overrides_reads_as_the_defaults(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    body = await get_limits(client, auth)
    assert body["default"] is True
    assert body["processes"] == 1
    assert body["updated_by"] is None
    assert body["updated_at"] is None
    assert body["turns"] == {
        "user": {"limit": {"quota": 120, "window_seconds": 60}, "overridden": False},
        "company": {"limit": {"quota": 3000, "window_seconds": 60}, "overridden": False},
    }
    assert set(body) >= {"context", "turns", "consolidations", "exports", "memory_writes"}


async def test_an_override_applies_at_once_and_is_audited(
    database_url: str, auth: AuthFactory
) -> None:
    async with client_with(database_url, rate_limit_turns_user="1/60") as client:
        assert (await save(client, auth)).status_code == 201
        assert (await save(client, auth)).status_code == 429
        response = await put_limits(
            client,
            auth,
            {"turns": {"user": {"quota": 100, "window_seconds": 10}, "company": "unlimited"}},
        )
        assert response.status_code == 200, response.text
        saved = response.json()
        assert saved["turns"] == {
            "user": {"limit": {"quota": 100, "window_seconds": 10}, "overridden": True},
            "company": {"limit": None, "overridden": True},
        }
        assert (saved["updated_by_company_id"], saved["updated_by"]) == ("platform", "olga")
        again = await save(client, auth)
        assert again.status_code == 201
        assert again.headers["ratelimit-policy"] == '"turns-user";q=100;w=10'
        assert (await save(client, auth, "bob", "globex")).status_code == 201  # still 1/60
        assert (await save(client, auth, "bob", "globex")).status_code == 429
        events = await client.get(
            "/v1/companies/acme/audit-events", headers=auth(*PLATFORM_OPERATOR)
        )
        [event] = [e for e in events.json()["items"] if e["action"] == "rate_limits.set"]
        assert (event["target_kind"], event["target_id"]) == ("rate_limits", "acme")
        assert event["old"] == {"turns": {"user": "default", "company": "default"}}
        assert event["new"] == {"turns": {"user": "100/10", "company": "off"}}
        # the same set again changes nothing and records nothing; {} is back to the defaults
        assert (
            await put_limits(
                client,
                auth,
                saved_body := {
                    "turns": {"user": {"quota": 100, "window_seconds": 10}, "company": "unlimited"}
                },
            )
        ).status_code == 200
        assert saved_body
        reset = await put_limits(client, auth, {})
        assert reset.status_code == 200
        assert reset.json()["turns"]["user"]["overridden"] is False
        events = await client.get(
            "/v1/companies/acme/audit-events", headers=auth(*PLATFORM_OPERATOR)
        )
        assert [e["action"] for e in events.json()["items"]].count("rate_limits.set") == 2
        # 1/60 again: what 100/10 counted has refilled by now, so one passes, then none
        assert (await save(client, auth)).status_code == 201
        assert (await save(client, auth)).status_code == 429


async def test_other_processes_take_an_override_at_their_next_refresh(
    database_url: str, auth: AuthFactory
) -> None:
    async with (
        app_with(database_url, rate_limit_turns_user="1/60") as first,
        app_with(database_url, rate_limit_turns_user="1/60") as second,
        client_of(first) as one,
        client_of(second) as other,
    ):
        body = {"turns": {"user": {"quota": 50, "window_seconds": 60}}}
        assert (await put_limits(one, auth, body)).status_code == 200
        assert (await save(other, auth)).status_code == 201
        assert (await save(other, auth)).status_code == 429  # not read yet
        await refresh_overrides(second.state.database.engine, second.state.rate_limiter)
        assert (await save(other, auth)).status_code == 201


HOSTILE_BODIES: list[tuple[Any, str]] = [
    ([], "body"),
    ({"turns": {"user": {"quota": 0, "window_seconds": 60}}}, "body.turns.user"),
    ({"turns": {"user": {"quota": 10, "window_seconds": 86_401}}}, "body.turns.user"),
    ({"turns": {"user": {"quota": "10", "window_seconds": 60}}}, "body.turns.user"),
    ({"turns": {"user": {"quota": True, "window_seconds": 60}}}, "body.turns.user"),
    ({"turns": {"user": {"quota": -5, "window_seconds": 60}}}, "body.turns.user"),
    ({"turns": {"user": {"quota": 10**12, "window_seconds": 60}}}, "body.turns.user"),
    ({"turns": {"user": {"quota": 10}}}, "body.turns.user"),
    ({"turns": {"user": "120/60"}}, "body.turns.user"),
    ({"turns": {"user": "Unlimited"}}, "body.turns.user"),
    ({"turns": {"admin": "unlimited"}}, "body.turns.admin"),
    ({"everything": {"user": "unlimited"}}, "body.everything"),
    ({"turns": {"user": {"quota": 10, "window_seconds": 60, "burst": 5}}}, "body.turns.user"),
    ({"turns": "unlimited"}, "body.turns"),
]


@pytest.mark.parametrize(("body", "field"), HOSTILE_BODIES)
async def test_a_malformed_override_is_refused_and_nothing_is_saved(
    client: httpx.AsyncClient, auth: AuthFactory, body: Any, field: str
) -> None:
    response = await put_limits(client, auth, body)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == PROBLEM
    fields = [error["field"] for error in response.json()["errors"]]
    assert any(f.startswith(field) for f in fields), fields
    assert (await get_limits(client, auth))["default"] is True


async def test_overrides_belong_to_one_company(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    body = {"exports": {"company": {"quota": 1, "window_seconds": 60}}}
    assert (await put_limits(client, auth, body, "globex")).status_code == 200
    assert (await get_limits(client, auth, "acme"))["exports"]["company"]["overridden"] is False
    assert (await get_limits(client, auth, "globex"))["exports"]["company"]["overridden"] is True
    plain = await client.put("/v1/companies/acme/rate-limits", json={}, headers=auth("alice"))
    assert plain.status_code == 403


async def test_a_refused_request_is_answered_after_the_pause_and_its_wait_shortened(
    database_url: str, auth: AuthFactory
) -> None:
    async with client_with(
        database_url, rate_limit_turns_user="1/4", rate_limit_refusal_delay_seconds=1.5
    ) as client:
        assert (await save(client, auth)).status_code == 201
        started = time.monotonic()
        refused = await save(client, auth)
        paused = time.monotonic() - started
    assert refused.status_code == 429
    assert paused >= 1.5
    assert refused.headers["retry-after"] == "3"  # 4 s for a token, 1.5 of them waited here
