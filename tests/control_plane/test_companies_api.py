"""Companies as records over HTTP: registered by a platform operator (or by their own operators'
first call), listed a page at a time with a summary each, read by their own operators; an
operator write to a company that is not registered is a 404 saying how to register it, and
writes nothing."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from app.enablement.decision import FLAG_CONTEXT_MEMORY
from app.profiles.document import Section
from tests.helpers.apps import OPERATOR, SPACE_ADMIN, AuthFactory
from tests.helpers.profiles import memory_md
from tests.helpers.settings import enable_company, register_company
from tests.helpers.sweep import every_count as scalar
from tests.helpers.turns import save_turn, user

PLATFORM = ("olga", "platform", OPERATOR)
COMPANY_OPERATOR = ("company_operator",)


async def test_a_platform_operator_registers_lists_and_reads_companies_with_their_summary(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    # ids of this test alone: the app's usage meter may hold other tests' counts of `acme`
    tag = uuid.uuid4().hex[:8]
    first_co, second_co, third_co = f"a-{tag}", f"b-{tag}", f"c-{tag}"
    operator = auth(*PLATFORM)
    created = await client.post(
        "/v1/companies", json={"company_id": third_co, "display_name": "Initech"}, headers=operator
    )
    assert created.status_code == 201, created.text
    assert created.json()["display_name"] == "Initech"
    assert created.json()["origin"] == "operator"
    await enable_company(client, auth, first_co)
    await register_company(client, auth, second_co)
    await save_turn(client, auth, "chat-1", [user("I work at Acme.")], "Noted.", company=first_co)
    response = await client.put(
        "/v1/me/memory",
        json={"content": memory_md({Section.IDENTITY: ["Works at Acme."]})},
        headers=auth("alice", first_co) | {"If-None-Match": "*"},
    )
    assert response.status_code == 201, response.text
    await app.state.usage_meter.flush()

    first = await client.get("/v1/companies", params={"limit": 2}, headers=operator)
    assert first.status_code == 200, first.text
    rest = await client.get(
        "/v1/companies",
        params={"limit": 2, "cursor": first.json()["next_cursor"]},
        headers=operator,
    )

    pages = [first.json(), rest.json()]
    ids = [item["company_id"] for page in pages for item in page["items"]]
    assert ids == [first_co, second_co, third_co]
    assert pages[1]["next_cursor"] is None
    summary: dict[str, Any] = pages[0]["items"][0]
    assert summary["users_with_memory"] == 1
    assert summary["last_activity"] == str(datetime.now(UTC).date())
    assert summary["usage_month"] == str(datetime.now(UTC).date().replace(day=1))
    assert summary["usage_this_month"]["turns_saved"] == 1
    assert pages[1]["items"][0]["users_with_memory"] == 0
    assert pages[1]["items"][0]["last_activity"] is None
    read = await client.get(f"/v1/companies/{first_co}", headers=operator)
    assert read.json() == summary


async def test_registering_again_answers_the_record_and_another_name_is_a_409(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    operator = auth(*PLATFORM)
    body = {"company_id": "initech", "display_name": "Initech"}
    first = await client.post("/v1/companies", json=body, headers=operator)
    again = await client.post("/v1/companies", json=body, headers=operator)
    by_id = await client.post("/v1/companies", json={"company_id": "initech"}, headers=operator)
    renamed = await client.post(
        "/v1/companies", json={**body, "display_name": "Initrode"}, headers=operator
    )

    assert (first.status_code, again.status_code, by_id.status_code) == (201, 200, 200)
    assert again.json() == by_id.json() == first.json()
    assert renamed.status_code == 409
    assert renamed.headers["content-type"] == "application/problem+json"
    assert "Initech" in renamed.json()["detail"]
    assert await scalar(app, "SELECT count(*) FROM platform_events") == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"company_id": "a b"}, "body.company_id"),
        ({"company_id": ""}, "body.company_id"),
        ({"company_id": "c" * 129}, "body.company_id"),
        ({"company_id": "acme\u0000"}, "body.company_id"),
        ({"company_id": 7}, "body.company_id"),
        ({}, "body.company_id"),
        ({"company_id": "acme", "display_name": "Acme\nInc"}, "body.display_name"),
        ({"company_id": "acme", "display_name": "A" * 201}, "body.display_name"),
        ({"company_id": "acme", "display_name": ""}, "body.display_name"),
        ({"company_id": "acme", "origin": "import"}, "body.origin"),
    ],
)
async def test_a_hostile_registration_is_a_422_naming_the_field_and_registers_nothing(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, body: dict[str, Any], field: str
) -> None:
    response = await client.post("/v1/companies", json=body, headers=auth(*PLATFORM))

    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert field in [error["field"] for error in response.json()["errors"]]
    assert await scalar(app, "SELECT count(*) FROM companies") == 0


async def test_an_operator_write_to_an_unknown_company_is_a_404_saying_how_to_register_it(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    operator = auth(*PLATFORM)
    writes = [
        ("PUT", f"/v1/companies/acmee/feature-flags/{FLAG_CONTEXT_MEMORY}", {"enabled": True}),
        ("PUT", "/v1/companies/acmee/model-budget", {"monthly_tokens": 5, "when_spent": "defer"}),
        ("PUT", "/v1/companies/acmee/rate-limits", {}),
        ("PUT", "/v1/companies/acmee/spaces/space-1/settings", {"web_search": True}),
        ("DELETE", "/v1/companies/acmee/users/bob", None),
    ]
    for method, path, body in writes:
        response = await client.request(method, path, json=body, headers=operator)
        assert response.status_code == 404, (path, response.text)
        assert response.headers["content-type"] == "application/problem+json"
        assert "create it with POST /v1/companies" in response.json()["detail"], path
    for table in ("companies", "company_feature_flags", "space_settings", "audit_events"):
        assert await scalar(app, f"SELECT count(*) FROM {table}") == 0, table  # noqa: S608
    assert (await client.get("/v1/companies/acmee", headers=operator)).status_code == 404


async def test_a_company_operator_reads_its_own_company_registered_by_that_first_call(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    own = await client.get("/v1/companies/acme", headers=auth("cora", "acme", COMPANY_OPERATOR))
    other = await client.get("/v1/companies/globex", headers=auth("cora", "acme", COMPANY_OPERATOR))

    assert own.status_code == 200, own.text
    assert (own.json()["company_id"], own.json()["origin"]) == ("acme", "first_use")
    assert other.status_code == 404
    assert "POST /v1/companies" not in other.text  # no hint, no oracle, for another company
    assert await scalar(app, "SELECT count(*) FROM companies") == 1
    for headers in (auth("cora", "acme", COMPANY_OPERATOR), auth("sam", "acme", SPACE_ADMIN)):
        listed = await client.get("/v1/companies", headers=headers)
        created = await client.post("/v1/companies", json={"company_id": "x"}, headers=headers)
        assert (listed.status_code, created.status_code) == (403, 403)


async def test_a_companys_users_are_served_before_it_is_registered_without_registering_it(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    saved = await save_turn(client, auth, "chat-1", [user("Hello.")], "Hi.", company="newco")

    assert saved.json()["consolidation"]["status"] == "skipped"  # memory off until an operator
    assert await scalar(app, "SELECT count(*) FROM turns WHERE company_id = 'newco'") == 1
    assert await scalar(app, "SELECT count(*) FROM companies") == 0


async def test_an_oversized_registration_is_a_413_and_registers_nothing(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    limit: int = app.state.settings.max_body_bytes
    body = {"company_id": "acme", "display_name": "A" * (limit + 1)}

    response = await client.post("/v1/companies", json=body, headers=auth(*PLATFORM))

    assert response.status_code == 413, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert await scalar(app, "SELECT count(*) FROM companies") == 0
