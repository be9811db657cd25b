"""Request limits enforced before a request reaches a route: its head's size (431), its body's
size (413) and the time its body takes to arrive (408).

Every request has `MAX_BODY_BYTES`. A route that reads its body itself, as it arrives (the
company import, which may be gigabytes), has its own larger limit (`StreamedLimit`): its body
is never buffered here, only counted. A body that never completes (its client went away) is
never handed to a route as if it had.

`serve` bounds request heads in the HTTP server too (`app.kit.http_protocol`), before they are
parsed into a request; these middlewares hold wherever the app runs.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.kit.errors import BodyTooLarge, HeaderFieldsTooLarge, RequestTimeout
from app.kit.problems import problem_response, render

_CLOSE = {"Connection": "close"}


@dataclass(frozen=True)
class StreamedLimit:
    """`max_bytes` for the requests whose path `pattern` matches in full.

    A body declared larger (`Content-Length`) is refused up front; a body of unknown length
    passes through unbuffered and `BodyTooLarge` is raised from the route's read of the
    byte that crosses the limit, so the route's transaction rolls back with it.
    """

    pattern: re.Pattern[str]
    max_bytes: int


class BodySizeLimitMiddleware:
    """Rejects bodies over `max_bytes`: by Content-Length up front, or while buffering a body
    of unknown length (which is then replayed to the app); `streamed` paths have their own
    limit and are counted, not buffered."""

    def __init__(
        self, app: ASGIApp, max_bytes: int, streamed: Sequence[StreamedLimit] = ()
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.streamed = tuple(streamed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        limit = next((s.max_bytes for s in self.streamed if s.pattern.fullmatch(path)), None)
        max_bytes = self.max_bytes if limit is None else limit
        declared = _content_length(scope)
        if declared is not None and declared > max_bytes:
            await self._reject(scope, receive, send, max_bytes)
            return
        if declared is not None:
            # the server enforces Content-Length, so a declared size within the limit holds
            await self.app(scope, receive, send)
            return
        if limit is not None:
            await self.app(scope, _counted(receive, limit), send)
            return
        # chunked / unknown length: buffer up to the limit, then replay the body to the app
        chunks: list[bytes] = []
        received = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                raise ClientDisconnect  # the body never completed: nothing to hand on
            body = message.get("body", b"")
            received += len(body)
            if received > max_bytes:
                await self._reject(scope, receive, send, max_bytes)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send, max_bytes: int) -> None:
        response = render(BodyTooLarge(max_bytes))
        await response(scope, receive, send)


def _counted(receive: Receive, max_bytes: int) -> Receive:
    received = 0

    async def counted() -> Message:
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > max_bytes:
                raise BodyTooLarge(max_bytes)
        return message

    return counted


def _content_length(scope: Scope) -> int | None:
    for key, value in scope.get("headers", ()):
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class HeaderLimitMiddleware:
    """431 for a request with more than `max_count` header fields, or whose head (request line
    and header fields, counted as HTTP/1.1 sends them) is over `max_bytes`: answered before
    any route, token check or body read, and the connection closed."""

    def __init__(self, app: ASGIApp, max_count: int, max_bytes: int) -> None:
        self.app = app
        self.max_count = max_count
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = scope.get("headers", ())
            if len(headers) > self.max_count:
                detail = f"The request has more than {self.max_count} header fields."
            elif head_bytes(scope) > self.max_bytes:
                detail = f"The request's header fields exceed {self.max_bytes} bytes."
            else:
                detail = ""
            if detail:
                problem = HeaderFieldsTooLarge.problem_type()
                response = problem_response(problem, detail, headers=_CLOSE)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def head_bytes(scope: Scope) -> int:
    """The size of an HTTP/1.1 request head as sent: `METHOD target HTTP/1.1`, each
    `name: value` line, and the blank line."""
    target = len(scope.get("raw_path") or scope["path"].encode())
    query = scope.get("query_string", b"")
    if query:
        target += 1 + len(query)
    line = len(scope["method"]) + 1 + target + len(" HTTP/1.1\r\n")
    fields = sum(len(name) + len(value) + 4 for name, value in scope.get("headers", ()))
    return line + fields + 2


class BodyTimeoutMiddleware:
    """408 for a request body that does not arrive in time, and the connection closed.

    A body must have arrived `seconds` after the request's head; a `streamed` route's (one
    that reads a large body as it arrives) must not pause longer than `seconds` between two
    pieces. The route, left waiting, is told the client went away; what it then raises or
    answers is dropped, the 408 is the answer. Requests without a body, and the wait for a
    disconnect once the body is in, have no timeout.
    """

    def __init__(
        self, app: ASGIApp, seconds: float, streamed: Sequence[re.Pattern[str]] = ()
    ) -> None:
        self.app = app
        self.seconds = seconds
        self.streamed = tuple(streamed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _has_body(scope):
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.seconds
        per_piece = any(pattern.fullmatch(scope.get("path", "")) for pattern in self.streamed)
        body_done = False
        response_started = False
        answered = False

        async def timed_receive() -> Message:
            nonlocal body_done, answered
            if answered:
                return {"type": "http.disconnect"}
            if body_done:
                return await receive()
            until = loop.time() + self.seconds if per_piece else deadline
            try:
                async with asyncio.timeout_at(until):
                    message = await receive()
            except TimeoutError:
                if not response_started:
                    answered = True
                    detail = f"The request body did not arrive within {self.seconds:g} seconds."
                    response = problem_response(
                        RequestTimeout.problem_type(), detail, headers=_CLOSE
                    )
                    await response(scope, receive, send)
                return {"type": "http.disconnect"}
            body_done = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal response_started
            if answered:
                return
            if message["type"] == "http.response.start":
                response_started = True
            await send(message)

        try:
            await self.app(scope, timed_receive, guarded_send)
        except Exception:
            if not answered:
                raise


def _has_body(scope: Scope) -> bool:
    for key, value in scope.get("headers", ()):
        if key == b"transfer-encoding" or (key == b"content-length" and value.strip() != b"0"):
            return True
    return False
