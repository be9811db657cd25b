"""Turns saved and contexts served are counted in memory on the hot path and written in one
upsert per flush: no database write per request, only successful calls, a replayed turn is
not a new one, and what a process counted is written at the latest when it shuts down."""

from __future__ import annotations

import socket
from datetime import UTC, datetime
from typing import Any

import httpx
from fastapi import FastAPI
from pydantic import SecretStr

from app.kit.config import Settings
from app.kit.db.engine import create_database
from app.usage.meter import UsageMeter
from tests.helpers.apps import SPACE, TEST_JWT_SECRET, AuthFactory, app_with, client_of
from tests.helpers.db import database_of, rows, statements
from tests.helpers.settings import enable_company
from tests.helpers.turns import context, new_chat, turn_body, user
from tests.helpers.worker import wait_for


async def counts(app: FastAPI) -> dict[tuple[str, str], int]:
    found = await rows(app, "SELECT company_id, counter, count FROM usage_daily_counts")
    return {(row.company_id, row.counter): row.count for row in found}


async def save(
    http: httpx.AsyncClient,
    auth: AuthFactory,
    body: dict[str, Any],
    *,
    chat: str = "chat-1",
    key: str | None = None,
) -> httpx.Response:
    headers = auth() | ({"Idempotency-Key": key} if key else {})
    return await http.post(f"/v1/chats/{chat}/turns", json=body, headers=headers)


async def test_only_successful_calls_count_and_none_writes_until_the_flush(
    app: FastAPI, database_url: str, auth: AuthFactory
) -> None:
    async with app_with(database_url) as api, client_of(api) as http:
        await enable_company(http, auth)
        with statements(api) as seen:
            chat = new_chat()
            for _ in range(3):
                await context(http, auth, chat, [user("Hello")])
            await context(http, auth, chat, [user("Hello")], expect=422, surprise=True)
            assert (await http.post(f"/v1/chats/{chat}/context", json={})).status_code == 401

            body = turn_body([user("I work at Acme.")], "Noted.")
            first = await save(http, auth, body, key="turn-key-1")
            replayed = await save(http, auth, body, key="turn-key-1")
            other = await save(http, auth, turn_body([user("I like tea.")], "Noted."))
            refused = await save(http, auth, body | {"surprise": True})
        assert (first.status_code, other.status_code) == (202, 202)
        assert replayed.status_code == 202
        assert replayed.headers.get("idempotent-replayed") == "true"
        assert refused.status_code == 422
        assert not [statement for statement in seen if "usage_daily" in statement]
        assert await counts(app) == {}  # counted in memory only, so far

    assert await counts(app) == {("acme", "turns_saved"): 2, ("acme", "contexts_served"): 3}
    (day,) = await rows(app, "SELECT DISTINCT day FROM usage_daily_counts")
    assert day.day == datetime.now(UTC).date()


async def test_a_running_process_writes_its_counts_every_flush_interval(
    app: FastAPI, database_url: str, auth: AuthFactory
) -> None:
    async with app_with(database_url, usage_flush_seconds=0.2) as api, client_of(api) as http:
        body = {"space_id": SPACE, "messages": [user("Hello")]}
        response = await http.post("/v1/chats/chat-1/context", json=body, headers=auth())
        assert response.status_code == 200, response.text

        async def written() -> bool:
            return await counts(app) == {("acme", "contexts_served"): 1}

        await wait_for(written, seconds=10)
        await context(http, auth, "chat-1", [user("Hello again")], company="globex")

        async def added() -> bool:
            return (await counts(app)).get(("globex", "contexts_served")) == 1

        await wait_for(added, seconds=10)
        assert (await counts(app))[("acme", "contexts_served")] == 1  # added once, not again


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_a_flush_the_database_refuses_keeps_its_counts_for_the_next(app: FastAPI) -> None:
    url = f"postgresql+asyncpg://nobody@127.0.0.1:{_closed_port()}/none"
    settings = Settings(
        _env_file=None,
        environment="test",
        jwt_secret=SecretStr(TEST_JWT_SECRET),
        database_url=url,
        db_connect_timeout_seconds=1.0,
    )
    unreachable = create_database(url, settings)
    failures: list[int] = []
    meter = UsageMeter(unreachable, 3600, on_flush_failure=lambda: failures.append(1))
    try:
        meter.context_served("acme")
        meter.turn_saved("acme", replayed=False)
        meter.turn_saved("acme", replayed=True)

        assert await meter.flush() is False
        assert failures == [1]
        meter.context_served("acme")
        meter.buffer.database = database_of(app)  # the database is back
        assert await meter.flush() is True
    finally:
        await unreachable.dispose()

    assert await counts(app) == {("acme", "turns_saved"): 1, ("acme", "contexts_served"): 2}
    assert await meter.flush() is True  # nothing left: nothing added twice
    assert await counts(app) == {("acme", "turns_saved"): 1, ("acme", "contexts_served"): 2}
