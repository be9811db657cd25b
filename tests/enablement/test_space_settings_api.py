"""Space settings over HTTP: defaults, partial updates, validation, the switch and its lock."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from app.enablement.decision import WEB_SEARCH_TOOLTIP
from tests.helpers.apps import SPACE_ADMIN, AuthFactory
from tests.helpers.db import scalar
from tests.helpers.memory import root_folders
from tests.helpers.settings import enable_company, patch_space

DEFAULT_USER_MEMORY = {
    "use_orchestrator_language_model": True,
    "language_model": "AZURE_GPT_4o_2024_1120",
    "max_tokens": 2000,
}


async def get_space(
    client: httpx.AsyncClient, auth: AuthFactory, space_id: str = "space-1", company: str = "acme"
) -> dict[str, Any]:
    response = await client.get(f"/v1/spaces/{space_id}", headers=auth("sam", company, SPACE_ADMIN))
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def blocking(body: dict[str, Any]) -> list[str]:
    return [c["key"] for c in body["decision"]["conditions"] if not c["satisfied"]]


# --- reading ------------------------------------------------------------------------------------


async def test_a_space_never_saved_reads_as_its_defaults(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    body = await get_space(client, auth)

    assert body["space_id"] == "space-1"
    assert body["context_memory"] is None
    assert body["context_memory_effective"] is True
    assert body["web_search"] is False
    assert body["user_memory"] == DEFAULT_USER_MEMORY
    assert body["updated_at"] is None
    assert body["updated_by_company_id"] is None
    assert body["updated_by"] is None
    assert [c["key"] for c in body["decision"]["conditions"]] == [
        "company_flag",
        "space_setting",
        "web_search",
    ]
    assert body["decision"]["enabled"] is False
    assert blocking(body) == ["company_flag"]


async def test_reading_a_space_does_not_save_it_or_create_folders(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    await enable_company(client, auth)
    await get_space(client, auth)

    assert await scalar(app, "SELECT count(*) FROM space_settings") == 0
    assert await root_folders(app) == 0


# --- the switch ---------------------------------------------------------------------------------


async def test_switch_is_hidden_without_the_company_flag(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    body = await get_space(client, auth)
    assert body["switch"] == {"visible": False, "editable": False, "tooltip": None}


async def test_switch_is_editable_with_the_flag_and_web_search_off(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(client, auth)
    body = await get_space(client, auth)

    assert body["switch"] == {"visible": True, "editable": True, "tooltip": None}
    assert body["decision"]["enabled"] is True
    assert "each user can still turn it off" in body["decision"]["reason"]


async def test_switch_is_shown_disabled_with_the_tooltip_while_web_search_is_on(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(client, auth)
    response = await patch_space(client, auth, "space-1", {"web_search": True})

    assert response.status_code == 200
    body = response.json()
    assert body["switch"] == {"visible": True, "editable": False, "tooltip": WEB_SEARCH_TOOLTIP}
    assert body["switch"]["tooltip"] == (
        "Context memory is unavailable while web search is enabled, "
        "to keep user data out of external search queries."
    )
    assert blocking(body) == ["web_search"]
    assert body == await get_space(client, auth)


async def test_the_override_flag_makes_the_switch_editable_next_to_web_search(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(client, auth, allow_with_web_search=True)
    response = await patch_space(client, auth, "space-1", {"web_search": True})

    body = response.json()
    assert body["switch"] == {"visible": True, "editable": True, "tooltip": None}
    assert body["decision"]["enabled"] is True


# --- the lock, enforced -------------------------------------------------------------------------


async def test_enabling_memory_behind_web_search_is_refused_naming_the_field(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(client, auth)
    await patch_space(client, auth, "space-1", {"context_memory": False, "web_search": True})

    for body in ({"context_memory": True}, {"context_memory": None}):
        response = await patch_space(client, auth, "space-1", body)
        assert response.status_code == 422
        problem = response.json()
        assert problem["errors"][0]["field"] == "body.context_memory"
        assert WEB_SEARCH_TOOLTIP in problem["detail"]
    assert (await get_space(client, auth))["context_memory"] is False


async def test_memory_and_web_search_cannot_be_switched_on_together(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(client, auth)
    response = await patch_space(
        client, auth, "space-1", {"context_memory": True, "web_search": True}
    )
    assert response.status_code == 422
    assert (await get_space(client, auth))["updated_at"] is None  # nothing was saved


async def test_turning_web_search_off_and_memory_on_in_one_request_is_allowed(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(client, auth)
    await patch_space(client, auth, "space-1", {"context_memory": False, "web_search": True})

    response = await patch_space(
        client, auth, "space-1", {"context_memory": True, "web_search": False}
    )
    assert response.status_code == 200
    assert response.json()["decision"]["enabled"] is True


async def test_web_search_may_be_turned_on_while_memory_is_on_and_then_blocks_it(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(client, auth)
    await patch_space(client, auth, "space-1", {"context_memory": True})

    response = await patch_space(client, auth, "space-1", {"web_search": True})
    assert response.status_code == 200
    body = response.json()
    assert body["context_memory"] is True
    assert blocking(body) == ["web_search"]
    # Re-sending the unchanged memory value is not "enabling" it: a form may send every field.
    again = await patch_space(client, auth, "space-1", {"context_memory": True, "web_search": True})
    assert again.status_code == 200


async def test_memory_may_always_be_switched_off(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(client, auth)
    await patch_space(client, auth, "space-1", {"web_search": True})

    response = await patch_space(client, auth, "space-1", {"context_memory": False})
    assert response.status_code == 200
    assert response.json()["context_memory_effective"] is False


async def test_with_the_override_memory_and_web_search_may_be_on_together(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(client, auth, allow_with_web_search=True)
    response = await patch_space(
        client, auth, "space-1", {"context_memory": True, "web_search": True}
    )
    assert response.status_code == 200
    assert response.json()["decision"]["enabled"] is True


# --- partial updates and validation -------------------------------------------------------------


async def test_partial_nested_update_keeps_the_other_fields(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    response = await patch_space(client, auth, "space-1", {"user_memory": {"max_tokens": 3000}})
    assert response.status_code == 200
    body = response.json()
    assert body["user_memory"] == {**DEFAULT_USER_MEMORY, "max_tokens": 3000}
    assert body["context_memory"] is None
    assert (body["updated_by_company_id"], body["updated_by"]) == ("acme", "sam")
    assert body["updated_at"] is not None

    response = await patch_space(
        client,
        auth,
        "space-1",
        {"user_memory": {"use_orchestrator_language_model": False, "language_model": "gpt-4.1"}},
    )
    assert response.json()["user_memory"] == {
        "use_orchestrator_language_model": False,
        "language_model": "gpt-4.1",
        "max_tokens": 3000,
    }
    assert (await get_space(client, auth))["user_memory"]["max_tokens"] == 3000


async def test_null_context_memory_resets_to_the_absent_default(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await patch_space(client, auth, "space-1", {"context_memory": False})
    response = await patch_space(client, auth, "space-1", {"context_memory": None})

    body = response.json()
    assert body["context_memory"] is None
    assert body["context_memory_effective"] is True


@pytest.mark.parametrize("max_tokens", [500, 8000])
async def test_max_tokens_bounds_are_accepted(
    client: httpx.AsyncClient, auth: AuthFactory, max_tokens: int
) -> None:
    response = await patch_space(
        client, auth, "space-1", {"user_memory": {"max_tokens": max_tokens}}
    )
    assert response.status_code == 200
    assert response.json()["user_memory"]["max_tokens"] == max_tokens


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"user_memory": {"max_tokens": 499}}, "body.user_memory.max_tokens"),
        ({"user_memory": {"max_tokens": 8001}}, "body.user_memory.max_tokens"),
        ({"user_memory": {"max_tokens": "3000"}}, "body.user_memory.max_tokens"),
        ({"user_memory": {"max_tokens": 2000.5}}, "body.user_memory.max_tokens"),
        ({"user_memory": {"max_tokens": None}}, "body.user_memory.max_tokens"),
        ({"user_memory": {"language_model": ""}}, "body.user_memory.language_model"),
        ({"user_memory": {"language_model": "x" * 129}}, "body.user_memory.language_model"),
        ({"user_memory": {"language_model": "gpt\x00"}}, "body.user_memory.language_model"),
        ({"user_memory": {"language_model": "gpt\n4"}}, "body.user_memory.language_model"),
        ({"user_memory": {"language_model": " gpt"}}, "body.user_memory.language_model"),
        (
            {"user_memory": {"use_orchestrator_language_model": "no"}},
            "body.user_memory.use_orchestrator_language_model",
        ),
        ({"user_memory": None}, "body.user_memory"),
        ({"web_search": None}, "body.web_search"),
        ({"web_search": "true"}, "body.web_search"),
        ({"context_memory": 1}, "body.context_memory"),
        ({"user_id": "bob"}, "body.user_id"),
        ({"user_memory": {"temperature": 0.2}}, "body.user_memory.temperature"),
    ],
)
async def test_invalid_bodies_are_422_naming_the_field(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI, body: dict[str, Any], field: str
) -> None:
    response = await patch_space(client, auth, "space-1", body)

    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"
    assert field in [error["field"] for error in response.json()["errors"]]
    assert await scalar(app, "SELECT count(*) FROM space_settings") == 0


@pytest.mark.parametrize("space_id", ["a" * 129, "space 1", "späce", "space@1"])
async def test_space_ids_are_validated(
    client: httpx.AsyncClient, auth: AuthFactory, space_id: str
) -> None:
    response = await client.get(f"/v1/spaces/{space_id}", headers=auth("sam", "acme", SPACE_ADMIN))
    assert response.status_code == 422
    assert [e["field"] for e in response.json()["errors"]] == ["path.space_id"]


async def test_the_company_always_comes_from_the_token(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    await patch_space(client, auth, "space-1", {"web_search": True}, company="globex")

    assert (await get_space(client, auth, company="acme"))["web_search"] is False
    assert (await get_space(client, auth, company="globex"))["web_search"] is True
    assert await scalar(app, "SELECT company_id FROM space_settings") == "globex"


async def test_a_plain_user_or_an_operator_may_not_touch_space_settings(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    for roles in [(), ("operator",)]:
        headers = auth("mallory", "acme", roles)
        assert (await client.get("/v1/spaces/space-1", headers=headers)).status_code == 403
        response = await client.patch("/v1/spaces/space-1", json={}, headers=headers)
        assert response.status_code == 403
