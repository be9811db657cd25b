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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from sqlalchemy import MetaData, Table, text
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

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
