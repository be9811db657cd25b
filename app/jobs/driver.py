"""The worker's statements straight on the asyncpg connection under one of the engine's pooled
connections: positional arguments, prepared once per connection by asyncpg's statement cache
(none behind PgBouncer in transaction mode, where the engine connects with
`statement_cache_size=0`), rows read as records. No statement compilation, no session.

For the statements the worker runs on every claim (the claim itself, the read step). The
engine's connections carry SQLAlchemy's JSON codecs, so `jsonb` columns read as Python values.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine

from app.kit.db.driver_pool import positional
from app.kit.db.errors import connection_is_spent


@asynccontextmanager
async def driver_connection(engine: AsyncEngine) -> AsyncIterator[asyncpg.Connection]:
    """The asyncpg connection of one of the engine's pooled connections, outside any
    transaction (each statement is its own). SQLAlchemy starts no transaction on it; one the
    caller leaves open is rolled back by asyncpg's `transaction()` block, never committed.

    A connection found broken, or a server gone or unable to write, is handled as SQLAlchemy
    handles a disconnect of its own statements (and the engine's `handle_error` hook a refusing
    server): every connection the pool opened until now is discarded at its next checkout, not
    just this one. After a restart or a failover they all point at a server that is gone; left
    in the pool, each would fail one more claim or read."""
    async with engine.connect() as pooled:
        raw = await pooled.get_raw_connection()
        conn: asyncpg.Connection = raw.driver_connection
        try:
            yield conn
        except Exception as error:
            if connection_is_spent(conn, error):
                engine.sync_engine.pool._invalidate(raw, error)  # what a disconnect does
            raise


@asynccontextmanager
async def driver_transaction(engine: AsyncEngine) -> AsyncIterator[asyncpg.Connection]:
    """`driver_connection` in one READ COMMITTED transaction, committed when the block ends."""
    async with driver_connection(engine) as conn, conn.transaction(isolation="read_committed"):
        yield conn


class Statement:
    """SQL written with `:name` parameters, sent with asyncpg's positional ones."""

    def __init__(self, text: str) -> None:
        self.sql, self._names = positional(text)

    def args(self, **values: object) -> list[object]:
        """The arguments in the statement's order (a name used twice is one argument)."""
        return [values[name] for name in self._names]
