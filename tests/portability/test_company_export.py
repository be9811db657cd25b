"""`GET /v1/companies/{id}/export`: one consistent, read-only snapshot of one company, streamed
as it is read (memory holds a batch, not the company), audited, and ended however the client
ends the response."""

from __future__ import annotations

import tracemalloc
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import text

from app.enablement.decision import FLAG_CONTEXT_MEMORY
from app.main import create_app
from app.portability.export import open_snapshot
from tests.helpers.apps import AuthFactory, make_settings
from tests.helpers.db import database_of, rows, sessions
from tests.helpers.polling import wait_until
from tests.helpers.portability import export_of, operator, records
from tests.helpers.serving import served
from tests.helpers.settings import set_flag
from tests.helpers.turns import save_turn, user

MESSAGE_BYTES = 8192


async def test_an_empty_company_exports_its_header_and_a_trailer_of_zeros(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    exported = records(await export_of(client, auth, "nobody"))

    assert [record["type"] for record in exported] == ["header", "end"]
    assert exported[0]["company_id"] == "nobody"
    assert set(exported[1]["counts"].values()) == {0}


async def test_the_export_is_one_snapshot_whatever_is_written_meanwhile(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await set_flag(client, auth, FLAG_CONTEXT_MEMORY, True, "acme")
    await save_turn(client, auth, "chat-1", [user("before the export")], "ok")
    snapshot = await open_snapshot(database_of(app), "acme")
    try:
        isolation = await snapshot.connection.execute(text("SHOW transaction_isolation"))
        read_only = await snapshot.connection.execute(text("SHOW transaction_read_only"))
        assert (isolation.scalar_one(), read_only.scalar_one()) == ("repeatable read", "on")
        await save_turn(client, auth, "chat-1", [user("during the export")], "ok")
        await set_flag(client, auth, FLAG_CONTEXT_MEMORY, False, "acme")
        stream = b"".join([chunk async for chunk in snapshot.lines()])
    finally:
        await snapshot.close()

    assert b"before the export" in stream
    assert b"during the export" not in stream
    flags = [r for r in records(stream) if r["type"] == "feature_flag"]
    assert [flag["enabled"] for flag in flags] == [True]
    assert records(stream)[-1]["counts"]["turn"] == 1


async def test_an_export_is_audited_as_the_operator_who_read_it(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await export_of(client, auth, "acme")

    events = await rows(
        app,
        "SELECT actor_company_id, actor_id, target_kind, target_id FROM audit_events"
        " WHERE company_id = 'acme' AND action = 'company.exported'",
    )
    assert [tuple(event) for event in events] == [("platform", "olga", "company", "acme")]


async def test_only_an_operator_exports(client: httpx.AsyncClient, auth: AuthFactory) -> None:
    for headers in (auth("alice", "acme"), auth("sam", "acme", ("space_admin",))):
        response = await client.get("/v1/companies/acme/export", headers=headers)
        assert response.status_code == 403


async def _seed_messages(app: FastAPI, count: int) -> None:
    """`count` messages of MESSAGE_BYTES each in one chat of alice of acme, by SQL."""
    async with sessions(app)() as session, session.begin():
        await session.execute(
            text(
                "INSERT INTO turns (company_id, id, user_id, chat_id, space_id, history_mode)"
                " VALUES ('acme', '00000000-0000-0000-0000-000000000001', 'alice', 'chat-1',"
                " 'space-1', 'auto')"
            )
        )
        await session.execute(
            text(
                "INSERT INTO chat_messages (company_id, user_id, chat_id, turn_id, role, content,"
                " source, tokens) SELECT 'acme', 'alice', 'chat-1',"
                " '00000000-0000-0000-0000-000000000001', 'user', repeat('x', :size) || n,"
                " 'request', 1 FROM generate_series(1, :count) AS n"
            ),
            {"size": MESSAGE_BYTES, "count": count},
        )


@pytest.fixture
async def served_app(database_url: str) -> AsyncIterator[tuple[FastAPI, str]]:
    application = create_app(make_settings(database_url))
    async with served(application) as base_url:
        yield application, base_url


async def test_memory_holds_a_batch_of_the_export_not_the_company(
    app: FastAPI, served_app: tuple[FastAPI, str], auth: AuthFactory
) -> None:
    """32 MiB of chat text streams through with a few MiB at most in memory (what the
    process allocates while serving and reading it, both in this process)."""
    await _seed_messages(app, 4096)
    _, base_url = served_app
    received = 0
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        tracemalloc.start()
        try:
            async with http.stream(
                "GET", "/v1/companies/acme/export", headers=operator(auth)
            ) as response:
                assert response.status_code == 200
                async for chunk in response.aiter_raw():
                    received += len(chunk)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()

    assert received > 4096 * MESSAGE_BYTES
    assert peak < 8 * 1024 * 1024, f"peak {peak / 2**20:.1f} MiB for {received / 2**20:.0f} MiB"


async def test_a_client_gone_half_way_gives_the_snapshot_back(
    app: FastAPI, served_app: tuple[FastAPI, str], auth: AuthFactory
) -> None:
    await _seed_messages(app, 2048)
    application, base_url = served_app
    pool = database_of(application).engine.pool
    async with (
        httpx.AsyncClient(base_url=base_url, timeout=60) as http,
        http.stream("GET", "/v1/companies/acme/export", headers=operator(auth)) as response,
    ):
        async for _ in response.aiter_raw():
            break  # the first chunk, then away
    checked_out = pool.checkedout  # type: ignore[attr-defined]
    await wait_until(lambda: checked_out() == 0, 5, what="the export's connection back in the pool")
