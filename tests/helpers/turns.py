"""Helpers for the orchestrator-call tests: messages, the two calls over HTTP, settings through
the settings API, a stored profile seeded as the profile service stores one, and an app built
with other settings."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime
from typing import Any

import httpx
from asgi_lifespan import LifespanManager
from fastapi import FastAPI
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.auth import Principal
from app.enablement.decision import FLAG_ALLOW_WITH_WEB_SEARCH, FLAG_CONTEXT_MEMORY
from app.folders import service as folders
from app.main import create_app
from app.profiles import service as profiles
from app.profiles.document import Frontmatter, Profile, Section, render, render_body
from app.profiles.versions import STORED_TOKEN_COUNTER
from tests.conftest import AuthFactory, make_settings

COMPANY = "acme"
SPACE = "space-1"
Msg = dict[str, str]


def user(content: str) -> Msg:
    return {"role": "user", "content": content}


def assistant(content: str) -> Msg:
    return {"role": "assistant", "content": content}


def system(content: str) -> Msg:
    return {"role": "system", "content": content}


def pairs(messages: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in messages]


# --- the two calls ------------------------------------------------------------------------------


async def context(
    client: httpx.AsyncClient,
    auth: AuthFactory,
    chat: str,
    messages: Sequence[Msg],
    *,
    sub: str = "alice",
    company: str = COMPANY,
    expect: int = 200,
    **fields: Any,
) -> dict[str, Any]:
    body = {"space_id": SPACE, "messages": list(messages)} | fields
    response = await client.post(f"/v1/chats/{chat}/context", json=body, headers=auth(sub, company))
    assert response.status_code == expect, response.text
    result: dict[str, Any] = response.json()
    return result


def turn_body(messages: Sequence[Msg], answer: str, **fields: Any) -> dict[str, Any]:
    return {
        "space_id": SPACE,
        "messages": list(messages),
        "response": assistant(answer),
    } | fields


async def save_turn(
    client: httpx.AsyncClient,
    auth: AuthFactory,
    chat: str,
    messages: Sequence[Msg],
    answer: str,
    *,
    sub: str = "alice",
    company: str = COMPANY,
    **fields: Any,
) -> httpx.Response:
    response = await client.post(
        f"/v1/chats/{chat}/turns",
        json=turn_body(messages, answer, **fields),
        headers=auth(sub, company),
    )
    assert response.status_code in (201, 202), response.text
    return response


async def stored(
    client: httpx.AsyncClient, auth: AuthFactory, chat: str, *, sub: str = "alice"
) -> list[dict[str, Any]]:
    """Every stored message of the chat, following the cursor to the end."""
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params = {"limit": "100"} | ({"cursor": cursor} if cursor else {})
        response = await client.get(
            f"/v1/chats/{chat}/messages", params=params, headers=auth(sub, COMPANY)
        )
        assert response.status_code == 200, response.text
        page = response.json()
        items += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            return items


# --- settings through the settings API ----------------------------------------------------------


async def set_flag(
    client: httpx.AsyncClient, auth: AuthFactory, flag: str, enabled: bool, company: str = COMPANY
) -> None:
    response = await client.put(
        f"/v1/companies/{company}/feature-flags/{flag}",
        json={"enabled": enabled},
        headers=auth("olga", "platform", ("operator",)),
    )
    assert response.status_code == 200, response.text


async def patch_space(
    client: httpx.AsyncClient,
    auth: AuthFactory,
    body: dict[str, Any],
    space: str = SPACE,
    company: str = COMPANY,
) -> None:
    response = await client.patch(
        f"/v1/spaces/{space}", json=body, headers=auth("sam", company, ("space_admin",))
    )
    assert response.status_code == 200, response.text


async def set_user_memory(
    client: httpx.AsyncClient, auth: AuthFactory, sub: str, enabled: bool
) -> None:
    response = await client.patch(
        "/v1/me/settings", json={"context_memory": enabled}, headers=auth(sub, COMPANY)
    )
    assert response.status_code == 200, response.text


async def enable_memory(
    client: httpx.AsyncClient, auth: AuthFactory, *, allow_with_web_search: bool = False
) -> None:
    """Company flag on (and optionally the web-search allowance); the space left at defaults."""
    await set_flag(client, auth, FLAG_CONTEXT_MEMORY, True)
    if allow_with_web_search:
        await set_flag(client, auth, FLAG_ALLOW_WITH_WEB_SEARCH, True)


# --- a stored profile ---------------------------------------------------------------------------


def sessions(app: FastAPI) -> async_sessionmaker[AsyncSession]:
    maker: async_sessionmaker[AsyncSession] = app.state.database.sessionmaker
    return maker


def profile_of(user_id: str, bullets: dict[Section, list[str]]) -> Profile:
    frontmatter = Frontmatter(
        user_id=user_id, last_updated=datetime(2026, 11, 1, tzinfo=UTC), turn_count=1
    )
    return Profile.from_sections(frontmatter, bullets)


async def seed_profile(
    app: FastAPI,
    user_id: str,
    bullets: dict[Section, list[str]],
    *,
    company: str = COMPANY,
    version: int = 1,
) -> str:
    """The user's folder (through the folders service), memory.md and one head version, stored
    as the profile service stores them (`tokens` of the body); returns the document."""
    profile = profile_of(user_id, bullets)
    document = render(profile)
    principal = Principal(user_id=user_id, company_id=company, roles=frozenset())
    async with sessions(app)() as session, session.begin():
        folder_id, _ = await folders.ensure_user_folder(session, principal)
        await profiles.ensure_memory_file(session, company, user_id, folder_id)
        await session.execute(
            text(
                "INSERT INTO memory_versions (company_id, user_id, version, content, sha256,"
                " tokens, reason) VALUES (:c, :u, :v, :content, :sha, :tokens, 'consolidation')"
            ),
            {
                "c": company,
                "u": user_id,
                "v": version,
                "content": document,
                "sha": "0" * 64,
                "tokens": STORED_TOKEN_COUNTER.count(render_body(profile)),
            },
        )
        await session.execute(
            text(
                "UPDATE memory_files SET head_version = :v WHERE company_id = :c AND user_id = :u"
            ),
            {"c": company, "u": user_id, "v": version},
        )
    return document


async def rows(app: FastAPI, sql: str, **params: Any) -> list[Any]:
    async with sessions(app)() as session:
        return list((await session.execute(text(sql), params)).all())


# --- instrumentation and other apps -------------------------------------------------------------


@contextmanager
def statements(app: FastAPI) -> Iterator[list[str]]:
    """The SQL statements the app sends while the block runs: those of the session engine
    (where BEGIN/COMMIT are protocol-level with asyncpg and do not appear) and every statement
    of the hot path's driver connections (BEGIN and COMMIT included)."""
    seen: list[str] = []
    database = app.state.database
    engine = database.engine.sync_engine

    def record(*args: Any) -> None:
        seen.append(str(args[2]))

    def record_driver(query: Any) -> None:
        seen.append(str(query.query))

    event.listen(engine, "before_cursor_execute", record)
    database.driver.add_query_logger(record_driver)
    try:
        yield seen
    finally:
        database.driver.remove_query_logger(record_driver)
        event.remove(engine, "before_cursor_execute", record)


@asynccontextmanager
async def client_with(database_url: str, **overrides: Any) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client on a second app built with other settings (same database)."""
    application = create_app(make_settings(database_url, **overrides))
    async with LifespanManager(application):
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            yield http


def new_chat() -> str:
    return f"chat-{uuid.uuid4().hex[:8]}"
