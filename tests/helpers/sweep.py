"""Test reads that look at every company at once (a whole-table count, a sweep of the schema):
on a Citus cluster they reach every shard, so they run inside `across_companies`, as the
service's own such statements do; on plain PostgreSQL they are plain reads."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from sqlalchemy import text

from app.kit.citus import across_companies
from tests.helpers.db import sessions


async def every_row(app: FastAPI, sql: str, **params: Any) -> list[Any]:
    async with sessions(app)() as session, session.begin(), across_companies(session):
        return list((await session.execute(text(sql), params)).all())


async def every_count(app: FastAPI, sql: str, **params: Any) -> Any:
    async with sessions(app)() as session, session.begin(), across_companies(session):
        return (await session.execute(text(sql), params)).scalar_one()
