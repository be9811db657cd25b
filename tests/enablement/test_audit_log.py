"""The audit log: every settings change is recorded with who (company and user id) and old ->
new (changed fields only), nothing for no-op changes, never memory content; operators page
through it."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI

from app.enablement.decision import FLAG_CONTEXT_MEMORY
from tests.helpers.apps import OPERATOR, SPACE_ADMIN, AuthFactory
from tests.helpers.memory import seed_memory
from tests.helpers.settings import patch_space, register_company, set_flag


async def events(
    client: httpx.AsyncClient, auth: AuthFactory, company: str = "acme", **params: Any
) -> dict[str, Any]:
    response = await client.get(
        f"/v1/companies/{company}/audit-events",
        params=params,
        headers=auth("olga", "platform", OPERATOR),
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def summary(body: dict[str, Any]) -> list[tuple[str, str, str, Any, Any]]:
    return [(e["action"], e["actor_id"], e["target_id"], e["old"], e["new"]) for e in body["items"]]


async def test_a_flag_change_is_recorded_once(client: httpx.AsyncClient, auth: AuthFactory) -> None:
    await set_flag(client, auth, FLAG_CONTEXT_MEMORY, False)  # absent already reads as off
    await set_flag(client, auth, FLAG_CONTEXT_MEMORY, True)
    await set_flag(client, auth, FLAG_CONTEXT_MEMORY, True)  # no change

    body = await events(client, auth)

    assert summary(body) == [
        ("feature_flag.set", "olga", FLAG_CONTEXT_MEMORY, {"enabled": False}, {"enabled": True})
    ]
    event = body["items"][0]
    assert event["actor_company_id"] == "platform"
    assert event["target_kind"] == "feature_flag"
    assert event["occurred_at"]
    assert body["next_cursor"] is None


async def test_an_operator_changing_another_companys_flag_is_recorded_with_their_own_company(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await register_company(client, auth, "other")
    response = await client.put(
        f"/v1/companies/other/feature-flags/{FLAG_CONTEXT_MEMORY}",
        json={"enabled": True},
        headers=auth("alice", "acme", OPERATOR),
    )
    assert response.status_code == 200, response.text

    (event,) = (await events(client, auth, "other"))["items"]
    assert (event["actor_company_id"], event["actor_id"]) == ("acme", "alice")
    assert (event["action"], event["target_id"]) == ("feature_flag.set", FLAG_CONTEXT_MEMORY)
    assert (response.json()["updated_by_company_id"], response.json()["updated_by"]) == (
        "acme",
        "alice",
    )
    assert (await events(client, auth, "acme"))["items"] == []


async def test_a_space_change_records_only_the_changed_fields(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await patch_space(client, auth, "space-1", {"web_search": True})
    await patch_space(
        client,
        auth,
        "space-1",
        {"web_search": True, "context_memory": False, "user_memory": {"max_tokens": 2500}},
    )
    await patch_space(client, auth, "space-1", {"user_memory": {"max_tokens": 2500}})  # no-op
    await patch_space(client, auth, "space-1", {})  # no-op

    assert summary(await events(client, auth)) == [
        (
            "space_settings.update",
            "sam",
            "space-1",
            {"context_memory": None, "user_memory": {"max_tokens": 2000}},
            {"context_memory": False, "user_memory": {"max_tokens": 2500}},
        ),
        (
            "space_settings.update",
            "sam",
            "space-1",
            {"web_search": False},
            {"web_search": True},
        ),
    ]


async def test_a_refused_change_records_nothing(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await patch_space(client, auth, "space-1", {"user_memory": {"max_tokens": 9000}})
    await patch_space(client, auth, "space-1", {"context_memory": True, "web_search": True})
    assert (await events(client, auth))["items"] == []


async def test_an_opt_out_records_the_setting_and_the_counts_never_the_content(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    await seed_memory(app, "alice", content="# User Memory\n- secret project falcon\n")
    headers = auth("alice", "acme")

    await client.patch("/v1/me/settings", json={"context_memory": False}, headers=headers)
    await client.patch("/v1/me/settings", json={"context_memory": False}, headers=headers)
    await client.patch("/v1/me/settings", json={"context_memory": True}, headers=headers)
    await client.patch("/v1/me/settings", json={"context_memory": True}, headers=headers)

    body = await events(client, auth)
    assert summary(body) == [
        (
            "user_settings.update",
            "alice",
            "alice",
            {"context_memory": False},
            {"context_memory": True},
        ),
        (
            "user_memory.deleted",
            "alice",
            "alice",
            None,
            {"profile": True, "versions": 3, "jobs": 3, "folder": True},
        ),
        (
            "user_settings.update",
            "alice",
            "alice",
            {"context_memory": True},
            {"context_memory": False},
        ),
    ]
    assert {e["target_kind"] for e in body["items"]} == {"user"}
    assert {e["actor_company_id"] for e in body["items"]} == {"acme"}
    assert b"falcon" not in orjson.dumps(body)


async def test_events_belong_to_one_company(client: httpx.AsyncClient, auth: AuthFactory) -> None:
    await patch_space(client, auth, "space-1", {"web_search": True}, company="globex")
    await set_flag(client, auth, FLAG_CONTEXT_MEMORY, True, company="globex")

    assert (await events(client, auth, "acme"))["items"] == []
    assert len((await events(client, auth, "globex"))["items"]) == 2


async def test_events_are_paged_newest_first(client: httpx.AsyncClient, auth: AuthFactory) -> None:
    for tokens in range(1001, 1006):
        await patch_space(client, auth, "space-1", {"user_memory": {"max_tokens": tokens}})

    seen: list[int] = []
    pages = 0
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        body = await events(client, auth, **params)
        pages += 1
        seen.extend(e["new"]["user_memory"]["max_tokens"] for e in body["items"])
        cursor = body["next_cursor"]
        if cursor is None:
            break

    assert pages == 3
    assert seen == [1005, 1004, 1003, 1002, 1001]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"cursor": "not-a-cursor"}, "query.cursor"),
        ({"cursor": "eyJpZCI6ICJ4In0"}, "query.cursor"),  # {"id": "x"}
        ({"limit": 0}, "query.limit"),
        ({"limit": 101}, "query.limit"),
    ],
)
async def test_bad_paging_parameters_are_422(
    client: httpx.AsyncClient, auth: AuthFactory, params: dict[str, Any], field: str
) -> None:
    response = await client.get(
        "/v1/companies/acme/audit-events",
        params=params,
        headers=auth("olga", "platform", OPERATOR),
    )
    assert response.status_code == 422
    assert [e["field"] for e in response.json()["errors"]] == [field]


@pytest.mark.parametrize("roles", [(), SPACE_ADMIN])
async def test_only_operators_read_the_audit_log(
    client: httpx.AsyncClient, auth: AuthFactory, roles: tuple[str, ...]
) -> None:
    response = await client.get(
        "/v1/companies/acme/audit-events", headers=auth("sam", "acme", roles)
    )
    assert response.status_code == 403
