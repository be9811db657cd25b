"""One consistent read of the database: a REPEATABLE READ, READ ONLY transaction on a
connection of its own, read into a spool (`app.kit.spool`) and ended as soon as it is read, or
however the response ends first (failed half-way, or the client gone)."""

from __future__ import annotations

import anyio
from sqlalchemy.ext.asyncio import AsyncConnection

from app.kit.db.engine import Database


async def begin_snapshot(database: Database) -> AsyncConnection:
    """A pool connection in a REPEATABLE READ, READ ONLY transaction: every statement on it
    sees the database as of its first one, whatever is committed meanwhile. The caller must
    `end_snapshot` it (a `SpooledResponse` does)."""
    connection = await database.engine.connect()
    try:
        await connection.execution_options(
            isolation_level="REPEATABLE READ", postgresql_readonly=True
        )
        await connection.begin()
    except BaseException:
        await connection.close()
        raise
    return connection


async def end_snapshot(connection: AsyncConnection) -> None:
    """End the transaction (releasing its transaction-level locks) and give the connection
    back; a broken one is invalidated so the pool does not hand it out again. Shielded: a
    client that went away cancels the response, not this."""
    with anyio.CancelScope(shield=True):
        try:
            await connection.rollback()  # read only: nothing to keep
        except Exception:
            await connection.invalidate()
        finally:
            await connection.close()
