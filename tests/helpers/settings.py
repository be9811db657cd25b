"""The settings a test starts from, set over the settings API: company feature flags, a space's
settings, and a user's own memory switch."""

from __future__ import annotations

from typing import Any

import httpx

from app.enablement.decision import FLAG_ALLOW_WITH_WEB_SEARCH, FLAG_CONTEXT_MEMORY
from tests.helpers.apps import COMPANY, OPERATOR, SPACE_ADMIN, USER, AuthFactory


async def set_flag(
    client: httpx.AsyncClient,
    auth: AuthFactory,
    flag: str,
    enabled: bool,
    company: str = COMPANY,
) -> None:
    response = await client.put(
        f"/v1/companies/{company}/feature-flags/{flag}",
        json={"enabled": enabled},
        headers=auth("olga", "platform", OPERATOR),
    )
    assert response.status_code == 200, response.text


async def enable_company(
    client: httpx.AsyncClient,
    auth: AuthFactory,
    company: str = COMPANY,
    *,
    allow_with_web_search: bool = False,
) -> None:
    """Company flag on (and optionally the web-search allowance); the spaces left at defaults."""
    await set_flag(client, auth, FLAG_CONTEXT_MEMORY, True, company)
    if allow_with_web_search:
        await set_flag(client, auth, FLAG_ALLOW_WITH_WEB_SEARCH, True, company)


async def patch_space(
    client: httpx.AsyncClient,
    auth: AuthFactory,
    space_id: str,
    body: dict[str, Any],
    company: str = COMPANY,
    *,
    expect: int | None = None,
) -> httpx.Response:
    """A space admin's PATCH of the space; asserts the status when `expect` is given."""
    response = await client.patch(
        f"/v1/spaces/{space_id}", json=body, headers=auth("sam", company, SPACE_ADMIN)
    )
    if expect is not None:
        assert response.status_code == expect, response.text
    return response


async def patch_user_settings(
    client: httpx.AsyncClient,
    auth: AuthFactory,
    body: dict[str, Any],
    user: str = USER,
    *,
    expect: int | None = None,
) -> httpx.Response:
    """The user's PATCH of their own settings; asserts the status when `expect` is given."""
    response = await client.patch("/v1/me/settings", json=body, headers=auth(user, COMPANY))
    if expect is not None:
        assert response.status_code == expect, response.text
    return response
