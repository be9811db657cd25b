"""Test reads that look at every company at once (a whole-table count, a sweep of the schema):
on a Citus cluster they reach every shard, so they run inside `across_companies`, as the
service's own such statements do; on plain PostgreSQL they are plain reads."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from sqlalchemy import text

from app.kit.citus import across_companies
from tests.helpers.db import rows, sessions


async def every_row(app: FastAPI, sql: str, **params: Any) -> list[Any]:
    async with sessions(app)() as session, session.begin(), across_companies(session):
        return list((await session.execute(text(sql), params)).all())


async def every_count(app: FastAPI, sql: str, **params: Any) -> Any:
    async with sessions(app)() as session, session.begin(), across_companies(session):
        return (await session.execute(text(sql), params)).scalar_one()


_COLUMNS = (
    "SELECT c.table_name, c.column_name, c.data_type FROM information_schema.columns c"
    " JOIN information_schema.tables t"
    "   ON t.table_schema = c.table_schema AND t.table_name = c.table_name"
    " WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE'"
    "   AND c.table_name <> 'alembic_version'"
    " ORDER BY c.table_name, c.ordinal_position"
)


async def schema_columns(app: FastAPI) -> dict[str, tuple[tuple[str, str], ...]]:
    """Every table of the schema (but Alembic's) with its columns and their types, in order:
    what a sweep of the whole schema reads, discovered rather than listed, so that a table a
    migration adds is swept too."""
    tables: dict[str, list[tuple[str, str]]] = {}
    for row in await rows(app, _COLUMNS):
        tables.setdefault(row.table_name, []).append((row.column_name, row.data_type))
    return {name: tuple(columns) for name, columns in tables.items()}
