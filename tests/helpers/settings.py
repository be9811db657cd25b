"""The settings a test starts from, set over the settings API: company feature flags, the
company's memory policy, a space's settings, and a user's own memory switch."""

from __future__ import annotations

from typing import Any

import httpx

from app.detectors import Category
from app.enablement.decision import FLAG_ALLOW_WITH_WEB_SEARCH, FLAG_CONTEXT_MEMORY
from app.enablement.memory_policy import (
    DEFAULT_ACTIONS,
    DEFAULT_INACTIVE_MEMORY_DAYS,
    DEFAULT_RECENT_TOPICS_DAYS,
)
from tests.helpers.apps import COMPANY, OPERATOR, SPACE_ADMIN, USER, AuthFactory

PLATFORM_OPERATOR = ("olga", "platform", OPERATOR)
"""The platform operator who onboards the tests' companies."""


async def register_company(
    client: httpx.AsyncClient, auth: AuthFactory, company: str = COMPANY
) -> None:
    """A platform operator registers `company` (201), or finds it registered (200): the first
    step before any operator write to it."""
    response = await client.post(
        "/v1/companies", json={"company_id": company}, headers=auth(*PLATFORM_OPERATOR)
    )
    assert response.status_code in (200, 201), response.text


async def set_flag(
    client: httpx.AsyncClient,
    auth: AuthFactory,
    flag: str,
    enabled: bool,
    company: str = COMPANY,
) -> None:
    await register_company(client, auth, company)
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


def memory_policy_body(**changes: str | int) -> dict[str, str | int]:
    """A whole memory policy as the PUT takes it: the defaults, with `changes` on top
    (`secrets="allow"`, `recent_topics_days=30`, ...)."""
    body: dict[str, str | int] = {c.value: DEFAULT_ACTIONS[c].value for c in Category}
    body["recent_topics_days"] = DEFAULT_RECENT_TOPICS_DAYS
    body["inactive_memory_days"] = DEFAULT_INACTIVE_MEMORY_DAYS
    return body | changes


async def set_memory_policy(
    client: httpx.AsyncClient, auth: AuthFactory, company: str = COMPANY, **changes: str | int
) -> dict[str, Any]:
    """An operator's PUT of the company's memory policy (the defaults with `changes`)."""
    await register_company(client, auth, company)
    response = await client.put(
        f"/v1/companies/{company}/memory-policy",
        json=memory_policy_body(**changes),
        headers=auth("olga", "platform", OPERATOR),
    )
    assert response.status_code == 200, response.text
    saved: dict[str, Any] = response.json()
    return saved


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
