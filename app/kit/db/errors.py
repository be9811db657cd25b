"""Which failures mean the database cannot serve for now (answered 503, not 500), and which
leave a connection, and every other one to the same server, of no more use."""

from __future__ import annotations

import asyncio

import asyncpg
from sqlalchemy import exc
from sqlalchemy.engine import ExceptionContext


def drop_refusing_connections(context: ExceptionContext) -> None:
    """The engine's `handle_error` hook: a statement refused because the server cannot write
    (a standby, a server in recovery) or is shutting down counts as a disconnect, so SQLAlchemy
    discards the connection and every other one of its pool instead of handing them out again
    (they would all fail the same way until a restart); new ones go to the writable host."""
    if server_refuses(context.original_exception):
        context.is_disconnect = True


def connection_is_spent(conn: asyncpg.Connection, error: BaseException) -> bool:
    """After `error` on `conn`: the connection, and every other one opened to the same server,
    is of no more use (closed under it, or its server refuses as `server_refuses` says). The
    one rule of the driver pool and of the worker's statements on the engine's connections."""
    return conn.is_closed() or server_refuses(error)


def server_refuses(error: BaseException) -> bool:
    """`error` is a server's refusal that any statement on this connection would meet again:
    read-only (25006: a standby, or a demoted primary), going away (57P0x) or gone (08xxx)."""
    return getattr(error, "sqlstate", None) in _UNAVAILABLE_SQLSTATES


# the server is going away or gone, or cannot write (25006 read_only_sql_transaction: the host
# is a standby now; the next connection goes to the primary, see `drop_refusing_connections`)
_UNAVAILABLE_SQLSTATES = {
    "57P01",
    "57P02",
    "57P03",
    "08000",
    "08001",
    "08003",
    "08004",
    "08006",
    "25006",
}


# Citus, while an online shard operation switches a shard group over (a tenant isolation's
# split, a move): a statement planned against the shards of before and run after the switch
# finds its shard gone from the metadata. Nothing was written; the same statement, sent again,
# is planned against the new shards (tests/citus/test_online_operations.py)
_CITUS_SHARD_SWITCHED = ("could not find valid entry for shard",)


def _citus_shard_switched(error: BaseException) -> bool:
    if getattr(error, "sqlstate", None) != "XX000":
        return False
    message = str(getattr(error, "message", None) or error)
    return message.startswith(_CITUS_SHARD_SWITCHED)


# The server cancelled the statement (57014 query_canceled): it ran past `statement_timeout`
# (`DB_STATEMENT_TIMEOUT_MS`), most often waiting for a lock another transaction holds, such as
# a Citus shard move blocking a company's writes while it switches them over, or an operator
# cancelled it. Its transaction is rolled back whole: nothing of it was written.
_STATEMENT_CANCELLED = "57014"


def is_database_unavailable(error: BaseException) -> bool:
    """True when `error` means the database cannot be reached, or cannot serve the statement for
    a moment (a Citus shard switched over under it, or the statement ran out of its time):
    answered 503 with `Retry-After`, not 500. Never a reason to drop a connection
    (`server_refuses` is)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, exc.DBAPIError) and current.connection_invalidated:
            return True
        if isinstance(
            current,
            OSError
            | TimeoutError
            | asyncio.TimeoutError
            | asyncpg.exceptions.ConnectionDoesNotExistError
            | asyncpg.exceptions.CannotConnectNowError
            | asyncpg.exceptions.InterfaceError,
        ) and not isinstance(current, asyncpg.exceptions.InterfaceWarning):
            return True
        sqlstate = getattr(current, "sqlstate", None)
        if (
            sqlstate in _UNAVAILABLE_SQLSTATES
            or sqlstate == _STATEMENT_CANCELLED
            or _citus_shard_switched(current)
        ):
            return True
        if isinstance(current, exc.TimeoutError):  # pool exhausted while the database is down
            return True
        if isinstance(current, asyncpg.exceptions.InternalClientError):
            # asyncpg's protocol state broke under the statement: seen when the server ended an
            # idle pooled session (pg_terminate_backend, a failover) and the FATAL it sent was
            # read before the connection closed; the next connection is fine. Also
            # TargetServerAttributeNotMatched: no host of the URL is writable (yet)
            return True
        current = getattr(current, "orig", None) or current.__cause__ or current.__context__
    return False
