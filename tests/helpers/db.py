"""SQL below the app: statements as the server's administrator, the app's sessions, rows and
scalars read back, and a recorder of the statements the app sends.

A test's own statements may reach every company: they set rows up and read them back across
companies (`SELECT count(*) FROM turns`). On a Citus cluster (`TEST_CITUS=1`, tests/conftest.py)
the service's role turns a statement that reaches more than one shard into an error; the
connections here (`admin_execute`, `admin_fetchval`, `admin_connect`) and the sessions of
`admin_session` (`rows`, `scalar`) lower that level for the test's statements only, so the error
still catches every statement the service sends itself."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Final

import asyncpg
from fastapi import FastAPI
from sqlalchemy import event, make_url, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, SessionTransaction

from app.kit.citus import ACROSS_COMPANIES_SQL, runs_citus
from app.kit.db.engine import Database
from app.kit.db.migrations import run_migrations

EVERY_SHARD: Final = {
    "citus.multi_task_query_log_level": "off",
    "citus.enable_unsafe_triggers": "on",
}
"""The session settings of a test's own connections: on a Citus cluster its statements may reach
every shard (the service's role makes that an error), and it may put a trigger on a distributed
table (the fault a test injects: Citus then creates it on every shard). On plain PostgreSQL a
setting of an extension that is not there is kept as a placeholder and means nothing."""


def _asyncpg_dsn(url: str) -> dict[str, Any]:
    parsed = make_url(url)
    params: dict[str, Any] = {
        "user": parsed.username or "postgres",
        "password": parsed.password or None,
        "database": parsed.database or "postgres",
        "host": parsed.query.get("host") or parsed.host or "127.0.0.1",
        "server_settings": dict(EVERY_SHARD),
    }
    if parsed.port:
        params["port"] = parsed.port
    return params


async def admin_connect(url: str) -> asyncpg.Connection:
    """A connection of the test's own to the database at `url`, outside any app, whose
    statements may reach every shard of a Citus cluster."""
    return await asyncpg.connect(**_asyncpg_dsn(url))


async def admin_execute(url: str, *statements: str) -> None:
    """Run statements on their own connection, outside any app (CREATE DATABASE, TRUNCATE)."""
    conn = await admin_connect(url)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


@asynccontextmanager
async def scratch_database(server_url: str, prefix: str) -> AsyncIterator[str]:
    """A database of its own on the server, migrated to head, dropped when the block ends;
    yields its URL (for processes that do not migrate, or tests that need empty tables)."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    await admin_execute(server_url, f'CREATE DATABASE "{name}"')
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    try:
        await asyncio.to_thread(run_migrations, url)
        yield url
    finally:
        await admin_execute(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def admin_fetchval(url: str, query: str, *args: Any) -> Any:
    """The first value of a query, read on its own connection (what another client sees)."""
    conn = await admin_connect(url)
    try:
        return await conn.fetchval(query, *args)
    finally:
        await conn.close()


async def backend_pid(session: AsyncSession) -> int:
    """The server process of the connection under `session` (what pg_stat_activity calls it)."""
    pid: int = (await session.execute(text("SELECT pg_backend_pid()"))).scalar_one()
    return pid


async def sessions_blocked_by(url: str, pid: int) -> int:
    """How many sessions of this database wait for a lock that backend `pid` holds: a test
    polls it to know that the statement it started is now queued behind its lock. Sessions of
    other databases (another test worker's) are not counted."""
    blocked: int = await admin_fetchval(
        url,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock' AND $1::int = ANY(pg_blocking_pids(pid))",
        pid,
    )
    return blocked


def database_of(app: FastAPI) -> Database:
    database: Database = app.state.database
    return database


def sessions(app: FastAPI) -> async_sessionmaker[AsyncSession]:
    return database_of(app).sessionmaker


@asynccontextmanager
async def admin_session(bind: FastAPI | AsyncEngine) -> AsyncIterator[AsyncSession]:
    """A session of the app's engine (or of `bind`, an engine) for the test's own statements:
    rows set up, rows read back across companies. On a Citus cluster every transaction it
    begins first lets its statements reach every shard (`SET LOCAL`, gone with the
    transaction, so the connection goes back to the pool as the service uses it). The
    service's own functions take the app's plain `sessions` and `engine`."""
    engine = bind if isinstance(bind, AsyncEngine) else database_of(bind).engine
    async with AsyncSession(engine, expire_on_commit=False) as session:
        if await runs_citus(engine):
            event.listen(session.sync_session, "after_begin", _reach_every_shard)
        yield session


def _reach_every_shard(_: Session, __: SessionTransaction, connection: Connection) -> None:
    connection.exec_driver_sql(ACROSS_COMPANIES_SQL)


async def rows(app: FastAPI, sql: str, **params: Any) -> list[Any]:
    """The rows of the test's own query (it may read across companies)."""
    async with admin_session(app) as session:
        return list((await session.execute(text(sql), params)).all())


async def execute(app: FastAPI, sql: str, **params: Any) -> None:
    """Run the test's own statement and commit it (it may write across companies)."""
    async with admin_session(app) as session, session.begin():
        await session.execute(text(sql), params)


async def scalar(app: FastAPI, sql: str, **params: Any) -> Any:
    """The one value of the test's own query (it may read across companies)."""
    async with admin_session(app) as session:
        return (await session.execute(text(sql), params)).scalar_one()


@contextmanager
def statements(app: FastAPI) -> Iterator[list[str]]:
    """The SQL statements the app sends while the block runs: those of the session engine
    (where BEGIN/COMMIT are protocol-level with asyncpg and do not appear) and every statement
    of the hot path's driver connections (BEGIN and COMMIT included)."""
    seen: list[str] = []
    database = database_of(app)
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
