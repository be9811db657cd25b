"""The readiness check of /readyz: the database reachable and writable, and its revision."""

from __future__ import annotations

from sqlalchemy import exc, text

from app.kit.db.engine import Database

# a server that cannot write (a standby, a primary fenced read-only) answers the readiness
# check with the error a write would meet, so the engine drops its connections the same way
_REFUSE_WHEN_READ_ONLY = text(
    "DO $$ BEGIN"
    " IF pg_is_in_recovery() OR current_setting('transaction_read_only')::bool THEN"
    "  RAISE EXCEPTION 'the database server accepts no writes'"
    "   USING ERRCODE = 'read_only_sql_transaction';"
    " END IF;"
    " END $$"
)


async def database_is_ready(db: Database) -> tuple[bool, str | None]:
    """(reachable and writable, current alembic revision) for /readyz. A server that cannot
    write raises SQLSTATE 25006: unavailable, and the engine's connections to it are dropped
    (`drop_refusing_connections`), so the next check connects to the writable host.

    A pooled connection the server ended while it sat idle (a restart, a terminated backend)
    is not an unreachable database: the engine then drops its pool, and the check is made once
    more on a fresh connection. Requests use their own pool, and the worker has its own engine,
    so nothing else may have found the dead connections before the probe does."""
    try:
        return await _check_readiness(db)
    except exc.DBAPIError as error:
        if not error.connection_invalidated:
            raise
    return await _check_readiness(db)


async def _check_readiness(db: Database) -> tuple[bool, str | None]:
    async with db.engine.connect() as conn:
        await conn.execute(_REFUSE_WHEN_READ_ONLY)
        revision = (
            await conn.execute(text("SELECT version_num FROM alembic_version LIMIT 1"))
        ).scalar_one_or_none()
    return True, revision
