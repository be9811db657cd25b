"""Request body size limit (413), enforced before the body reaches a route."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import PayloadTooLarge, problem_response


class BodySizeLimitMiddleware:
    """Rejects bodies over `max_bytes`: by Content-Length up front, or while buffering a body
    of unknown length (which is then replayed to the app)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._reject(scope, receive, send)
            return
        if declared is not None:
            # the server enforces Content-Length, so a declared size within the limit holds
            await self.app(scope, receive, send)
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
            if received > self.max_bytes:
                await self._reject(scope, receive, send)
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

    def _detail(self) -> str:
        return f"The request body exceeds the limit of {self.max_bytes} bytes."

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = problem_response(PayloadTooLarge.problem_type(), self._detail())
        await response(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for key, value in scope.get("headers", ()):
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
