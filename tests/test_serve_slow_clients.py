"""`python -m app serve` against careless and abusive clients, over raw sockets: a client that
trickles its headers (slowloris) or its body is cut off within its timeout plus a margin, an
oversized head is a 431, a client gone mid-body is logged as 499 (not a 500 with a
traceback), and a normal client is served all along."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.apps import TokenFactory
from tests.helpers.polling import wait_until
from tests.test_serve_workers import (
    scratch_database_url,  # noqa: F401 - a fixture
    serve_env,
    serving,
    wait_until_answering,
)

pytestmark = pytest.mark.slow  # each test starts `serve`

TIMEOUT = 2.0  # REQUEST_HEADER_TIMEOUT_SECONDS and REQUEST_BODY_TIMEOUT_SECONDS
MARGIN = 1.5
SLOW_CLIENTS = 40  # of each kind
TRICKLE_SECONDS = 0.4  # between two bytes of a slow client


@dataclass
class Served:
    port: int
    log_path: Path


@pytest.fixture(params=[1, 2], ids=["one-process", "two-processes"])
async def served(
    scratch_database_url: str,  # noqa: F811
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> AsyncIterator[Served]:
    """`serve` with short timeouts: one process (uvicorn.run), or two (each spawned process
    imports the protocol by name)."""
    env = serve_env(
        DATABASE_URL=scratch_database_url,
        WORKER_ENABLED="false",
        LOG_FORMAT="json",
        REQUEST_HEADER_TIMEOUT_SECONDS=str(TIMEOUT),
        REQUEST_BODY_TIMEOUT_SECONDS=str(TIMEOUT),
        WORKER_HEARTBEAT_FILE=str(tmp_path / "heartbeat"),
    )
    with serving(request.param, env, tmp_path) as (process, port, log_path):
        url = f"http://127.0.0.1:{port}/healthz"
        await asyncio.to_thread(wait_until_answering, process, url, log_path)
        yield Served(port, log_path)


@dataclass
class Outcome:
    """What a client saw: the status line the server sent (if any), and when it closed."""

    status: int | None
    closed_after: float


async def trickle(port: int, head: bytes, then: bytes, *, limit: float) -> Outcome:
    """Send `head` at once, then `then` one byte every TRICKLE_SECONDS until the server
    closes the connection (or `limit` seconds pass); the clock starts after `head`."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head)
    await writer.drain()
    started = time.monotonic()
    answer = b""

    async def read_all() -> None:
        nonlocal answer
        while chunk := await reader.read(65536):
            answer += chunk

    reading = asyncio.create_task(read_all())
    try:
        for byte in then:
            if reading.done() or time.monotonic() - started > limit:
                break
            try:
                writer.write(bytes([byte]))
                await writer.drain()
            except ConnectionError:
                break
            await asyncio.wait({reading}, timeout=TRICKLE_SECONDS)
        await asyncio.wait_for(reading, timeout=max(0.1, limit - (time.monotonic() - started)))
    except (TimeoutError, ConnectionError):
        pass
    finally:
        closed_after = time.monotonic() - started
        reading.cancel()
        writer.close()
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else None
    return Outcome(status, closed_after)


async def get_healthz(port: int) -> tuple[int, float]:
    started = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), timeout=5)
    writer.close()
    return int(answer.split(b" ", 2)[1]), time.monotonic() - started


async def normal_client(port: int, until: asyncio.Event) -> list[tuple[int, float]]:
    answers = []
    while not until.is_set():
        answers.append(await get_healthz(port))
        await asyncio.sleep(0.2)
    return answers


SLOW_HEAD = (b"GET /healthz HTTP/1.1\r\nHost: test\r\n", b"X-Trickle: " + b"a" * 200)
SLOW_BODY = (
    b"PUT /v1/me/memory HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
    b"Content-Length: 1000\r\n\r\n",
    b'{"content": "' + b"a" * 200,
)


