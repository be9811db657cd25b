"""How an MCP client finds out where to sign in: the protected resource metadata (RFC 9728) of
the service and of `/mcp`, the challenge of a 401 from `/mcp` that points at it, what a Host
header can (and cannot) do to either, and the official SDK's OAuth client going from a 401 over
real HTTP to the sign-in page of the identity provider the metadata names.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import httpx2
import pytest
from fastapi import FastAPI, Request
from mcp.client.auth import OAuthClientProvider
from mcp.client.auth.utils import extract_resource_metadata_from_www_auth
from mcp.shared.auth import (
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
    ProtectedResourceMetadata,
)

from app.config import IssuerConfig
from app.main import create_app
from tests.helpers.apps import client_of, make_settings
from tests.helpers.serving import served

ROOT_DOCUMENT = "/.well-known/oauth-protected-resource"
MCP_DOCUMENT = "/.well-known/oauth-protected-resource/mcp"
NAME = "Context Memory Service"
MCP_CHALLENGE = f'Bearer resource_metadata="http://testserver{MCP_DOCUMENT}"'
TOOLS_LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
MCP_ACCEPT = {"Accept": "application/json, text/event-stream"}
BAD_HOST = "The Host header is not a host name with an optional port."

REALM = "/realms/memory"
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


# --- the official SDK's OAuth client --------------------------------------------------------------


def identity_provider() -> FastAPI:
    """A provider that publishes its OpenID configuration at `REALM` (as Keycloak does) and
    nothing else: enough for a client to learn where its sign-in page is."""
    stub = FastAPI()

    @stub.get(f"{REALM}/.well-known/openid-configuration")
    async def configuration(request: Request) -> dict[str, object]:
        issuer = f"{request.base_url}".rstrip("/") + REALM
        return {
            "issuer": issuer,
            "authorization_endpoint": f"{issuer}/protocol/openid-connect/auth",
            "token_endpoint": f"{issuer}/protocol/openid-connect/token",
            "jwks_uri": f"{issuer}/protocol/openid-connect/certs",
            "response_types_supported": ["code"],
            "code_challenge_methods_supported": ["S256"],
        }

    return stub


@dataclass
class PreRegistered:
    """The client's storage: no token yet, a client registered with the provider beforehand."""

    client: OAuthClientInformationFull

    async def get_tokens(self) -> OAuthToken | None:
        return None

    async def set_tokens(self, tokens: OAuthToken) -> None:
        raise AssertionError("no token is issued in this test")

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


class SignInPageOpened(Exception):
    """Where the SDK sends the user's browser: the end of discovery."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.url = url


@pytest.fixture(scope="module")
async def provider_and_service(database_url: str) -> AsyncIterator[tuple[str, str]]:
    """(the issuer, the service's base URL), both served by uvicorn; the service trusts the
    issuer."""
    async with served(identity_provider()) as provider_url:
        issuer = provider_url + REALM
        trusted = IssuerConfig(issuer=issuer, audiences=["memory"], company="acme")
        settings = make_settings(database_url, auth_issuers=[trusted])
        async with served(create_app(settings)) as base_url:
            yield issuer, base_url


async def test_the_sdk_client_finds_the_provider_from_a_401_and_opens_its_sign_in_page(
    provider_and_service: tuple[str, str],
) -> None:
    issuer, base_url = provider_and_service
    mcp_url = f"{base_url}/mcp"
    redirect_uri = "http://127.0.0.1:33418/callback"
    registered = OAuthClientInformationFull(
        client_id="memory-assistant", redirect_uris=[redirect_uri]
    )

    async def open_browser(url: str) -> None:
        raise SignInPageOpened(url)

    async def no_callback() -> Any:
        raise AssertionError("the sign-in page is never answered in this test")

    oauth = OAuthClientProvider(
        server_url=mcp_url,
        client_metadata=OAuthClientMetadata(redirect_uris=[redirect_uri]),
        storage=PreRegistered(registered),
        redirect_handler=open_browser,
        callback_handler=no_callback,
    )
    seen: list[tuple[str, str, int]] = []
    named: list[str | None] = []

    async def record(response: httpx2.Response) -> None:
        request = response.request
        seen.append((request.method, str(request.url), response.status_code))
        if response.status_code == 401:
            named.append(extract_resource_metadata_from_www_auth(response))

    async with httpx2.AsyncClient(auth=oauth, event_hooks={"response": [record]}) as http:
        with pytest.raises(SignInPageOpened) as opened:
            await http.post(mcp_url, json=TOOLS_LIST, headers=MCP_ACCEPT)

    assert named == [f"{base_url}{MCP_DOCUMENT}"]  # as the SDK reads the challenge
    assert seen[:2] == [("POST", mcp_url, 401), ("GET", f"{base_url}{MCP_DOCUMENT}", 200)]
    assert ("GET", f"{issuer}/.well-known/openid-configuration", 200) in seen
    metadata = oauth.context.protected_resource_metadata
    assert metadata is not None
    assert str(metadata.resource) == mcp_url
    assert oauth.context.auth_server_url == issuer

    page = urlsplit(opened.value.url)
    query = parse_qs(page.query)
    assert f"{page.scheme}://{page.netloc}{page.path}" == f"{issuer}/protocol/openid-connect/auth"
    assert query["client_id"] == ["memory-assistant"]
    assert query["resource"] == [mcp_url]  # RFC 8707: the token is asked for this resource
    assert query["code_challenge_method"] == ["S256"]
