"""How an MCP client finds out where to sign in: the protected resource metadata (RFC 9728) of
the service and of `/mcp`, the challenge of a 401 from `/mcp` that points at it, and what a Host
header can (and cannot) do to either. The official SDK's client following them to a real
identity provider, signing in and calling the tools: tests/identity/test_mcp_sign_in.py.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx
import pytest
from mcp.shared.auth import ProtectedResourceMetadata

from app.kit.config import IssuerConfig
from app.main import create_app
from tests.helpers.apps import client_of, make_settings

ROOT_DOCUMENT = "/.well-known/oauth-protected-resource"
MCP_DOCUMENT = "/.well-known/oauth-protected-resource/mcp"
NAME = "Context Memory Service"
MCP_CHALLENGE = f'Bearer resource_metadata="http://testserver{MCP_DOCUMENT}"'
TOOLS_LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
MCP_ACCEPT = {"Accept": "application/json, text/event-stream"}
BAD_HOST = "The Host header is not a host name with an optional port."

ISSUERS = [
    IssuerConfig(issuer="https://sso.example.com", audiences=["memory"], company="acme"),
    IssuerConfig(
        issuer="https://login.example.org/realms/staff",
        audiences=["memory"],
        company_claim="org",
        platform=True,
    ),
]


ClientFor = Callable[..., AbstractAsyncContextManager[httpx.AsyncClient]]


@pytest.fixture
def client_for(database_url: str) -> ClientFor:
    """`client_for(**settings)`: an ASGI client of an app built with those settings (no
    lifespan: the documents and the challenge need neither the database nor the providers)."""

    def build(**overrides: Any) -> AbstractAsyncContextManager[httpx.AsyncClient]:
        return client_of(create_app(make_settings(database_url, **overrides)))

    return build


def raw(headers: dict[str, str | bytes]) -> list[tuple[bytes, bytes]]:
    """Headers as bytes, so that a test can send any (the ASGI transport passes them on)."""
    return [(k.encode(), v if isinstance(v, bytes) else v.encode()) for k, v in headers.items()]


async def documents(http: httpx.AsyncClient, **headers: str | bytes) -> list[httpx.Response]:
    return [await http.get(path, headers=raw(headers)) for path in (ROOT_DOCUMENT, MCP_DOCUMENT)]


async def mcp_refusal(http: httpx.AsyncClient, **headers: str | bytes) -> httpx.Response:
    sent = raw({**MCP_ACCEPT, **headers})
    response = await http.post("/mcp", json=TOOLS_LIST, headers=sent)
    assert response.status_code == 401
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["status"] == 401
    return response


# --- the documents --------------------------------------------------------------------------------


async def test_without_issuers_the_documents_name_the_resource_and_no_server(
    client: httpx.AsyncClient,
) -> None:
    root, mcp = await documents(client)
    assert root.json() == {
        "resource": "http://testserver",
        "bearer_methods_supported": ["header"],
        "resource_name": NAME,
    }
    assert mcp.json() == {
        "resource": "http://testserver/mcp",
        "bearer_methods_supported": ["header"],
        "resource_name": NAME,
    }
    for response in (root, mcp):
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/json"
        assert response.headers["cache-control"] == "public, max-age=3600"


async def test_the_documents_name_every_trusted_issuer_in_order_as_configured(
    client_for: ClientFor,
) -> None:
    async with client_for(auth_issuers=ISSUERS) as http:
        root, mcp = await documents(http)
    servers = ["https://sso.example.com", "https://login.example.org/realms/staff"]
    assert root.json()["authorization_servers"] == servers
    assert mcp.json() == {
        "resource": "http://testserver/mcp",
        "authorization_servers": servers,
        "bearer_methods_supported": ["header"],
        "resource_name": NAME,
    }
    parsed = ProtectedResourceMetadata.model_validate_json(mcp.content)  # as MCP clients read it
    assert [str(server) for server in parsed.authorization_servers] == servers


async def test_a_configured_resource_url_is_published_whatever_the_host_header(
    client_for: ClientFor,
) -> None:
    async with client_for(auth_resource_url="https://memory.example/") as http:
        root, mcp = await documents(http, host="attacker.example")
        refused = await mcp_refusal(http, host="attacker.example")
    assert root.json()["resource"] == "https://memory.example"
    assert mcp.json()["resource"] == "https://memory.example/mcp"
    assert refused.headers["www-authenticate"] == (
        f'Bearer resource_metadata="https://memory.example{MCP_DOCUMENT}"'
    )


@pytest.mark.parametrize(
    "url", ["https://memory.example/mcp", 'https://a".example', "ftp://memory.example", "x" * 400]
)
def test_a_resource_url_with_more_than_scheme_host_and_port_is_refused(
    database_url: str, url: str
) -> None:
    with pytest.raises(ValueError, match="auth_resource_url"):
        make_settings(database_url, auth_resource_url=url)


# --- the challenge --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer not-a-jwt"}, {"Authorization": "Basic YWxpY2U6c2VjcmV0"}],
    ids=["no token", "malformed token", "not bearer"],
)
async def test_a_401_from_mcp_names_its_metadata_which_describes_mcp(
    client: httpx.AsyncClient, headers: dict[str, str]
) -> None:
    refused = await mcp_refusal(client, **headers)
    assert refused.headers["www-authenticate"] == MCP_CHALLENGE

    named = MCP_CHALLENGE.split('"')[1]
    document = await client.get(named)
    assert document.status_code == 200
    assert document.json()["resource"] == "http://testserver/mcp"


async def test_a_401_from_the_http_api_stays_plain_bearer(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/me")
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"


async def test_another_host_name_changes_only_the_answer_to_its_sender(
    client: httpx.AsyncClient,
) -> None:
    spoofed = await mcp_refusal(client, host="attacker.example:8443")
    assert spoofed.headers["www-authenticate"] == (
        f'Bearer resource_metadata="http://attacker.example:8443{MCP_DOCUMENT}"'
    )
    assert (await mcp_refusal(client)).headers["www-authenticate"] == MCP_CHALLENGE
    [root, _] = await documents(client)
    assert root.json()["resource"] == "http://testserver"


HOSTILE_HOSTS = {
    "quote and parameter": b'evil.example", error="invalid_token',
    "CRLF and a header": b"evil.example\r\nSet-Cookie: session=stolen",
    "NUL": b"evil.example\x00",
    "very long": b"a" * 10_000 + b".example",
    "path": b"evil.example/other",
    "user info": b"user@evil.example",
    "port out of shape": b"evil.example:8443:1",
    "space": b"evil.example more",
    "backslash": b"evil.example\\",
    "non-ASCII": "évil.example".encode(),
    "empty": b"",
}


@pytest.mark.parametrize("host", HOSTILE_HOSTS.values(), ids=HOSTILE_HOSTS.keys())
async def test_a_host_header_that_is_not_a_host_reaches_neither_header_nor_document(
    client: httpx.AsyncClient, host: bytes
) -> None:
    # the ASGI transport hands the bytes to the app as they are; a server would refuse some
    refused = await mcp_refusal(client, host=host)
    assert refused.headers["www-authenticate"] == "Bearer"
    assert "set-cookie" not in refused.headers

    for response in await documents(client, host=host):
        assert response.status_code == 400
        assert response.headers["content-type"] == "application/problem+json"
        assert response.json()["detail"] == BAD_HOST  # the header is not echoed
