"""`/mcp`: the Streamable HTTP endpoint of the MCP server, behind the service's bearer token.

Stateless on purpose: every POST carries its own JSON-RPC message(s) and its own token, answered
as JSON, with no session held in the process; so `serve --workers N` (any process may take any
request) and a token that expires or changes mid-conversation are both handled like any other
request. A server-initiated stream (GET) and session termination (DELETE) do not exist in this
mode: both are 405, which the transport allows.

A 401 names the resource metadata of `/mcp` in its `WWW-Authenticate` (`discovery.py`), from
which an MCP client finds the providers to sign in with.

The SDK's DNS rebinding protection (a Host/Origin allowlist for servers on localhost) is off:
a rebound page in a browser cannot present the bearer token every request needs, and the
allowlist would refuse the service behind any other host name.

The SDK (and `tools.py`, which builds on it) is imported when the first authenticated request
reaches `/mcp`, not with the app: it costs ~0.5 s of start-up and ~50 MB, which a process that
serves only the REST API never needs.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Final

from opentelemetry.trace import Tracer
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from app.kit.auth.dependencies import principal_of
from app.kit.db.engine import Database
from app.kit.errors import Unauthorized
from app.mcp_server.discovery import ResourceDiscovery
from app.mcp_server.errors import McpServerNotRunning
from app.profiles.versions import VersionPolicy
from app.rate_limits.limiter import RateLimiter

if TYPE_CHECKING:
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

MCP_PATH: Final = "/mcp"


class McpEndpoint:
    """The ASGI app of `/mcp`: authenticates the request, then hands it to the SDK's session
    manager, which only exists while `running` (inside the app's lifespan), from the first
    request on."""

    def __init__(self, discovery: ResourceDiscovery) -> None:
        self._discovery = discovery
        self._server: _LazyServer | None = None

    @asynccontextmanager
    async def running(
        self, database: Database, policy: VersionPolicy, limiter: RateLimiter, tracer: Tracer
    ) -> AsyncIterator[None]:
        """Serve MCP on `database` for the life of the block (a new server each time: the
        SDK's session manager runs once), started by the first request; edits count against
        `limiter`'s memory writes; each tool call is a span of `tracer`."""
        server = _LazyServer(database, policy, limiter, tracer)
        self._server = server
        try:
            yield
        finally:
            self._server = None
            await server.stop()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # 401 (problem+json, like every route) before the SDK sees a byte of the request
        request = Request(scope)
        try:
            principal = await principal_of(request)
        except Unauthorized as refused:
            challenge = self._discovery.mcp_challenge(request)
            raise Unauthorized(refused.detail, challenge=challenge) from refused
        server = self._server
        if server is None:
            raise McpServerNotRunning
        sessions = await server.sessions()
        from app.mcp_server.tools import acting_as  # noqa: PLC0415 - loaded by sessions()

        async with acting_as(principal):
            await sessions.handle_request(scope, receive, send)


class _LazyServer:
    """The MCP server and its session manager, built and run by `sessions()`'s first call in a
    task of their own: the SDK's session manager holds a task group, which must be entered and
    left by the same task, and no request's task lives as long as the server."""

    def __init__(
        self, database: Database, policy: VersionPolicy, limiter: RateLimiter, tracer: Tracer
    ) -> None:
        self._database = database
        self._policy = policy
        self._limiter = limiter
        self._tracer = tracer
        self._started: asyncio.Future[StreamableHTTPSessionManager] | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    async def sessions(self) -> StreamableHTTPSessionManager:
        """The running session manager, started now if no request has started it yet."""
        if self._started is None:
            self._started = asyncio.get_running_loop().create_future()
            # a context of its own: not the first request's (its caller, its span)
            self._task = asyncio.create_task(
                self._run(self._started), context=contextvars.Context()
            )
        # shielded: a request that goes away while the server starts leaves it starting
        return await asyncio.shield(self._started)

    async def _run(self, started: asyncio.Future[StreamableHTTPSessionManager]) -> None:
        try:
            from mcp.server.transport_security import TransportSecuritySettings  # noqa: PLC0415

            from app.mcp_server.tools import build_server  # noqa: PLC0415

            server = build_server(self._database, self._policy, self._limiter, self._tracer)
            server.streamable_http_app(
                streamable_http_path=MCP_PATH,
                json_response=True,
                stateless_http=True,
                transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            )
            sessions = server.session_manager
            async with sessions.run():
                started.set_result(sessions)
                await self._stop.wait()
        except Exception as exc:
            if not started.done():
                started.set_exception(exc)
            raise
        finally:
            if not started.done():  # cancelled before it started
                started.cancel()

    async def stop(self) -> None:
        """Stop the session manager, when a request started it."""
        self._stop.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)


def mcp_route(endpoint: McpEndpoint) -> Route:
    """The route of `endpoint`: POST only (see the module's docstring), not in the OpenAPI."""
    return Route(MCP_PATH, endpoint, methods=["POST"], include_in_schema=False, name="mcp")