async def test_slow_headers_and_slow_bodies_are_cut_off_while_others_are_served(
    served: Served,
) -> None:
    limit = TIMEOUT + MARGIN + 5  # how long a client waits before it calls the server hung
    done = asyncio.Event()
    normal = asyncio.create_task(normal_client(served.port, done))
    idle = asyncio.create_task(trickle(served.port, b"", b"", limit=limit))
    heads = [trickle(served.port, *SLOW_HEAD, limit=limit) for _ in range(SLOW_CLIENTS)]
    bodies = [trickle(served.port, *SLOW_BODY, limit=limit) for _ in range(SLOW_CLIENTS)]
    slow = await asyncio.gather(*heads, *bodies)
    idle_outcome = await idle
    done.set()
    served_meanwhile = await normal

    slow_heads, slow_bodies = slow[:SLOW_CLIENTS], slow[SLOW_CLIENTS:]
    worst_head = max(o.closed_after for o in slow_heads)
    worst_body = max(o.closed_after for o in slow_bodies)
    print(
        f"\n{SLOW_CLIENTS} slow heads closed after <= {worst_head:.2f} s, {SLOW_CLIENTS} slow "
        f"bodies after <= {worst_body:.2f} s, idle after {idle_outcome.closed_after:.2f} s "
        f"(timeouts {TIMEOUT} s); {len(served_meanwhile)} healthz meanwhile, slowest "
        f"{max(s for _, s in served_meanwhile) * 1000:.0f} ms"
    )
    assert {o.status for o in slow_heads} == {408}
    assert min(o.closed_after for o in slow_heads) >= TIMEOUT - 0.2
    assert worst_head <= TIMEOUT + MARGIN
    assert {o.status for o in slow_bodies} == {408}
    assert min(o.closed_after for o in slow_bodies) >= TIMEOUT - 0.2
    assert worst_body <= TIMEOUT + MARGIN
    assert idle_outcome.status is None  # nothing was asked, nothing is answered
    assert idle_outcome.closed_after <= TIMEOUT + MARGIN
    assert len(served_meanwhile) >= 5
    assert {status for status, _ in served_meanwhile} == {200}
    assert max(seconds for _, seconds in served_meanwhile) < 1.0


async def raw_request(port: int, request: bytes) -> tuple[bytes, bool]:
    """Send `request` whole; the answer, and whether the server then closed the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
    except ConnectionError:
        pass
    try:
        answer = await asyncio.wait_for(reader.read(), timeout=5)  # to EOF: closed
        closed = True
    except TimeoutError:
        answer, closed = b"", False
    except ConnectionError:
        answer, closed = b"", True
    writer.close()
    return answer, closed


def problem_of(answer: bytes) -> dict[str, object]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"content-type: application/problem+json" in head.lower(), head
    parsed: dict[str, object] = json.loads(body)
    return parsed


async def test_an_oversized_head_is_a_431_and_the_connection_is_closed(served: Served) -> None:
    huge = b"".join(b"X-Filler-%d: %s\r\n" % (n, b"a" * 2000) for n in range(100))  # ~200 KB
    many = b"".join(b"X-F%d: a\r\n" % n for n in range(150))
    for headers in (huge, many):
        request = b"GET /v1/me HTTP/1.1\r\nHost: test\r\n" + headers + b"\r\n"
        answer, closed = await raw_request(served.port, request)
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
        assert problem_of(answer)["title"] == "Request header fields too large"
        assert closed
    status, _ = await get_healthz(served.port)
    assert status == 200


async def test_a_head_past_the_limit_is_refused_before_it_ends(served: Served) -> None:
    """The server counts a head as it arrives: 64 KB of header fields, and no blank line
    that would end them, are answered at once, not when the head timeout strikes."""
    started = time.monotonic()
    unfinished = b"GET /v1/me HTTP/1.1\r\nHost: test\r\n" + b"X-Filler: " + b"a" * 65536
    answer, closed = await raw_request(served.port, unfinished)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert closed
    assert time.monotonic() - started < TIMEOUT / 2


def access_lines(log_path: Path) -> list[dict[str, object]]:
    lines = []
    for line in log_path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if isinstance(record, dict):
                lines.append(record)
    return lines


async def test_a_client_gone_mid_body_is_logged_as_499_without_a_traceback(
    served: Served, make_token: TokenFactory
) -> None:
    """Each client asks for `100 Continue` and sends part of its body once it came: the server
    sends it when the app first reads the body, so the client leaves while the app reads."""
    token = make_token("alice").encode()
    for path in (b"/v1/chats/chat-1/turns", b"/v1/me/memory"):
        method = b"POST" if b"turns" in path else b"PUT"
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(
            method
            + b" "
            + path
            + b" HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer "
            + token
            + b"\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n"
            + b"Expect: 100-continue\r\n\r\n"
        )
        await writer.drain()
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n", interim
        writer.write(b'{"space_id": "space-1", "messages": [')
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    def both_logged() -> list[dict[str, object]]:
        records = access_lines(served.log_path)
        gone = [r for r in records if r.get("msg") == "request" and r.get("status") == 499]
        return gone if len(gone) == 2 else []

    gone = await wait_until(both_logged, 10, what="two requests logged as 499")
    records = access_lines(served.log_path)
    assert sorted(str(r["path"]) for r in gone) == ["/v1/chats/chat-1/turns", "/v1/me/memory"]
    assert not [r for r in records if r.get("level") == "error" or "trace" in r], records
    assert not [r for r in records if r.get("status") == 500]
