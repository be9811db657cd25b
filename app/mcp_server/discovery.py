"""How an MCP client finds out where to sign in: OAuth 2.0 Protected Resource Metadata (RFC 9728)
for the service and for `/mcp`, and the `WWW-Authenticate` challenge of a 401 from `/mcp`, which
names that metadata's URL (the MCP authorization spec's discovery).

The documents are public and the same for every caller: the resource's URL, the issuers of
AUTH_ISSUERS as its authorization servers, and the header as the one way to send a token.

The resource's URL is AUTH_RESOURCE_URL, or else the request's own scheme and `Host` header.
A `Host` header is whatever the client sent, so it is used only when it is a plain host name or
IP literal with an optional port (nothing else can reach the JSON or the quoted challenge), and
a client that sends someone else's host name only changes the answer it gets itself (a shared
cache keys the documents by that same host).
"""

from __future__ import annotations

import logging
import re
from typing import Final

from pydantic import AnyHttpUrl, BaseModel, ConfigDict, TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app.kit.config import Settings
from app.mcp_server.errors import HostNotAHostName

logger = logging.getLogger(__name__)

METADATA_PATH: Final = "/.well-known/oauth-protected-resource"
RESOURCE_NAME: Final = "Context Memory Service"
# Issuers change only with the configuration, i.e. a restart: an hour saves clients a request
# per connection, and a changed provider is seen within the hour.
CACHE_CONTROL: Final = "public, max-age=3600"

_HOST: Final = re.compile(r"(?:[A-Za-z0-9.-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\])(?::[0-9]{1,5})?")
# what may stand inside the challenge's quoted-string: the characters of the URLs built here
_QUOTABLE: Final = re.compile(r"[A-Za-z0-9:/.\-\[\]_~]+")
# as the SDK's model reads URLs: `https://idp.example` stays without a trailing slash, since an
# issuer is compared with the authorization server's metadata as an exact string
_URL: Final = TypeAdapter(AnyHttpUrl, config=ConfigDict(url_preserve_empty_path=True))


class ResourceMetadata(BaseModel):
    """The RFC 9728 document: the fields of the MCP SDK's `ProtectedResourceMetadata` this
    service sends, in its order, read as it reads them (MCP clients parse the document with
    it). Not the SDK's model itself: importing the SDK costs the API process ~0.3 s and tens
    of MB before `/mcp` is ever called. `authorization_servers` is optional as the RFC has it:
    a service without AUTH_ISSUERS has no authorization server to name, so the field is left
    out rather than sent as an empty list (the SDK's model insists on at least one)."""

    model_config = ConfigDict(url_preserve_empty_path=True)

    resource: AnyHttpUrl
    authorization_servers: list[AnyHttpUrl] | None = None
    bearer_methods_supported: list[str] | None = None
    resource_name: str | None = None


class ResourceDiscovery:
    """The protected resource as MCP clients see it: its metadata documents and the
    challenge that points at them."""

    def __init__(self, settings: Settings, mcp_path: str) -> None:
        configured = settings.auth_resource_url
        self._origin = configured.rstrip("/") if configured else None
        self._mcp_path = mcp_path
        self._servers = _authorization_servers(settings)

    def origin(self, request: Request) -> str | None:
        """`scheme://host[:port]` of the service as `request`'s client reached it: the
        configured URL, else the request's scheme and `Host` when that is a well-formed host
        (None otherwise)."""
        if self._origin is not None:
            return self._origin
        scheme = request.scope.get("scheme")
        host = request.headers.get("host")
        if scheme not in {"http", "https"} or host is None or not _HOST.fullmatch(host):
            return None
        return f"{scheme}://{host}"

    def mcp_metadata_url(self, request: Request) -> str | None:
        """The URL of `/mcp`'s metadata (RFC 9728 §3.1: the well-known prefix, then the path)."""
        origin = self.origin(request)
        return None if origin is None else f"{origin}{METADATA_PATH}{self._mcp_path}"

    def mcp_challenge(self, request: Request) -> str:
        """`WWW-Authenticate` of a 401 from `/mcp`: `Bearer` naming the metadata's URL (plain
        `Bearer` when no URL can be given for this request)."""
        url = self.mcp_metadata_url(request)
        if url is None or not _QUOTABLE.fullmatch(url):
            return "Bearer"
        return f'Bearer resource_metadata="{url}"'

    def document(self, request: Request, resource_path: str) -> ResourceMetadata:
        """The metadata of the resource at `resource_path` ("" for the service itself)."""
        origin = self.origin(request)
        if origin is None:
            raise HostNotAHostName
        return ResourceMetadata(
            resource=_URL.validate_python(origin + resource_path),
            authorization_servers=self._servers or None,
            bearer_methods_supported=["header"],
            resource_name=RESOURCE_NAME,
        )

    def routes(self) -> list[Route]:
        """`GET` of both documents: the service's and the one of `/mcp` (not in the OpenAPI:
        they describe how to get a token, not the API)."""

        def serve(resource_path: str) -> Route:
            async def metadata(request: Request) -> Response:
                body = self.document(request, resource_path).model_dump_json(exclude_none=True)
                return Response(
                    body,
                    media_type="application/json",
                    headers={"Cache-Control": CACHE_CONTROL},
                )

            path = METADATA_PATH + resource_path
            return Route(path, metadata, methods=["GET"], include_in_schema=False)

        return [serve(""), serve(self._mcp_path)]


def _authorization_servers(settings: Settings) -> list[AnyHttpUrl]:
    """The issuers of AUTH_ISSUERS, in order, that are http(s) URLs (an OAuth authorization
    server's issuer always is; one that is not cannot be discovered, so it is left out)."""
    servers = []
    for entry in settings.auth_issuers:
        try:
            servers.append(_URL.validate_python(entry.issuer))
        except ValidationError:
            logger.warning("issuer %r is not a URL: not in the resource metadata", entry.issuer)
    return servers
