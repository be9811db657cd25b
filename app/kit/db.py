"""Database plumbing: declarative Base, the engine, the driver pool, migrations. Free of the
web framework: the worker runs on it alone. A request's transaction (`SessionDep`) is in
`app/kit/deps.py`; the two calls of every chat turn skip the session machinery: they run
prepared statements on a driver connection (`DriverPool`), see `app/turns/`.
"""

from __future__ import annotations

import ast
import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import asyncpg
from sqlalchemy import DateTime, MetaData, event, exc, make_url, text
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import DeclarativeBase

from app.kit.config import PROJECT_ROOT, Settings, to_asyncpg_url

if TYPE_CHECKING:
    from alembic.config import Config

    from app.kit.citus_reads import WorkerReads

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {datetime: DateTime(timezone=True)}


class DriverPool:
    """asyncpg connections for the hot path: no session, no ORM, statements prepared once per
    connection (asyncpg's statement cache; none behind PgBouncer in transaction mode, see
    `_unnamed_statements`) and run with positional arguments.

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
    event.listen(engine.sync_engine, "handle_error", _drop_refusing_connections)
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


def _drop_refusing_connections(context: ExceptionContext) -> None:
    """The engine's `handle_error` hook: a statement refused because the server cannot write
    (a standby, a server in recovery) or is shutting down counts as a disconnect, so SQLAlchemy
    discards the connection and every other one of its pool instead of handing them out again
    (they would all fail the same way until a restart); new ones go to the writable host."""
    if _server_refuses(context.original_exception):
        context.is_disconnect = True


def connection_is_spent(conn: asyncpg.Connection, error: BaseException) -> bool:
    """After `error` on `conn`: the connection, and every other one opened to the same server,
    is of no more use (closed under it, or its server refuses as `_server_refuses` says). The
    one rule of the driver pool and of the worker's statements on the engine's connections."""
    return conn.is_closed() or _server_refuses(error)


def _server_refuses(error: BaseException) -> bool:
    """`error` is a server's refusal that any statement on this connection would meet again:
    read-only (25006: a standby, or a demoted primary), going away (57P0x) or gone (08xxx)."""
    return getattr(error, "sqlstate", None) in _UNAVAILABLE_SQLSTATES


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


# the server is going away or gone, or cannot write (25006 read_only_sql_transaction: the host
# is a standby now; the next connection goes to the primary, see `_drop_refusing_connections`)
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


def is_database_unavailable(error: BaseException) -> bool:
    """True when `error` means the database cannot be reached, or cannot serve the statement for
    a moment (a Citus shard switched over under it): answered 503, not 500."""
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
        if sqlstate in _UNAVAILABLE_SQLSTATES or _citus_shard_switched(current):
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
    (`_drop_refusing_connections`), so the next check connects to the writable host.

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


# --- migrations -------------------------------------------------------------------------------
# Alembic is imported by the functions that run it: only `migrate` (and the embedded database's
# start) needs it, and it costs every process ~0.2 s of start-up.

ALEMBIC_INI = PROJECT_ROOT / "alembic.ini"


def alembic_config(url: str) -> Config:
    from alembic.config import Config  # noqa: PLC0415

    config = Config(str(ALEMBIC_INI))
    config.set_main_option("script_location", str(PROJECT_ROOT / "migrations"))
    config.attributes["database_url"] = url
    config.attributes["skip_logging"] = True  # keep the service's JSON logging configuration
    return config


def run_migrations(url: str, revision: str = "head") -> None:
    """Alembic upgrade (blocking: call it from a thread when an event loop is running)."""
    from alembic import command  # noqa: PLC0415

    command.upgrade(alembic_config(url), revision)


def head_revision(versions: Path | None = None) -> str | None:
    """The revision `migrate` upgrades to, as alembic's `ScriptDirectory.get_current_head()`
    gives it, read from the `revision` and `down_revision` assignments of the migration files
    in `versions` (default: the service's), parsed, not imported: no alembic, no module of
    theirs run. None without migrations; several heads are an error, as they are to alembic."""
    revisions: set[str] = set()
    revised: set[str] = set()
    for path in (versions or migrations_dir() / "versions").glob("*.py"):
        if path.name.startswith(("__init__", ".#")):  # the files alembic skips
            continue
        assigned = _module_constants(path, ("revision", "down_revision"))
        revision = assigned.get("revision")
        if not isinstance(revision, str):
            raise RuntimeError(f"{path.name}: no `revision` string")
        revisions.add(revision)
        down = assigned.get("down_revision")
        revised.update((down,) if isinstance(down, str) else down or ())
    heads = revisions - revised
    if len(heads) > 1:
        raise RuntimeError(f"the migrations have several heads: {', '.join(sorted(heads))}")
    return next(iter(heads), None)


def _module_constants(path: Path, names: tuple[str, ...]) -> dict[str, Any]:
    """The literal values assigned to `names` at the top level of the Python file `path`."""
    found: dict[str, Any] = {}
    for node in ast.parse(path.read_text(encoding="utf-8"), str(path)).body:
        targets: list[ast.expr]
        if isinstance(node, ast.AnnAssign):
            targets, value = [node.target], node.value
        elif isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        else:
            continue
        for target in targets:
            if value is not None and isinstance(target, ast.Name) and target.id in names:
                found[target.id] = ast.literal_eval(value)
    return found


def migrations_dir() -> Path:
    return PROJECT_ROOT / "migrations"
