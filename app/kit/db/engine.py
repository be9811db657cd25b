"""The engine of a database URL, with its session maker, the hot path's driver pool and the
arguments of a session that LISTENs, opened the same way (`create_database`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import event, make_url
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from app.kit.config import Settings, to_asyncpg_url
from app.kit.db.driver_pool import DriverPool
from app.kit.db.errors import drop_refusing_connections

if TYPE_CHECKING:
    from app.kit.citus_reads import WorkerReads


@dataclass(frozen=True)
class Database:
    engine: AsyncEngine
    sessionmaker: async_sessionmaker[AsyncSession]
    driver: DriverPool
    # CITUS_WORKER_READS: reads sent to the company's worker node (used only on Citus)
    worker_reads: WorkerReads | None = None
    # asyncpg's arguments for a session that LISTENs (app/jobs/wakeup.py); None: nobody can
    listen_kwargs: Mapping[str, object] | None = None

    async def dispose(self) -> None:
        if self.worker_reads is not None:
            await self.worker_reads.close()
        await self.driver.close()
        await self.engine.dispose()


def create_database(url: str, settings: Settings, *, pool_size: int | None = None) -> Database:
    """The engine and driver pool of `url`. `pool_size` given: a pool of exactly that many
    engine connections (no overflow), e.g. the worker's own; else DB_POOL_SIZE + overflow.

    Sessions are opened with `statement_timeout` and `idle_in_transaction_session_timeout`
    (a transaction left idle, by a stuck request or job, is ended by the server with its locks
    instead of holding a connection for ever), except behind PgBouncer in transaction mode,
    which refuses unknown startup parameters: set both on the database role there."""
    server_settings = {"application_name": "context-memory"}
    connect_args: dict[str, object] = {
        "timeout": settings.db_connect_timeout_seconds,
        "server_settings": server_settings,
    }
    engine_only: dict[str, object] = {}
    if settings.db_pgbouncer_transaction_mode:
        connect_args["statement_cache_size"] = 0
        engine_only = _unnamed_statements()
    else:
        server_settings["statement_timeout"] = str(settings.db_statement_timeout_ms)
        idle_ms = settings.db_idle_in_transaction_timeout_seconds * 1000
        server_settings["idle_in_transaction_session_timeout"] = str(idle_ms)
    engine = create_async_engine(
        url,
        pool_size=settings.db_pool_size if pool_size is None else pool_size,
        max_overflow=settings.db_max_overflow if pool_size is None else 0,
        pool_pre_ping=settings.db_pool_pre_ping,
        pool_timeout=settings.db_connect_timeout_seconds,
        connect_args={**connect_args, **engine_only},
    )
    event.listen(engine.sync_engine, "handle_error", drop_refusing_connections)
    # the dialect turns the URL (hosts, ports, socket directories, credentials,
    # target_session_attrs) into asyncpg's keyword arguments: both pools reach the same
    # servers the same way
    _, url_kwargs = engine.dialect.create_connect_args(engine.url)
    driver = DriverPool(
        {**url_kwargs, **connect_args},
        max_size=settings.db_hot_pool_size,
        timeout=settings.db_connect_timeout_seconds,
    )
    worker_reads = None
    if settings.citus_worker_reads:
        from app.kit.citus_reads import WorkerReads  # noqa: PLC0415 - it builds on DriverPool

        worker_reads = WorkerReads(
            driver,
            {**url_kwargs, **connect_args},
            max_size=settings.db_hot_pool_size,
            timeout=settings.db_connect_timeout_seconds,
        )
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    return Database(engine, sessions, driver, worker_reads, _listen_kwargs(engine, settings))


def _listen_kwargs(engine: AsyncEngine, settings: Settings) -> dict[str, object] | None:
    """Where a worker LISTENs: DATABASE_LISTEN_URL, else the database's own URL unless that
    is a transaction pooler, which cannot keep a LISTEN (then None: the workers poll)."""
    if settings.database_listen_url:
        url = make_url(to_asyncpg_url(settings.database_listen_url))
    elif settings.db_pgbouncer_transaction_mode:
        return None
    else:
        url = engine.url
    _, url_kwargs = engine.dialect.create_connect_args(url)
    return {
        **url_kwargs,
        "timeout": settings.db_connect_timeout_seconds,
        "server_settings": {"application_name": "context-memory-listen"},
    }


def _unnamed_statements() -> dict[str, object]:
    """The SQLAlchemy dialect's arguments for PgBouncer in transaction pooling mode
    (`DB_PGBOUNCER_TRANSACTION_MODE`), where consecutive transactions of one client connection
    run on different server connections and a server connection serves many clients.

    A named prepared statement lives on the server connection that parsed it: the next
    transaction may not find it, or another process's `__asyncpg_stmt_1__` is already there.
    So SQLAlchemy caches no statement and prepares each one unnamed; with asyncpg's
    `statement_cache_size=0` (set beside these) asyncpg parses an unnamed statement again in
    the round trip that executes it, so nothing depends on a statement that a previous
    round trip left on whichever server connection that was. The price: each statement
    costs one more round trip (prepare, then parse-bind-execute), and nothing piles up on the
    server. `statement_timeout` is not sent: PgBouncer refuses unknown startup parameters.
    """
    return {"prepared_statement_cache_size": 0, "prepared_statement_name_func": lambda: ""}
