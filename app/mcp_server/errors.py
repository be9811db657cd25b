"""The named failures of the Model Context Protocol endpoint and its discovery documents."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from app.kit.errors import DomainError, ServiceUnavailable, Unprocessable


class HostNotAHostName(DomainError):
    """A discovery request whose `Host` cannot be part of a URL: no document can name it."""

    def __init__(self) -> None:
        super().__init__("The Host header is not a host name with an optional port.")


class McpServerNotRunning(ServiceUnavailable):
    """`/mcp` was called while the server's session manager is not running."""

    def __init__(self) -> None:
        super().__init__("The MCP server is not running.")


class InvalidContentArgument(Unprocessable):
    """A tool's `content` argument breaks the rules of `PUT /v1/me/memory`'s body; `errors`
    name the rules, never the value."""

    def __init__(self, errors: Sequence[Mapping[str, object]]) -> None:
        super().__init__("The content argument is invalid; nothing was written.", errors=errors)
