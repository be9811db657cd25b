"""The caller's enablement decision through real saved settings, and `load_enablement`, the
hot-path read: the same decision and the space's user-memory config in one SQL statement."""

from __future__ import annotations

import itertools
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import event, text

from app.enablement.decision import FLAG_ALLOW_WITH_WEB_SEARCH
from app.enablement.service import load_enablement
from tests.helpers.apps import AuthFactory
from tests.helpers.db import sessions
from tests.helpers.settings import enable_company, patch_space, set_flag

ALL_KEYS = ["company_flag", "space_setting", "web_search", "user_setting"]


async def get_enablement(
    client: httpx.AsyncClient, auth: AuthFactory, space_id: str = "space-1", user: str = "alice"
) -> dict[str, Any]:
    response = await client.get(
        "/v1/me/memory/enablement", params={"space_id": space_id}, headers=auth(user, "acme")
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def save_settings(
    client: httpx.AsyncClient,
    auth: AuthFactory,
    *,
    company: bool,
    space_memory: bool,
    web_search: bool,
    user_memory: bool,
    allow: bool = False,
) -> None:
    if company:
        await enable_company(client, auth)
    if allow:
        await set_flag(client, auth, FLAG_ALLOW_WITH_WEB_SEARCH, True)
    # Memory first, then web search: the locked switch refuses the other order.
    for body in ({"context_memory": space_memory}, {"web_search": web_search}):
        response = await patch_space(client, auth, "space-1", body)
        assert response.status_code == 200, response.text
    response = await client.patch(
        "/v1/me/settings", json={"context_memory": user_memory}, headers=auth("alice", "acme")
    )
    assert response.status_code == 200


@pytest.mark.parametrize("combination", list(itertools.product([True, False], repeat=4)))
async def test_the_decision_follows_the_four_saved_settings(
    client: httpx.AsyncClient, auth: AuthFactory, combination: tuple[bool, bool, bool, bool]
) -> None:
    company, space_memory, web_search, user_memory = combination
    await save_settings(
        client,
        auth,
        company=company,
        space_memory=space_memory,
        web_search=web_search,
        user_memory=user_memory,
    )

    body = await get_enablement(client, auth)

    holds = [company, space_memory, not web_search, user_memory]
    assert body["enabled"] is all(holds)
    assert [c["key"] for c in body["conditions"]] == ALL_KEYS
    assert [c["satisfied"] for c in body["conditions"]] == holds
    assert [c["level"] for c in body["conditions"]] == [
        "operator",
        "space_admin",
        "space_admin/operator",
        "end_user",
    ]
    blocking = [c for c in body["conditions"] if not c["satisfied"]]
    if blocking:
        assert body["reason"] == blocking[0]["reason"]
    else:
        assert "all four conditions hold" in body["reason"]


async def test_the_override_lets_memory_run_next_to_web_search(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await save_settings(
        client,
        auth,
        company=True,
        space_memory=True,
        web_search=True,
        user_memory=True,
        allow=True,
    )
    assert (await get_enablement(client, auth))["enabled"] is True


async def test_nothing_saved_is_blocked_only_by_the_company_flag(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    body = await get_enablement(client, auth)
    assert body["enabled"] is False
    assert [c["key"] for c in body["conditions"] if not c["satisfied"]] == ["company_flag"]
    assert "never saved" in body["conditions"][1]["reason"]


async def test_only_the_flag_on_is_enough_for_a_never_saved_space_and_user(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(client, auth)
    assert (await get_enablement(client, auth, space_id="never-saved"))["enabled"] is True


async def test_one_users_opt_out_does_not_affect_another(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await save_settings(
        client, auth, company=True, space_memory=True, web_search=False, user_memory=False
    )
    assert (await get_enablement(client, auth, user="alice"))["enabled"] is False
    assert (await get_enablement(client, auth, user="bob"))["enabled"] is True


@pytest.mark.parametrize(
    "params", [{}, {"space_id": ""}, {"space_id": "a b"}, {"space_id": "x" * 129}]
)
async def test_space_id_is_required_and_validated(
    client: httpx.AsyncClient, auth: AuthFactory, params: dict[str, str]
) -> None:
    response = await client.get(
        "/v1/me/memory/enablement", params=params, headers=auth("alice", "acme")
    )
    assert response.status_code == 422
    assert [e["field"] for e in response.json()["errors"]] == ["query.space_id"]


# --- load_enablement ----------------------------------------------------------------------------


async def test_load_enablement_reads_everything_in_one_statement(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    await enable_company(client, auth)
    await patch_space(
        client,
        auth,
        "space-1",
        {"user_memory": {"use_orchestrator_language_model": False, "max_tokens": 4000}},
    )
    statements: list[str] = []

    def count(*args: Any) -> None:
        statements.append(str(args[2]))

    engine = app.state.database.engine.sync_engine
    async with sessions(app)() as session, session.begin():
        await session.execute(text("SELECT 1"))  # check the connection out before counting
        event.listen(engine, "before_cursor_execute", count)
        try:
            context = await load_enablement(session, "acme", "space-1", "alice")
        finally:
            event.remove(engine, "before_cursor_execute", count)

    assert len(statements) == 1, statements
    assert context.enabled is True
    assert context.user_memory.use_orchestrator_language_model is False
    assert context.user_memory.language_model == "AZURE_GPT_4o_2024_1120"
    assert context.user_memory.max_tokens == 4000


async def test_load_enablement_for_a_never_saved_space_gives_the_default_config(
    app: FastAPI,
) -> None:
    async with sessions(app)() as session, session.begin():
        context = await load_enablement(session, "acme", "space-1", "alice")

    assert context.enabled is False
    assert [c.key for c in context.decision.blocking] == ["company_flag"]
    assert context.user_memory.use_orchestrator_language_model is True
    assert context.user_memory.language_model == "AZURE_GPT_4o_2024_1120"
    assert context.user_memory.max_tokens == 2000


async def test_load_enablement_sees_the_users_opt_out_and_the_spaces_web_search(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    await save_settings(
        client, auth, company=True, space_memory=True, web_search=True, user_memory=False
    )
    async with sessions(app)() as session, session.begin():
        context = await load_enablement(session, "acme", "space-1", "alice")
        other_company = await load_enablement(session, "globex", "space-1", "alice")

    assert [c.key for c in context.decision.blocking] == ["web_search", "user_setting"]
    assert [c.key for c in other_company.decision.blocking] == ["company_flag"]
