"""A company's spaces for its operators: listed a page at a time as its space admins see them,
read and set by the company's operators (and platform operators) with the space admin's rules,
audited naming the operator; another company's operator gets 404."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tests.helpers.apps import OPERATOR, SPACE_ADMIN, AuthFactory
from tests.helpers.settings import enable_company
from tests.helpers.sweep import every_count as scalar
from tests.helpers.sweep import every_row as rows

CORA = ("cora", "acme", ("company_operator",))


async def test_a_company_operator_lists_the_spaces_its_space_admins_configured(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(client, auth)
    admin = auth("sam", "acme", SPACE_ADMIN)
    for space, budget in (("space-a", 1000), ("space-b", 2500), ("space-c", 3000)):
        body = {"user_memory": {"max_tokens": budget}}
        response = await client.patch(f"/v1/spaces/{space}", json=body, headers=admin)
        assert response.status_code == 200, response.text
    seen: list[Any] = []
    cursor = None
    while True:
        params = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = await client.get("/v1/companies/acme/spaces", params=params, headers=auth(*CORA))
        assert page.status_code == 200, page.text
        seen += page.json()["items"]
        cursor = page.json()["next_cursor"]
        if cursor is None:
            break

    assert [(s["space_id"], s["user_memory"]["max_tokens"]) for s in seen] == [
        ("space-a", 1000),
        ("space-b", 2500),
        ("space-c", 3000),
    ]
    as_admin = await client.get("/v1/spaces/space-b", headers=admin)
    assert seen[1] == as_admin.json()
    other = await client.get(
        "/v1/companies/acme/spaces", headers=auth("otto", "globex", ("company_operator",))
    )
    assert other.status_code == 404


async def test_a_company_operator_sets_a_space_audited_as_the_space_admins_changes_are(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(client, auth)
    path = "/v1/companies/acme/spaces/space-1/settings"

    response = await client.put(path, json={"context_memory": False}, headers=auth(*CORA))

    assert response.status_code == 200, response.text
    assert response.json()["context_memory"] is False
    assert (response.json()["updated_by_company_id"], response.json()["updated_by"]) == (
        "acme",
        "cora",
    )
    read = await client.get(path, headers=auth("olga", "platform", OPERATOR))
    assert read.json() == response.json()
    assert (
        read.json()
        == (await client.get("/v1/spaces/space-1", headers=auth("sam", "acme", SPACE_ADMIN))).json()
    )
    (event,) = await rows(
        app,
        "SELECT actor_company_id, actor_id, action, target_id, old, new FROM audit_events"
        " WHERE action = 'space_settings.update'",
    )
    assert (event.actor_company_id, event.actor_id, event.target_id) == ("acme", "cora", "space-1")
    assert (event.old, event.new) == ({"context_memory": None}, {"context_memory": False})


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"user_memory": {"max_tokens": 100}}, "body.user_memory.max_tokens"),
        ({"web_search": "yes"}, "body.web_search"),
        ({"context_memory": True, "secret": 1}, "body.secret"),
    ],
)
async def test_a_hostile_space_setting_is_a_422_and_changes_nothing(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, body: dict[str, Any], field: str
) -> None:
    await enable_company(client, auth)
    response = await client.put(
        "/v1/companies/acme/spaces/space-1/settings", json=body, headers=auth(*CORA)
    )

    assert response.status_code == 422, response.text
    assert field in [error["field"] for error in response.json()["errors"]]
    assert await scalar(app, "SELECT count(*) FROM space_settings") == 0


async def test_bad_space_ids_and_other_companies_are_refused(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(client, auth)
    for space, status in (("a b", 422), ("s" * 129, 422), ("space-1", 200)):
        response = await client.get(
            f"/v1/companies/acme/spaces/{space}/settings", headers=auth(*CORA)
        )
        assert response.status_code == status, (space, response.text)
    foreign = auth("otto", "globex", ("company_operator",))
    for method in ("GET", "PUT"):
        response = await client.request(
            method,
            "/v1/companies/acme/spaces/space-1/settings",
            json={"context_memory": False} if method == "PUT" else None,
            headers=foreign,
        )
        assert response.status_code == 404
    assert await scalar(app, "SELECT count(*) FROM space_settings") == 0
