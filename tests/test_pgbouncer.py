"""The service behind PgBouncer in transaction pooling mode (`DB_PGBOUNCER_TRANSACTION_MODE`):
the two calls of a chat turn (with and without Idempotency-Key), the user's memory API and the
worker, for several users at once, through a server pool much smaller than the app's pools, so
consecutive transactions of one client connection run on different server connections."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import httpx
import psutil  # type: ignore[import-untyped]  # installed with pgserver; used here only
import pytest
from sqlalchemy import make_url

from app.kit.db.engine import create_database
from app.profiles.document import Section
from tests.helpers.apps import SPACE, AuthFactory, app_with, client_of, make_settings
from tests.helpers.db import scratch_database
from tests.helpers.memory import ME, create
from tests.helpers.pgbouncer import PgBouncer, pgbouncer_binary, running_pgbouncer
from tests.helpers.profiles import memory_md
from tests.helpers.settings import enable_company
from tests.helpers.turns import new_chat, turn_body, user
from tests.helpers.worker import wait_for

SERVER_POOL = 2  # server connections PgBouncer may open to the database
USERS = 8
FACT = "Prefers metric units"
TURN = "I work as a data engineer at Acme"
CONSOLIDATED = "Works as a data engineer."


@pytest.fixture
async def scratch_database_url(server_url: str) -> AsyncIterator[str]:
    """A migrated database of its own, so its server connections are PgBouncer's alone."""
    pgbouncer_binary()  # skip before creating anything
    async with scratch_database(server_url, "cms_pgbouncer") as url:
        yield url


async def backend_pids(server_url: str, database: str) -> frozenset[int]:
    direct = make_url(server_url).set(drivername="postgresql")
    conn = await asyncpg.connect(direct.render_as_string(hide_password=False))
    try:
        rows = await conn.fetch("SELECT pid FROM pg_stat_activity WHERE datname = $1", database)
    finally:
        await conn.close()
    return frozenset(int(row["pid"]) for row in rows)


class ConnectionCounts:
    """Samples, while the requests run, the app's client connections to PgBouncer (sockets of
    this process to its port) and PostgreSQL's backends on the database (PgBouncer's side)."""

    def __init__(
        self, bouncer: PgBouncer, server_url: str, database: str, before: frozenset[int]
    ) -> None:
        """`before`: the database's backends from before PgBouncer started (e.g. the migrations'
        connection, which can still be exiting), never counted as PgBouncer's."""
        self._port = make_url(bouncer.url).port
        self._server_url = server_url
        self._database = database
        self._before = list(before)
        self.clients = 0
        self.servers = 0

    async def sample_until(self, done: asyncio.Event) -> None:
        direct = make_url(self._server_url).set(drivername="postgresql")
        conn = await asyncpg.connect(direct.render_as_string(hide_password=False))
        try:
            while not done.is_set():
                backends = await conn.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = $1"
                    " AND pid <> ALL($2::int[])",
                    self._database,
                    self._before,
                )
                self.servers = max(self.servers, int(backends))
                self.clients = max(self.clients, self._client_sockets())
                await asyncio.sleep(0.01)
        finally:
            await conn.close()

    def _client_sockets(self) -> int:
        own = psutil.Process(os.getpid()).net_connections(kind="tcp")
        return sum(
            1 for c in own if c.raddr and c.raddr.port == self._port and c.status == "ESTABLISHED"
        )


async def one_user(client: httpx.AsyncClient, auth: AuthFactory, sub: str) -> list[str]:
    """Everything one user does in the test; the problems found (none when all worked)."""
    headers, problems = auth(sub), []
    created = await create(client, headers, memory_md({Section.COMMUNICATION: [FACT]}, user_id=sub))
    if created.status_code != 201:
        return [f"{sub}: PUT memory answered {created.status_code}: {created.text}"]
    read = await client.get(ME, headers=headers)
    if read.status_code != 200 or FACT not in read.json()["content"]:
        problems.append(f"{sub}: GET memory answered {read.status_code}: {read.text}")

    chat = new_chat()
    body = {"space_id": SPACE, "system_prompt": "Base.", "messages": [user(TURN)]}
    loaded = await client.post(f"/v1/chats/{chat}/context", json=body, headers=headers)
    if loaded.status_code != 200 or FACT not in loaded.json()["system_prompt"]:
        problems.append(f"{sub}: /context answered {loaded.status_code}: {loaded.text}")

    keyed = headers | {"Idempotency-Key": f"key-{sub}"}
    turn = turn_body([user(TURN)], "Noted.")
    first = await client.post(f"/v1/chats/{chat}/turns", json=turn, headers=keyed)
    replay = await client.post(f"/v1/chats/{chat}/turns", json=turn, headers=keyed)
    if first.status_code != 202 or replay.content != first.content:
        problems.append(f"{sub}: keyed /turns {first.status_code}, replay {replay.status_code}")
    second = turn_body(
        [user(TURN), {"role": "assistant", "content": "Noted."}, user("Thanks")], "!"
    )
    unkeyed = await client.post(f"/v1/chats/{chat}/turns", json=second, headers=headers)
    if unkeyed.status_code != 202:
        problems.append(f"{sub}: /turns answered {unkeyed.status_code}: {unkeyed.text}")
    return problems


