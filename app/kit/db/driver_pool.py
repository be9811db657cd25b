"""The hot path's database access: asyncpg connections without a session (`DriverPool`), and
its statements written as `text()` is and sent with positional arguments (`positional`). The
two calls of every chat turn run on it, see `app/turns/`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
from sqlalchemy import make_url, text

from app.kit.db.errors import connection_is_spent


class DriverPool:
    """asyncpg connections for the hot path: no session, no ORM, statements prepared once per
    connection (asyncpg's statement cache; none behind PgBouncer in transaction mode, see
    `_unnamed_statements` in `app/kit/db/engine.py`) and run with positional arguments.

    Created empty; connections are opened on first use, up to `DB_HOT_POOL_SIZE`, with the
    engine's connect arguments (same servers, `target_session_attrs`, timeouts and
    `application_name`). A statement that finds its connection broken (database restarted,
    primary lost) or its server unable to write (a standby: SQLSTATE 25006) discards that
    connection and expires the others, which point at the same server: the failure is one 503
    and the next request connects afresh, to whichever host is the primary by then.

    Requests wait for a connection in arrival order (`asyncio.Semaphore` hands its slots out
    first come, first served), not in asyncpg's queue, where a request that just arrived can
    take a released connection before one woken to take it, which sends the woken one to the
    back of the line: under more concurrent requests than connections that unfairness is the
    latency tail.

    Released connections skip asyncpg's session reset (`pg_advisory_unlock_all(); CLOSE ALL;
    UNLISTEN *; RESET ALL`, one round trip per request): the hot path leaves no session state
    behind (transaction-level advisory locks only, no cursors, no LISTEN, no SET), which
    `tests/test_statement_routing.py` holds over every statement the tests see it send. An open
    transaction is still rolled back by asyncpg before the connection is reused.
    """

    def __init__(self, connect_kwargs: Mapping[str, object], *, max_size: int, timeout: float):
        self._connect_kwargs = dict(connect_kwargs)
        self._max_size = max_size
        self._timeout = timeout
        self._pool: asyncpg.Pool | None = None
        self._opening = asyncio.Lock()
        self._turns = asyncio.Semaphore(max_size)
        self._query_loggers: list[Callable[[Any], object]] = []

    async def _opened(self) -> asyncpg.Pool:
        if self._pool is None:
            async with self._opening:
                if self._pool is None:
                    self._pool = await asyncpg.create_pool(
                        min_size=0,
                        max_size=self._max_size,
                        reset=_no_session_state,
                        **self._connect_kwargs,
                    )
        return self._pool

    @property
    def connect_kwargs(self) -> Mapping[str, object]:
        """asyncpg's arguments for a connection to the same server, opened the same way."""
        return self._connect_kwargs

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[asyncpg.Connection]:
        """A connection for one request; waiting longer than the connect timeout for one is a
        `TimeoutError` (answered 503, like a pool exhausted while the database is down)."""
        pool = self._pool or await self._opened()
        async with asyncio.timeout(self._timeout):
            await self._turns.acquire()
        try:
            async with pool.acquire(timeout=self._timeout) as conn:
                try:
                    async with self._logged(conn):
                        yield conn
                except Exception as error:
                    if connection_is_spent(conn, error):
                        conn.terminate()
                        await pool.expire_connections()
                    raise
        finally:
            self._turns.release()

    @asynccontextmanager
    async def _logged(self, conn: asyncpg.Connection) -> AsyncIterator[None]:
        """The query loggers registered now, on `conn` until the block ends."""
        loggers = list(self._query_loggers)
        for logger in loggers:
            conn.add_query_logger(logger)
        try:
            yield
        finally:
            for logger in loggers:
                conn.remove_query_logger(logger)

    def add_query_logger(self, logger: Callable[[Any], object]) -> None:
        """Call `logger` with asyncpg's `LoggedQuery` for every statement (BEGIN and COMMIT
        included) of the connections handed out from now on, until removed."""
        self._query_loggers.append(logger)

    def remove_query_logger(self, logger: Callable[[Any], object]) -> None:
        self._query_loggers.remove(logger)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None


async def _no_session_state(conn: asyncpg.Connection) -> None:
    """The pool's reset step: nothing to undo (see `DriverPool`)."""


def positional(sql: str) -> tuple[str, tuple[str, ...]]:
    """`sql` with its `:name` parameters turned into asyncpg's `$1, $2, ...`, and the names in
    argument order (a name used twice is one argument), as SQLAlchemy compiles a `text()` for
    the asyncpg dialect. Call it once per statement, when its module is imported.

    `text()`'s rules hold: `:name` is a parameter wherever it stands, string literals included,
    unless its colon follows a letter, a digit or another colon (`'10:30'`, `NULL::text[]`);
    `\\:` writes a colon that is none (`'\\:at'` sends `':at'`). One addition: `text()` takes
    no name followed by `::` either, which would leave `:since::timestamptz` unbound, so every
    `::` is escaped first; it comes out as the cast it was."""
    compiled = text(sql.replace("::", r"\:\:")).compile(dialect=_ASYNCPG)
    return compiled.string, tuple(compiled.positiontup or ())


_ASYNCPG = make_url("postgresql+asyncpg://").get_dialect()()  # the dialect create_database uses
