"""Database plumbing: declarative Base, the engine, the per-request transaction, migrations.

A request gets one transaction from `SessionDep`; it is committed after the route returns and
*before* the response is sent (`Depends(scope="function")`), so a failed commit can never reach
the client as a 2xx.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, ClassVar

import asyncpg
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from fastapi import Depends, Request
from sqlalchemy import DateTime, MetaData, exc, text
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import DeclarativeBase

from app.config import PROJECT_ROOT, Settings

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


@dataclass(frozen=True)
class Database:
    engine: AsyncEngine
    sessionmaker: async_sessionmaker[AsyncSession]

    async def dispose(self) -> None:
        await self.engine.dispose()


def create_database(url: str, settings: Settings) -> Database:
    engine = create_async_engine(
        url,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_max_overflow,
        pool_pre_ping=settings.db_pool_pre_ping,
        pool_timeout=settings.db_connect_timeout_seconds,
        connect_args={
            "timeout": settings.db_connect_timeout_seconds,
            "server_settings": {
                "application_name": "context-memory",
                "statement_timeout": str(settings.db_statement_timeout_ms),
            },
        },
    )
    return Database(engine, async_sessionmaker(engine, expire_on_commit=False))


def database(request: Request) -> Database:
    db: Database = request.app.state.database
    return db


async def _request_session(request: Request) -> AsyncIterator[AsyncSession]:
    """One transaction per request: commit on success, roll back on any error."""
    async with database(request).sessionmaker() as session, session.begin():
        yield session


SessionDep = Annotated[AsyncSession, Depends(_request_session, scope="function")]


_UNAVAILABLE_SQLSTATES = {"57P01", "57P02", "57P03", "08000", "08001", "08003", "08004", "08006"}


def is_database_unavailable(error: BaseException) -> bool:
    """True when `error` means the database cannot be reached (answered 503, not 500)."""
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
        if sqlstate in _UNAVAILABLE_SQLSTATES:
            return True
        if isinstance(current, exc.TimeoutError):  # pool exhausted while the database is down
            return True
        current = getattr(current, "orig", None) or current.__cause__ or current.__context__
    return False


async def database_is_ready(db: Database) -> tuple[bool, str | None]:
    """(reachable, current alembic revision) for /readyz."""
    async with db.engine.connect() as conn:
        revision = (
            await conn.execute(text("SELECT version_num FROM alembic_version LIMIT 1"))
        ).scalar_one_or_none()
    return True, revision


# --- migrations -------------------------------------------------------------------------------

ALEMBIC_INI = PROJECT_ROOT / "alembic.ini"


def alembic_config(url: str) -> Config:
    config = Config(str(ALEMBIC_INI))
    config.set_main_option("script_location", str(PROJECT_ROOT / "migrations"))
    config.attributes["database_url"] = url
    config.attributes["skip_logging"] = True  # keep the service's JSON logging configuration
    return config


def run_migrations(url: str, revision: str = "head") -> None:
    """Alembic upgrade (blocking: call it from a thread when an event loop is running)."""
    command.upgrade(alembic_config(url), revision)


def head_revision() -> str | None:
    script = ScriptDirectory.from_config(alembic_config("postgresql+asyncpg://unused/unused"))
    return script.get_current_head()


def migrations_dir() -> Path:
    return PROJECT_ROOT / "migrations"