async def consolidated(client: httpx.AsyncClient, auth: AuthFactory, sub: str) -> bool:
    """The worker wrote a version on top of the user's own: it holds both facts."""
    history = await client.get(f"{ME}/versions", headers=auth(sub))
    head = await client.get(ME, headers=auth(sub))
    if history.status_code != 200 or head.status_code != 200:
        return False
    content = head.json()["content"]
    return len(history.json()["items"]) >= 2 and CONSOLIDATED in content and FACT in content


async def test_turns_memory_and_worker_share_a_small_transaction_pool_through_pgbouncer(
    scratch_database_url: str, server_url: str, auth: AuthFactory, tmp_path: Path
) -> None:
    database = str(make_url(scratch_database_url).database)
    before = await backend_pids(server_url, database)
    with running_pgbouncer(scratch_database_url, pool_size=SERVER_POOL) as bouncer:
        async with (
            app_with(
                bouncer.url,
                db_pgbouncer_transaction_mode=True,
                db_pool_size=4,
                db_hot_pool_size=8,
                worker_enabled=True,
                worker_concurrency=2,
                worker_poll_seconds=0.05,
                worker_heartbeat_file=tmp_path / "worker.heartbeat",
            ) as application,
            client_of(application) as client,
        ):
            await enable_company(client, auth)
            counts = ConnectionCounts(bouncer, server_url, database, before)
            done = asyncio.Event()
            sampling = asyncio.create_task(counts.sample_until(done))
            try:
                users = [f"user-{n}" for n in range(USERS)]
                found = await asyncio.gather(*(one_user(client, auth, sub) for sub in users))
                assert [p for problems in found for p in problems] == []

                async def all_consolidated() -> bool:
                    checks = [consolidated(client, auth, sub) for sub in users]
                    return all(await asyncio.gather(*checks))

                await wait_for(all_consolidated)
            finally:
                done.set()
                await sampling
        log = bouncer.log()

    # the app's connections really were multiplexed onto PgBouncer's few server connections
    seen = f"{bouncer.version}: {counts.clients} client, {counts.servers} server connections"
    assert counts.clients > SERVER_POOL * 2, seen
    # PostgreSQL's side, sampled: a server connection PgBouncer replaces (it closes one a client
    # left inside a transaction) can still be exiting when its replacement starts, so one more
    # backend than the pool may be seen for a moment; the clients still far outnumber them
    assert 0 < counts.servers <= SERVER_POOL + 1, seen
    assert counts.clients > counts.servers * 4, seen
    assert "prepared statement" not in log, log[-3000:]


@pytest.mark.parametrize("transaction_mode", [False, True])
async def test_a_statement_run_again_on_another_server_connection_needs_the_setting(
    database_url: str, transaction_mode: bool
) -> None:
    """The control: without the setting (and with PgBouncer told to drop the session timeouts
    it would otherwise refuse), a statement prepared on one server connection is looked for,
    the next time, on the server connection PgBouncer hands out then, which never saw it."""
    with running_pgbouncer(
        database_url,
        pool_size=2,
        ignore_startup_parameters=("statement_timeout", "idle_in_transaction_session_timeout"),
    ) as bouncer:
        settings = make_settings(bouncer.url, db_pgbouncer_transaction_mode=transaction_mode)
        database = create_database(str(settings.async_database_url), settings)
        try:
            async with (
                database.driver.connection() as first,
                database.driver.connection() as second,
            ):
                assert await first.fetchval("SELECT 1") == 1  # on the only server connection
                async with second.transaction():  # which now stays with `second`
                    await second.execute("SELECT 2")
                    if transaction_mode:
                        assert await first.fetchval("SELECT 1") == 1
                    else:
                        with pytest.raises(asyncpg.exceptions.InvalidSQLStatementNameError):
                            await first.fetchval("SELECT 1")
        finally:
            await database.dispose()
