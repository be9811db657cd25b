"""The service's sessions and pools: the worker claims and consolidates on a pool of its own
while every connection of the requests' pool is taken, each session is opened with
`idle_in_transaction_session_timeout`, which the server enforces, and a statement the server
cancels at `statement_timeout` is a 503 that wrote nothing."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.enablement.decision import FLAG_CONTEXT_MEMORY
from app.kit.db.engine import create_database
from app.kit.db.errors import is_database_unavailable
from app.kit.errors import PROBLEM_CONTENT_TYPE
from app.main import create_app
from tests.helpers.apps import COMPANY, USER, AuthFactory, client_with, make_settings
from tests.helpers.db import admin_connect, admin_fetchval, database_of
from tests.helpers.polling import wait_until
from tests.helpers.serving import served
from tests.helpers.settings import set_flag
from tests.helpers.turns import queue_turn, turn_body


async def test_the_worker_consolidates_while_every_request_connection_is_taken(
    database_url: str, auth: AuthFactory
) -> None:
    settings = make_settings(database_url, worker_enabled=True, worker_poll_seconds=0.05)
    application = create_app(settings)
    async with served(application) as base_url, httpx.AsyncClient(base_url=base_url) as http:
        await set_flag(http, auth, FLAG_CONTEXT_MEMORY, True)
        engine = database_of(application).engine
        held: list[AsyncConnection] = []
        try:
            for _ in range(settings.db_pool_size + settings.db_max_overflow):
                held.append(await engine.connect())
            with pytest.raises(TimeoutError):  # the requests' pool has nothing left
                async with asyncio.timeout(0.5):
                    await engine.connect()
            # the turn saved through another replica: this one's requests have no connection
            async with client_with(database_url) as replica:
                job = await queue_turn(replica, auth, "I work as a pilot at Acme")

            async def consolidated() -> bool:
                status = await admin_fetchval(
                    database_url, "SELECT status FROM jobs WHERE id = $1", job
                )
                return bool(status == "succeeded")

            await wait_until(consolidated, 15, what="the turn consolidated by the worker")
        finally:
            for connection in held:
                await connection.close()


async def test_a_session_idle_inside_a_transaction_is_ended_by_the_server(
    database_url: str,
) -> None:
    settings = make_settings(database_url, db_idle_in_transaction_timeout_seconds=1)
    database = create_database(database_url, settings)
    try:
        async with database.engine.connect() as connection:
            shown = await connection.execute(text("SHOW idle_in_transaction_session_timeout"))
            assert shown.scalar_one() == "1s"
            await connection.execute(text("SELECT 1"))  # a transaction begun, then left idle
            pid = (await connection.execute(text("SELECT pg_backend_pid()"))).scalar_one()

            async def ended() -> bool:
                gone = await admin_fetchval(
                    database_url, "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $1", pid
                )
                return bool(gone)

            await wait_until(ended, 10, what="the idle transaction's session ended")
            with pytest.raises(Exception) as failure:  # noqa: PT011 - the driver's own error
                await connection.execute(text("SELECT 1"))
            assert is_database_unavailable(failure.value)
    finally:
        await database.dispose()

    defaults = create_database(database_url, make_settings(database_url))
    worker = create_database(database_url, make_settings(database_url), pool_size=3)
    try:
        for each in (defaults, worker):
            async with each.engine.connect() as connection:
                shown = await connection.execute(text("SHOW idle_in_transaction_session_timeout"))
                assert shown.scalar_one() == "1min"
        assert worker.engine.pool.size() == 3  # type: ignore[attr-defined]
    finally:
        await defaults.dispose()
        await worker.dispose()


async def test_a_save_past_the_statement_timeout_is_a_503_that_wrote_nothing(
    database_url: str, auth: AuthFactory
) -> None:
    # e.g. a save waiting on a lock a Citus shard move holds while it switches the company over
    settings = make_settings(database_url, db_statement_timeout_ms=300)
    body = turn_body([{"role": "user", "content": "I moved to Lisbon"}], "Noted.")
    chat = "chat-timed-out"
    async with (
        served(create_app(settings)) as base_url,
        httpx.AsyncClient(base_url=base_url) as http,
    ):
        await set_flag(http, auth, FLAG_CONTEXT_MEMORY, True)
        holder = await admin_connect(database_url)
        try:
            async with holder.transaction():
                await holder.execute("LOCK TABLE turns IN ACCESS EXCLUSIVE MODE")
                refused = await http.post(
                    f"/v1/chats/{chat}/turns", json=body, headers=auth(USER, COMPANY)
                )
        finally:
            await holder.close()

        assert refused.status_code == 503, refused.text
        assert refused.headers["content-type"] == PROBLEM_CONTENT_TYPE
        assert refused.headers["retry-after"] == str(settings.db_unavailable_retry_after_seconds)
        assert "Traceback" not in refused.text
        written = "SELECT count(*) FROM {} WHERE company_id = $1 AND chat_id = $2"
        for table in ("turns", "chat_messages"):
            assert await admin_fetchval(database_url, written.format(table), COMPANY, chat) == 0
        again = await http.post(f"/v1/chats/{chat}/turns", json=body, headers=auth(USER, COMPANY))
        assert again.status_code == 202, again.text
        assert await admin_fetchval(database_url, written.format("turns"), COMPANY, chat) == 1


def test_behind_pgbouncer_no_session_timeout_is_sent_at_connect(database_url: str) -> None:
    """PgBouncer refuses unknown startup parameters: in its mode both timeouts are left to the
    database role (docs/operations.md), directly they are sent with every connection."""
    for bouncer, sent in (
        (False, {"statement_timeout", "idle_in_transaction_session_timeout"}),
        (True, set()),
    ):
        settings = make_settings(database_url, db_pgbouncer_transaction_mode=bouncer)
        database = create_database(database_url, settings)
        server_settings = database.driver._connect_kwargs["server_settings"]
        assert isinstance(server_settings, dict)
        assert set(server_settings) - {"application_name"} == sent
