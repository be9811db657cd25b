"""The read-only root folder view over HTTP: operators and the company's own space admins see
the `user-memory` ACL; nobody sees per-user folders through it."""

from __future__ import annotations

import httpx
from fastapi import FastAPI

from tests.helpers.apps import OPERATOR, SPACE_ADMIN, AuthFactory
from tests.helpers.memory import seed_memory
from tests.helpers.settings import enable_company, patch_space

PATH = "/v1/companies/acme/folders/user-memory"
ROOT_VIEW = {
    "path": "user-memory",
    "inherit_access": False,
    "entries": [
        {"principal_kind": "group", "principal_id": "root:acme", "permission": "READ"},
        {"principal_kind": "group", "principal_id": "root:acme", "permission": "WRITE"},
    ],
}


async def test_the_root_folder_is_404_until_a_space_enables_memory(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    response = await client.get(PATH, headers=auth("olga", "platform", OPERATOR))
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"


async def test_operators_and_the_companys_space_admins_read_the_root_acl(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(client, auth)
    await patch_space(client, auth, "space-1", {"context_memory": True})

    for headers in (auth("olga", "platform", OPERATOR), auth("sam", "acme", SPACE_ADMIN)):
        response = await client.get(PATH, headers=headers)
        assert response.status_code == 200
        assert response.json() == ROOT_VIEW


async def test_per_user_folders_are_never_listed(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    await seed_memory(app, "alice")  # creates the root lazily, then alice's folder

    response = await client.get(PATH, headers=auth("olga", "platform", OPERATOR))

    assert response.json() == ROOT_VIEW
    assert "alice" not in response.text


async def test_a_space_admin_of_another_company_gets_404(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    await seed_memory(app, "alice")
    response = await client.get(PATH, headers=auth("eve", "globex", SPACE_ADMIN))
    assert response.status_code == 404


async def test_a_plain_user_gets_403_and_anonymous_401(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    await seed_memory(app, "alice")
    assert (await client.get(PATH, headers=auth("alice", "acme"))).status_code == 403
    anonymous = await client.get(PATH)
    assert anonymous.status_code == 401
    assert anonymous.headers["www-authenticate"] == "Bearer"
