"""Fixtures of the client tests: a client over ASGI on the test app, an app with its worker
running, the service served by uvicorn on a free port (for the sync client and the doc
examples), a front that answers chosen requests itself before the served app, and the company
flag and space switch that turn context memory on."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import uvicorn
from context_memory_client import (
    FLAG_CONTEXT_MEMORY,
    NO_RETRIES,
    AsyncMemoryClient,
    CompanyIn,
    MemoryClient,
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
from tests.helpers.polling import wait_until_sync

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
        await operator.create_company(CompanyIn(COMPANY))
        await operator.set_feature_flag(COMPANY, FLAG_CONTEXT_MEMORY, enabled=True)
        await admin.update_space(space, SpacePatch(context_memory=True))


def enable_memory_over_http(url: str, make_token: TokenFactory) -> None:
    """The same as `enable_memory`, with blocking clients over real HTTP."""
    with MemoryClient(url, make_token("olga", "platform", OPERATOR)) as operator:
        operator.create_company(CompanyIn(COMPANY))
        operator.set_feature_flag(COMPANY, FLAG_CONTEXT_MEMORY, enabled=True)
    with MemoryClient(url, make_token("sam", COMPANY, SPACE_ADMIN)) as admin:
        admin.update_space(SPACE, SpacePatch(context_memory=True))


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
    with serve_in_thread(create_app(make_settings(database_url, worker_enabled=True))) as url:
        yield url


@contextlib.contextmanager
def serve_in_thread(app: Any) -> Iterator[str]:
    """The ASGI `app` (lifespan included) served over real HTTP by uvicorn in a thread of its
    own until the block ends; yields its base URL."""
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()

    def started() -> bool:
        assert thread.is_alive(), "uvicorn stopped while starting"
        return server.started

    wait_until_sync(started, 30, what="uvicorn started")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@dataclass(frozen=True)
class Answer:
    """What the front answers in place of the app: a status, a body (JSON, or bytes sent as
    they are) and headers."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


def problem(slug: str, status: int, title: str, **members: Any) -> dict[str, Any]:
    """A problem document as the service renders it."""
    return {
        "type": f"urn:context-memory:problem:{slug}",
        "title": title,
        "status": status,
        "detail": f"The front answered {slug}.",
        "request_id": "front",
        **members,
    }


class Front:
    """An ASGI front of `app`: the first requests to a path ending in `suffix` get `answers`, one
    each and in order; every other request goes to the app. The headers of every request to
    that path are recorded (lower-case names), those the front answered and those it passed."""

    def __init__(self, app: FastAPI, suffix: str, answers: list[Answer]) -> None:
        self.app, self.suffix, self.answers = app, suffix, answers
        self.requests: list[dict[str, str]] = []

    @property
    def keys(self) -> list[str | None]:
        """The `Idempotency-Key` of each request to the path."""
        return [headers.get("idempotency-key") for headers in self.requests]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].endswith(self.suffix):
            self.requests.append({k.decode(): v.decode() for k, v in scope["headers"]})
            if len(self.requests) <= len(self.answers):
                await self._answer(self.answers[len(self.requests) - 1], send)
                return
        await self.app(scope, receive, send)

    @staticmethod
    async def _answer(answer: Answer, send: Any) -> None:
        kind = "application/problem+json" if answer.status >= 400 else "application/json"
        headers = [(b"content-type", kind.encode())]
        headers += [(k.lower().encode(), v.encode()) for k, v in answer.headers.items()]
        await send({"type": "http.response.start", "status": answer.status, "headers": headers})
        body = answer.body if isinstance(answer.body, bytes) else json.dumps(answer.body).encode()
        await send({"type": "http.response.body", "body": body})


@contextlib.contextmanager
def served_front(
    database_url: str, make_token: TokenFactory, suffix: str, answers: list[Answer]
) -> Iterator[tuple[Front, str]]:
    """The app behind a `Front` served over real HTTP, context memory switched on for the
    space; yields the front (what it saw) and the URL to call."""
    front = Front(create_app(make_settings(database_url)), suffix, answers)
    with serve_in_thread(front) as url:
        enable_memory_over_http(url, make_token)
        yield front, url
