"""The schema on a Citus cluster: every company table distributed by `company_id`, co-located,
the other tables (`alembic_version` included) reference tables, copied to every node.

`distribute` is what `python -m app distribute` runs, and `python -m app migrate` after Alembic's
upgrade: on a database without the `citus` extension (plain PostgreSQL, the embedded default) it
does nothing. It reads which tables are company tables from the models' metadata (each table with
a `company_id` column), never from a list that could drift from them, and it is idempotent: a
table Citus already distributes is left as it is, so a migration that adds a table is followed by
a run that distributes that one only.

Order: reference tables first (a company table may reference one), then the company tables
parents first (`MetaData.sorted_tables`: a foreign key between company tables includes
`company_id`, so both ends are co-located), each co-located with the first.

At run time: `runs_citus` tells (once per engine) whether a statement's Citus variant is needed,
and `across_companies` surrounds the few statements that must reach every company's shard
(docs/scaling.md lists them).
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Final

from sqlalchemy import MetaData, Table, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, create_async_engine

DISTRIBUTION_COLUMN: Final = "company_id"
VERSION_TABLE: Final = "alembic_version"


@dataclass(frozen=True)
class Plan:
    """Which table becomes what, in the order it is done."""

    reference: tuple[str, ...]
    distributed: tuple[str, ...]


@dataclass
class Outcome:
    """What a run did: whether the database runs Citus, and the tables it changed."""

    citus: bool
    referenced: list[str] = field(default_factory=list)
    distributed: list[str] = field(default_factory=list)


def company_tables(metadata: MetaData) -> tuple[Table, ...]:
    """The tables with a `company_id` column, parents first."""
    return tuple(t for t in metadata.sorted_tables if DISTRIBUTION_COLUMN in t.columns)


def plan(metadata: MetaData) -> Plan:
    companies = company_tables(metadata)
    others = [t.name for t in metadata.sorted_tables if t not in companies]
    return Plan((*others, VERSION_TABLE), tuple(t.name for t in companies))


async def is_citus(conn: AsyncConnection) -> bool:
    """Whether the connected database has the `citus` extension."""
    found = await conn.scalar(text("SELECT true FROM pg_extension WHERE extname = 'citus'"))
    return bool(found)


async def distribute(url: str, metadata: MetaData) -> Outcome:
    """Distribute the company tables and replicate the others on the Citus coordinator at
    `url` (`postgresql+asyncpg://`); a no-op without the extension."""
    engine = create_async_engine(url, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            return await _distribute(conn, plan(metadata))
    finally:
        await engine.dispose()


async def _distribute(conn: AsyncConnection, todo: Plan) -> Outcome:
    if not await is_citus(conn):
        return Outcome(citus=False)
    if not await conn.scalar(text("SELECT citus_is_coordinator()")):
        raise RuntimeError("distribute runs on the Citus coordinator, not on a worker node")
    rows = await conn.execute(
        text(
            "SELECT logicalrelid::regclass::text, partmethod::text FROM pg_dist_partition"
            " WHERE logicalrelid::regclass::text = ANY(:tables)"
        ),
        {"tables": [*todo.reference, *todo.distributed]},
    )
    done = {name.strip('"'): method for name, method in rows}
    outcome = Outcome(citus=True)
    for name in todo.reference:
        if name not in done:
            await conn.execute(text("SELECT create_reference_table(:t)"), {"t": name})
            outcome.referenced.append(name)
    # the group: the first company table distributed already, else the first one
    anchor = next((name for name in todo.distributed if done.get(name) == "h"), None)
    for name in todo.distributed:
        if name in done:
            continue
        colocate = anchor or "none"
        anchor = anchor or name
        await conn.execute(
            text("SELECT create_distributed_table(:t, :column, colocate_with => :colocate)"),
            {"t": name, "column": DISTRIBUTION_COLUMN, "colocate": colocate},
        )
        outcome.distributed.append(name)
    return outcome


# --- statements that reach every company -------------------------------------------------------

ACROSS_COMPANIES_SQL: Final = "SET LOCAL citus.multi_task_query_log_level = 'off'"
BACK_TO_ONE_COMPANY_SQL: Final = "SET LOCAL citus.multi_task_query_log_level TO DEFAULT"
_ACROSS_COMPANIES: Final = text(ACROSS_COMPANIES_SQL)
_BACK_TO_ONE_COMPANY: Final = text(BACK_TO_ONE_COMPANY_SQL)


@asynccontextmanager
async def across_companies(conn: AsyncSession | AsyncConnection) -> AsyncIterator[None]:
    """Around the statements of a transaction that must reach every company's shard
    (housekeeping, gauges, an operator's edits found by the actor): on a Citus cluster whose
    sessions turn a multi-shard statement into an error (`citus.multi_task_query_log_level =
    'error'`, as the tests run the service), that level is lowered for them and restored after
    them, both transaction-local (`SET LOCAL`). On plain PostgreSQL nothing is sent (after the
    engine's one question, `runs_citus`). Each caller says why its statements reach every
    company."""
    engine = _engine_of(conn)
    on_citus = engine is not None and await runs_citus(engine)
    if on_citus:
        await conn.execute(_ACROSS_COMPANIES)
    yield
    if on_citus:
        await conn.execute(_BACK_TO_ONE_COMPANY)


def _engine_of(bind: object) -> AsyncEngine | None:
    if isinstance(bind, AsyncSession):
        bind = bind.bind
    if isinstance(bind, AsyncConnection):
        bind = bind.engine
    return bind if isinstance(bind, AsyncEngine) else None


_CITUS_ENGINES: Final[weakref.WeakKeyDictionary[AsyncEngine, bool]] = weakref.WeakKeyDictionary()


async def runs_citus(engine: AsyncEngine) -> bool:
    """Whether the engine's database has the `citus` extension: asked once per engine (the
    first caller's round trip), then remembered; a statement with a variant for a Citus
    coordinator picks it with this."""
    known = _CITUS_ENGINES.get(engine)
    if known is None:
        async with engine.connect() as conn:
            known = await is_citus(conn)
        _CITUS_ENGINES[engine] = known
        # read by the statements whose SQL differs on Citus when they are compiled (SQLAlchemy
        # caches compiled statements per engine, so per dialect instance)
        setattr(engine.dialect, _DIALECT_MARK, known)
    return known


_DIALECT_MARK: Final = "context_memory_citus"


def compiling_for_citus(dialect: object) -> bool:
    """In a `@compiles` function: whether the statement is compiled for an engine that
    `runs_citus` found on a Citus coordinator."""
    return bool(getattr(dialect, _DIALECT_MARK, False))


def known_citus(bind: object) -> bool:
    """What `runs_citus` found for the engine of `bind` (an engine, connection or session),
    without asking: False when it was never asked for that engine."""
    engine = _engine_of(bind)
    return engine is not None and _CITUS_ENGINES.get(engine, False)
