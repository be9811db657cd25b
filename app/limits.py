"""Request body size limits (413), enforced before the body reaches a route.

Every request has `MAX_BODY_BYTES`. A route that reads its body itself, as it arrives (the
company import, which may be gigabytes), has its own larger limit (`StreamedLimit`): its body
is never buffered here, only counted.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import PayloadTooLarge, problem_response


@dataclass(frozen=True)
class StreamedLimit:
    """`max_bytes` for the requests whose path `pattern` matches in full.

    A body declared larger (`Content-Length`) is refused up front; a body of unknown length
    passes through unbuffered and `PayloadTooLarge` is raised from the route's read of the
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
                break
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
        response = problem_response(PayloadTooLarge.problem_type(), too_large(max_bytes))
        await response(scope, receive, send)


def too_large(max_bytes: int) -> str:
    return f"The request body exceeds the limit of {max_bytes} bytes."


def _counted(receive: Receive, max_bytes: int) -> Receive:
    received = 0

    async def counted() -> Message:
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > max_bytes:
                raise PayloadTooLarge(too_large(max_bytes))
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
