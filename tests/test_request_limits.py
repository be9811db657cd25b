"""Requests bounded at the ASGI level, wherever the app runs: too many or too large header
fields are a 431 before any route or token check; a body that does not arrive in time is a
408 (and the connection is closed); a client that goes away mid-body is counted and logged as
499, not as an unhandled 500.

The body cases call the app as the server does, with a `receive` that delivers part of the
body and then stalls or reports the disconnect.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, MutableMapping
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI

from app.kit.observability import Metrics
from app.profiles.document import Section
from tests.helpers.apps import COMPANY, SPACE, USER, AuthFactory, app_with, client_of
from tests.helpers.metrics import sample
from tests.helpers.profiles import memory_md

PROBLEM = "application/problem+json"
BODY_TIMEOUT = 0.5
TURN_PATH = "/v1/chats/chat-1/turns"
MEMORY_PATH = "/v1/me/memory"


@pytest.fixture(scope="module")
async def limited_app(database_url: str) -> AsyncIterator[FastAPI]:
    """The app with a short body timeout and small header limits."""
    async with app_with(
        database_url,
        request_body_timeout_seconds=BODY_TIMEOUT,
        max_request_headers=20,
        max_request_header_bytes=4096,
    ) as app:
        yield app


def metrics_of(app: FastAPI) -> Metrics:
    metrics: Metrics = app.state.metrics
    return metrics


def answered(app: FastAPI, method: str, route: str, status: int) -> float:
    return sample(
        metrics_of(app),
        "http_request_duration_seconds_count",
        method=method,
        route=route,
        status=str(status),
    )


# --- header fields -------------------------------------------------------------------------------


async def test_too_many_header_fields_are_a_431_before_the_token_is_checked(
    limited_app: FastAPI,
) -> None:
    async with client_of(limited_app) as client:
        base = len(client.build_request("GET", "/v1/me").headers)
        at_limit = {f"x-filler-{n}": "x" for n in range(20 - base)}
        allowed = await client.get("/v1/me", headers=at_limit)
        assert allowed.status_code == 401  # through to the token check

        before = answered(limited_app, "GET", "unmatched", 431)
        over = await client.get("/v1/me", headers={**at_limit, "x-one-more": "x"})
    assert over.status_code == 431
    assert over.headers["content-type"] == PROBLEM
    assert over.headers["connection"] == "close"
    assert "www-authenticate" not in over.headers  # no route, no token check ran
    body = over.json()
    assert body["title"] == "Request header fields too large"
    assert body["type"].endswith(":header-fields-too-large")
    assert "more than 20 header fields" in body["detail"]
    assert body["request_id"] == over.headers["x-request-id"]
    assert answered(limited_app, "GET", "unmatched", 431) == before + 1


async def test_header_fields_over_the_byte_limit_are_a_431(limited_app: FastAPI) -> None:
    async with client_of(limited_app) as client:
        head = client.build_request("GET", "/v1/me")
        used = len(b"GET /v1/me HTTP/1.1\r\n") + 2
        used += sum(len(k) + len(v) + 4 for k, v in head.headers.raw)
        name = b"x-pad"
        room = 4096 - used - (len(name) + 4)
        fits = await client.get("/v1/me", headers={"x-pad": "a" * room})
        assert fits.status_code == 401
        over = await client.get("/v1/me", headers={"x-pad": "a" * (room + 1)})
        long_url = await client.get("/v1/me", params={"q": "a" * 4096})
    assert over.status_code == 431
    assert "exceed 4096 bytes" in over.json()["detail"]
    assert long_url.status_code == 431  # the request line counts too


async def test_the_default_limits_refuse_200_kb_of_headers(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    many = {f"x-filler-{n}": "x" * 2000 for n in range(100)}
    answer = await client.get("/v1/me", headers={**auth(), **many})
    assert answer.status_code == 431
    token_sized = await client.get("/v1/me", headers={**auth(), "x-pad": "a" * 8000})
    assert token_sized.status_code == 200


# --- the body, called as the server calls the app ----------------------------------------------

Receive = Callable[[], Any]


class Call:
    """One request to the app: what it sent back, and how long it took."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.seconds = 0.0

    @property
    def status(self) -> int | None:
        starts = [m for m in self.messages if m["type"] == "http.response.start"]
        return int(starts[0]["status"]) if starts else None

    @property
    def headers(self) -> dict[bytes, bytes]:
        starts = [m for m in self.messages if m["type"] == "http.response.start"]
        return dict(starts[0]["headers"]) if starts else {}

    @property
    def body(self) -> dict[str, Any]:
        chunks = [m.get("body", b"") for m in self.messages if m["type"] == "http.response.body"]
        parsed: dict[str, Any] = orjson.loads(b"".join(chunks))
        return parsed


