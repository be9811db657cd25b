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
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final

from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from opentelemetry.trace import Tracer
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from app.kit.auth import principal_of
from app.kit.db import Database
from app.kit.errors import ServiceUnavailable, Unauthorized
from app.mcp_server.discovery import ResourceDiscovery
from app.mcp_server.tools import acting_as, build_server
from app.profiles.versions import VersionPolicy
from app.rate_limits.limiter import RateLimiter

MCP_PATH: Final = "/mcp"
_NO_HOST_ALLOWLIST: Final = TransportSecuritySettings(enable_dns_rebinding_protection=False)


class McpEndpoint:
    """The ASGI app of `/mcp`: authenticates the request, then hands it to the SDK's session
    manager, which only exists while `running` (inside the app's lifespan)."""

    def __init__(self, discovery: ResourceDiscovery) -> None:
        self._discovery = discovery
        self._sessions: StreamableHTTPSessionManager | None = None

    @asynccontextmanager
    async def running(
        self, database: Database, policy: VersionPolicy, limiter: RateLimiter, tracer: Tracer
    ) -> AsyncIterator[None]:
        """Serve MCP on `database` for the life of the block (a new server each time: the
        SDK's session manager runs once); edits count against `limiter`'s memory writes; each
        tool call is a span of `tracer`."""
        server = build_server(database, policy, limiter, tracer)
        server.streamable_http_app(
            streamable_http_path=MCP_PATH,
            json_response=True,
            stateless_http=True,
            transport_security=_NO_HOST_ALLOWLIST,
        )
        sessions = server.session_manager
        async with sessions.run():
            self._sessions = sessions
            try:
                yield
            finally:
                self._sessions = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # 401 (problem+json, like every route) before the SDK sees a byte of the request
        request = Request(scope)
        try:
            principal = await principal_of(request)
        except Unauthorized as refused:
            challenge = self._discovery.mcp_challenge(request)
            raise Unauthorized(refused.detail, challenge=challenge) from refused
        sessions = self._sessions
        if sessions is None:
            raise ServiceUnavailable("The MCP server is not running.")
        async with acting_as(principal):
            await sessions.handle_request(scope, receive, send)


def mcp_route(endpoint: McpEndpoint) -> Route:
    """The route of `endpoint`: POST only (see the module's docstring), not in the OpenAPI."""
    return Route(MCP_PATH, endpoint, methods=["POST"], include_in_schema=False, name="mcp")
