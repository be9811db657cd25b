"""Fixtures of the client tests: a client over ASGI on the test app, an app with its worker
running, the service served by uvicorn on a free port (for the sync client and the doc
examples), and the company flag and space switch that turn context memory on."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator

import httpx
import pytest
import uvicorn
from context_memory_client import (
    FLAG_CONTEXT_MEMORY,
    NO_RETRIES,
    AsyncMemoryClient,
    RetryPolicy,
    SpacePatch,
)
from fastapi import FastAPI

from app.main import create_app
from tests.helpers.apps import (
    COMPANY,
    OPERATOR,
    SPACE,
    SPACE_ADMIN,
    TokenFactory,
    app_with,
    make_settings,
)

BASE_URL = "http://testserver"
ClientFactory = Callable[..., AsyncMemoryClient]


def async_client_of(
    app: httpx.AsyncBaseTransport | FastAPI,
    token: str | Callable[[], str],
    retry: RetryPolicy = NO_RETRIES,
) -> AsyncMemoryClient:
    transport = app if isinstance(app, httpx.AsyncBaseTransport) else httpx.ASGITransport(app)
    return AsyncMemoryClient(BASE_URL, token, transport=transport, retry=retry)


async def enable_memory(
    transport: httpx.AsyncBaseTransport, make_token: TokenFactory, space: str = SPACE
) -> None:
    """The operator switches the feature on for the company, the space admin for the space."""
    operator = AsyncMemoryClient(
        BASE_URL, make_token("olga", "platform", OPERATOR), transport=transport
    )
    admin = AsyncMemoryClient(
        BASE_URL, make_token("sam", COMPANY, SPACE_ADMIN), transport=transport
    )
    async with operator, admin:
        await operator.set_feature_flag(COMPANY, FLAG_CONTEXT_MEMORY, enabled=True)
        await admin.update_space(space, SpacePatch(context_memory=True))


@pytest.fixture
async def worker_app(database_url: str) -> AsyncIterator[FastAPI]:
    """The app with its in-process consolidation worker running."""
    async with app_with(database_url, worker_enabled=True) as application:
        yield application


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture
def served_url(database_url: str) -> Iterator[str]:
    """The service (with its worker) served over real HTTP by uvicorn in a thread of its own."""
    port = _free_port()
    app = create_app(make_settings(database_url, worker_enabled=True))
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive(), "uvicorn stopped while starting"
        assert time.monotonic() < deadline, "uvicorn did not start in time"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
