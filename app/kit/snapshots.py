"""A response streamed from one consistent read of the database: a REPEATABLE READ, READ ONLY
transaction on a connection of its own, held while the client reads and ended however the
response ends (sent, failed half-way, or the client gone)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping

import anyio
from sqlalchemy.ext.asyncio import AsyncConnection
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from app.kit.db import Database


async def begin_snapshot(database: Database) -> AsyncConnection:
    """A pool connection in a REPEATABLE READ, READ ONLY transaction: every statement on it
    sees the database as of its first one, whatever is committed meanwhile. The caller must
    `end_snapshot` it (a `SnapshotStream` does)."""
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


class SnapshotStream(StreamingResponse):
    """`chunks` streamed to the client; when the response ends, however it ends, the chunks are
    closed and `close` (which ends the snapshot) is awaited, shielded from cancellation."""

    def __init__(
        self,
        chunks: AsyncGenerator[bytes],
        close: Callable[[], Awaitable[None]],
        *,
        media_type: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._chunks = chunks
        self._close = close
        super().__init__(chunks, media_type=media_type, headers=headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await self._chunks.aclose()
                finally:
                    await self._close()
