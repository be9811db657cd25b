"""Company feature flags over HTTP: operators only, known flags only, off until set."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from app.enablement.decision import FLAG_ALLOW_WITH_WEB_SEARCH, FLAG_CONTEXT_MEMORY
from tests.helpers.apps import OPERATOR, SPACE_ADMIN, AuthFactory
from tests.helpers.settings import register_company, set_flag


@pytest.fixture(autouse=True)
async def _registered_companies(client: httpx.AsyncClient, auth: AuthFactory) -> None:
    """The companies these tests' operators write to are registered (`POST /v1/companies`)."""
    for company in ("acme", "globex"):
        await register_company(client, auth, company)


async def get_flags(
    client: httpx.AsyncClient, auth: AuthFactory, company: str = "acme"
) -> dict[str, Any]:
    response = await client.get(
        f"/v1/companies/{company}/feature-flags", headers=auth("olga", "platform", OPERATOR)
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_every_known_flag_is_listed_and_off_until_set(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    body = await get_flags(client, auth)

    never_set = {
        "enabled": False,
        "updated_at": None,
        "updated_by_company_id": None,
        "updated_by": None,
    }
    assert body == {
        "company_id": "acme",
        "flags": [
            {"flag": FLAG_CONTEXT_MEMORY, **never_set},
            {"flag": FLAG_ALLOW_WITH_WEB_SEARCH, **never_set},
        ],
    }


async def test_an_operator_of_any_company_sets_a_flag(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    response = await client.put(
        f"/v1/companies/acme/feature-flags/{FLAG_CONTEXT_MEMORY}",
        json={"enabled": True},
        headers=auth("olga", "platform", OPERATOR),
    )

    assert response.status_code == 200
    saved = response.json()
    assert saved["flag"] == FLAG_CONTEXT_MEMORY
    assert saved["enabled"] is True
    assert (saved["updated_by_company_id"], saved["updated_by"]) == ("platform", "olga")
    assert saved["updated_at"] is not None
    listed = {f["flag"]: f for f in (await get_flags(client, auth))["flags"]}
    assert listed[FLAG_CONTEXT_MEMORY] == saved
    assert listed[FLAG_ALLOW_WITH_WEB_SEARCH]["enabled"] is False


async def test_flags_belong_to_one_company(client: httpx.AsyncClient, auth: AuthFactory) -> None:
    await set_flag(client, auth, FLAG_CONTEXT_MEMORY, True, "acme")

    globex = await get_flags(client, auth, "globex")
    assert all(flag["enabled"] is False for flag in globex["flags"])


async def test_a_flag_can_be_turned_off_again(client: httpx.AsyncClient, auth: AuthFactory) -> None:
    await set_flag(client, auth, FLAG_CONTEXT_MEMORY, True)
    await set_flag(client, auth, FLAG_CONTEXT_MEMORY, False)

    listed = {f["flag"]: f for f in (await get_flags(client, auth))["flags"]}
    assert listed[FLAG_CONTEXT_MEMORY]["enabled"] is False
    assert listed[FLAG_CONTEXT_MEMORY]["updated_by"] == "olga"


async def test_an_unknown_flag_is_422_naming_the_known_ones(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    response = await client.put(
        "/v1/companies/acme/feature-flags/FEATURE_FLAG_ENABLE_CONTEXT_MEMORY",
        json={"enabled": True},
        headers=auth("olga", "platform", OPERATOR),
    )

    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["errors"][0]["field"] == "path.flag"
    assert FLAG_CONTEXT_MEMORY in problem["detail"]
    assert FLAG_ALLOW_WITH_WEB_SEARCH in problem["detail"]
    assert all(f["enabled"] is False for f in (await get_flags(client, auth))["flags"])


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "body.enabled"),
        ({"enabled": "true"}, "body.enabled"),
        ({"enabled": 1}, "body.enabled"),
        ({"enabled": None}, "body.enabled"),
        ({"enabled": True, "company_id": "globex"}, "body.company_id"),
    ],
)
async def test_invalid_bodies_are_422(
    client: httpx.AsyncClient, auth: AuthFactory, body: dict[str, Any], field: str
) -> None:
    response = await client.put(
        f"/v1/companies/acme/feature-flags/{FLAG_CONTEXT_MEMORY}",
        json=body,
        headers=auth("olga", "platform", OPERATOR),
    )
    assert response.status_code == 422
    assert field in [error["field"] for error in response.json()["errors"]]


async def test_a_company_id_longer_than_stored_ids_is_422(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    response = await client.put(
        f"/v1/companies/{'c' * 129}/feature-flags/{FLAG_CONTEXT_MEMORY}",
        json={"enabled": True},
        headers=auth("olga", "platform", OPERATOR),
    )
    assert response.status_code == 422


@pytest.mark.parametrize("roles", [(), SPACE_ADMIN])
async def test_only_operators_touch_flags(
    client: httpx.AsyncClient, auth: AuthFactory, roles: tuple[str, ...]
) -> None:
    headers = auth("sam", "acme", roles)
    path = f"/v1/companies/acme/feature-flags/{FLAG_CONTEXT_MEMORY}"

    assert (
        await client.get("/v1/companies/acme/feature-flags", headers=headers)
    ).status_code == 403
    response = await client.put(path, json={"enabled": True}, headers=headers)
    assert response.status_code == 403
    assert all(f["enabled"] is False for f in (await get_flags(client, auth))["flags"])
