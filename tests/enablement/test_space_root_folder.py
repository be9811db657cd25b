"""Saving a space with memory effectively on ensures the company's `user-memory` root folder,
once, also under concurrent saves."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tests.helpers.apps import AuthFactory
from tests.helpers.db import scalar
from tests.helpers.memory import root_folders
from tests.helpers.settings import enable_company, patch_space


async def test_saving_a_space_with_memory_on_ensures_the_root_folder(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    await enable_company(client, auth)
    response = await patch_space(client, auth, "space-1", {"context_memory": True})
    assert response.status_code == 200

    assert await root_folders(app) == 1
    entries = await scalar(
        app,
        "SELECT string_agg(principal_kind || ':' || principal_id || ':' || permission, ','"
        " ORDER BY permission) FROM folder_acl",
    )
    assert entries == "group:root:acme:READ,group:root:acme:WRITE"
    assert await scalar(app, "SELECT inherit_access FROM folders") is False


async def test_even_an_unchanged_save_ensures_the_root_folder(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    await enable_company(client, auth)
    assert (await patch_space(client, auth, "space-1", {})).status_code == 200
    assert await root_folders(app) == 1


@pytest.mark.parametrize(
    ("allow", "body"),
    [
        (None, {"context_memory": True}),  # company flag off
        (False, {"context_memory": False}),  # space opted out
        (False, {"web_search": True}),  # web search blocks memory
    ],
)
async def test_no_root_folder_when_memory_is_not_effectively_on(
    client: httpx.AsyncClient,
    auth: AuthFactory,
    app: FastAPI,
    allow: bool | None,
    body: dict[str, Any],
) -> None:
    if allow is not None:
        await enable_company(client, auth, allow_with_web_search=allow)
    assert (await patch_space(client, auth, "space-1", body)).status_code == 200
    assert await root_folders(app) == 0


async def test_five_concurrent_saves_create_the_root_folder_exactly_once(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    await enable_company(client, auth)

    responses = await asyncio.gather(
        *(
            patch_space(client, auth, f"space-{n}", {"user_memory": {"max_tokens": 1000 + n}})
            for n in range(5)
        )
    )

    assert [r.status_code for r in responses] == [200] * 5
    assert await root_folders(app) == 1
    assert await scalar(app, "SELECT count(*) FROM folder_acl") == 2
    assert await scalar(app, "SELECT count(*) FROM space_settings") == 5


async def test_five_concurrent_first_saves_of_one_space_all_apply(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    await enable_company(client, auth)

    responses = await asyncio.gather(
        *(
            patch_space(client, auth, "space-1", {"user_memory": {"max_tokens": 1000 + n}})
            for n in range(5)
        )
    )

    assert [r.status_code for r in responses] == [200] * 5
    assert await scalar(app, "SELECT count(*) FROM space_settings") == 1
    assert await root_folders(app) == 1
    events = "SELECT count(*) FROM audit_events WHERE action = 'space_settings.update'"
    assert await scalar(app, events) == 5