async def call(
    app: FastAPI,
    method: str,
    path: str,
    headers: dict[str, str],
    receive: Receive,
) -> Call:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }
    result = Call()

    async def send(message: MutableMapping[str, Any]) -> None:
        result.messages.append(dict(message))

    started = time.monotonic()
    await asyncio.wait_for(app(scope, receive, send), timeout=10)
    result.seconds = time.monotonic() - started
    return result


def partial_then(*after: dict[str, Any] | None, part: bytes) -> Receive:
    """A receive that delivers `part` (more to come), then each of `after` (None: stalls
    until cancelled, as a client that stopped sending)."""
    queue: list[dict[str, Any] | None] = [
        {"type": "http.request", "body": part, "more_body": True},
        *after,
    ]

    async def receive() -> dict[str, Any]:
        message = queue.pop(0) if queue else None
        if message is None:
            await asyncio.Event().wait()
        assert message is not None
        return message

    return receive


def turn_json() -> bytes:
    return orjson.dumps(
        {
            "space_id": SPACE,
            "messages": [{"role": "user", "content": "I moved to Lyon."}],
            "response": {"role": "assistant", "content": "Noted."},
        }
    )


def memory_json() -> bytes:
    return orjson.dumps({"content": memory_md({Section.WORK: ["Writes the report."]})})


ROUTES = [
    ("POST", TURN_PATH, "/v1/chats/{chat_id}/turns", turn_json),
    ("PUT", MEMORY_PATH, MEMORY_PATH, memory_json),
]


@pytest.mark.parametrize(("method", "path", "template", "body"), ROUTES)
async def test_a_body_that_stops_arriving_is_a_408_and_closes_the_connection(
    limited_app: FastAPI,
    auth: AuthFactory,
    *,
    method: str,
    path: str,
    template: str,
    body: Callable[[], bytes],
) -> None:
    whole = body()
    headers = {
        **auth(USER, COMPANY),
        "content-type": "application/json",
        "content-length": str(len(whole)),
        "if-none-match": "*",
    }
    before = answered(limited_app, method, template, 408)
    result = await call(limited_app, method, path, headers, partial_then(None, part=whole[:10]))

    assert result.status == 408
    assert result.headers[b"content-type"] == PROBLEM.encode()
    assert result.headers[b"connection"] == b"close"
    assert result.body["title"] == "Request timeout"
    assert BODY_TIMEOUT <= result.seconds < BODY_TIMEOUT + 2
    assert sum(m["type"] == "http.response.start" for m in result.messages) == 1
    assert answered(limited_app, method, template, 408) == before + 1


async def test_a_chunked_body_that_stops_arriving_is_a_408(
    limited_app: FastAPI, auth: AuthFactory
) -> None:
    headers = {**auth(), "content-type": "application/json", "transfer-encoding": "chunked"}
    receive = partial_then(None, part=memory_json()[:10])
    result = await call(limited_app, "PUT", MEMORY_PATH, headers, receive)
    assert result.status == 408


async def test_a_body_that_arrives_in_time_is_served(
    limited_app: FastAPI, auth: AuthFactory
) -> None:
    whole = memory_json()
    headers = {
        **auth("bob"),
        "content-type": "application/json",
        "content-length": str(len(whole)),
        "if-none-match": "*",
    }

    async def slow_but_in_time() -> dict[str, Any]:
        await asyncio.sleep(BODY_TIMEOUT / 4)
        return {"type": "http.request", "body": whole, "more_body": False}

    result = await call(limited_app, "PUT", MEMORY_PATH, headers, slow_but_in_time)
    assert result.status in {201, 409}  # written, or memory off for the company: not 408


@pytest.mark.parametrize(("method", "path", "template", "body"), ROUTES)
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_client_gone_mid_body_is_a_499_without_an_error_or_a_write(
    limited_app: FastAPI,
    auth: AuthFactory,
    caplog: pytest.LogCaptureFixture,
    *,
    method: str,
    path: str,
    template: str,
    body: Callable[[], bytes],
    chunked: bool,
) -> None:
    whole = body()
    length = {"transfer-encoding": "chunked"} if chunked else {"content-length": str(len(whole))}
    headers = {**auth(), "content-type": "application/json", "if-none-match": "*", **length}
    # everything but the end: a chunked body whose last chunk never came must not be taken
    # for the whole body
    receive = partial_then({"type": "http.disconnect"}, part=whole[:-1] if not chunked else whole)
    # a chunked body is read whole before the request is routed
    label = "unmatched" if chunked else template
    before = answered(limited_app, method, label, 499)
    with caplog.at_level(logging.INFO):
        result = await call(limited_app, method, path, headers, receive)

    assert answered(limited_app, method, label, 499) == before + 1
    assert answered(limited_app, method, label, 500) == 0
    access = [r for r in caplog.records if r.name == "app.access"]
    assert [r.__dict__["status"] for r in access] == [499]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not [r for r in caplog.records if r.exc_info]
    assert result.status in {None, 400}  # nothing, or what the route said to nobody
    async with client_of(limited_app) as client:
        assert (await client.get(MEMORY_PATH, headers=auth())).status_code == 404
