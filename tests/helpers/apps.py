"""The app under test: its settings, the identities tests act as, the token and header factories'
types, and apps built with other settings on the same database."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Protocol

import httpx
from asgi_lifespan import LifespanManager
from fastapi import FastAPI
from pydantic import SecretStr

from app.kit.config import Settings
from app.main import create_app

TEST_JWT_SECRET = "test-secret-" + "x" * 32
COMPANY = "acme"
SPACE = "space-1"
USER = "alice"
OPERATOR = ("operator",)
SPACE_ADMIN = ("space_admin",)


def make_settings(database_url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "environment": "test",
        "database_url": database_url,
        "jwt_secret": SecretStr(TEST_JWT_SECRET),
        # tests act as operators with static tokens (outside development JWT_PLATFORM is off
        # unless set)
        "jwt_platform": True,
        "worker_enabled": False,
        "llm_provider": "rules",
        "db_pool_size": 5,
        "db_connect_timeout_seconds": 2.0,
        # no periodic write of the usage counts during a test (a test flushes them itself):
        # tests comparing the whole database before and after a request stay exact
        "usage_flush_seconds": 86_400,
    }
    values.update(overrides)
    return Settings(_env_file=None, **values)


class TokenFactory(Protocol):
    def __call__(
        self,
        sub: str = "alice",
        company: str = "acme",
        roles: tuple[str, ...] = (),
        **claims: Any,
    ) -> str: ...


class AuthFactory(Protocol):
    def __call__(
        self, sub: str = "alice", company: str = "acme", roles: tuple[str, ...] = ()
    ) -> dict[str, str]: ...


@asynccontextmanager
async def client_of(
    app: FastAPI, base_url: str = "http://testserver"
) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client that calls the app in process, over ASGI."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=base_url) as http:
        yield http


@asynccontextmanager
async def app_with(database_url: str, **overrides: Any) -> AsyncIterator[FastAPI]:
    """A second app built with other settings (same database), its lifespan running."""
    application = create_app(make_settings(database_url, **overrides))
    async with LifespanManager(application):
        yield application


@asynccontextmanager
async def client_with(database_url: str, **overrides: Any) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client on a second app built with other settings (same database)."""
    async with app_with(database_url, **overrides) as application, client_of(application) as http:
        yield http
