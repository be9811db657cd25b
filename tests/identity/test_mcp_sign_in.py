"""An MCP client signs its user in on its own: the official SDK's client, holding no token, gets
the 401 of `/mcp` from the service served over real HTTP, follows the `WWW-Authenticate`
challenge to the resource metadata (RFC 9728), discovers the real OpenID Provider (oidc-provider,
run by Node) named there, signs the user in by the authorization code flow with PKCE through the
provider's own sign-in and consent pages, redeems the code for a JWT access token for
`<service>/mcp` (RFC 8707), and calls the tools as that user, in the company the token's claim
names.

The client is registered with the provider beforehand, as a native public client (no secret,
PKCE, a loopback redirect URI): the test provider offers no dynamic registration, and the SDK
finds the registration in its storage, as an MCP client configured with a client id does. The
provider's audience is the service's MCP URL, the resource the client asks for, so the token's
`aud` is that URL as with a provider that honours the resource indicator; the issuer's entry
lists it in `audiences`, as docs/identity.md says to.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import httpx2
import jwt
import pytest
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
)
from mcp_types import CallToolResult, TextContent

from app.main import create_app
from app.profiles.document import Section
from tests.helpers.apps import AuthFactory, make_settings
from tests.helpers.identity_provider import IdentityProvider, public_client
from tests.helpers.memory import ME, create
from tests.helpers.profiles import memory_md
from tests.helpers.serving import served_on

LOGIN = "dana"
COMPANY = "globex"  # the token's `org.id`
OTHER_COMPANY = "initech"  # where the same login has a memory of its own
OWN_CANARY, OTHER_CANARY = "heron-5c1e", "kestrel-9d20"
ACCOUNTS = {LOGIN: {"org": {"id": COMPANY}}}
CLIENT_ID = "memory-assistant"
# The authorization response is read from the redirect, where the client's loopback listener
# would read it; nothing listens there.
REDIRECT_URI = "http://127.0.0.1:9/callback"
MCP_METADATA = "/.well-known/oauth-protected-resource/mcp"
HTTP_TIMEOUT_SECONDS = 30.0


# --- the provider and the service -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Deployment:
    """The provider and the service that trusts it, both listening on 127.0.0.1."""

    provider: IdentityProvider
    base_url: str

    @property
    def mcp_url(self) -> str:
        return f"{self.base_url}/mcp"


@pytest.fixture(scope="module")
async def deployment(database_url: str) -> AsyncIterator[Deployment]:
    """The provider, with the MCP client registered and the user's account, and the service
    trusting it for tokens whose `aud` is the service's MCP URL."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        mcp_url = f"{base_url}/mcp"
        assistant = {**public_client(CLIENT_ID, [REDIRECT_URI]), "application_type": "native"}
        async with IdentityProvider(
            accounts=ACCOUNTS, clients=[assistant], audience=mcp_url
        ) as provider:
            entry = provider.issuer_entry(audiences=[mcp_url], company_claim="org.id")
            app = create_app(make_settings(database_url, auth_issuers=[entry]))
            async with served_on(sock, app):
                yield Deployment(provider, base_url)


# --- the MCP client's side ------------------------------------------------------------------------


@dataclass
class Storage:
    """The client's storage: its registration with the provider, and no token until it signs
    in."""

    client: OAuthClientInformationFull
    tokens: OAuthToken | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


@dataclass
class User:
    """The user at the browser the SDK sends to the provider: `open` is the SDK's redirect
    handler (the user signs in and consents on the provider's pages), `callback` its callback
    handler (what the provider redirected to the client with)."""

    provider: IdentityProvider
    login: str
    opened: list[str] = field(default_factory=list)
    redirected_to: list[str] = field(default_factory=list)

    async def open(self, authorization_url: str) -> None:
        self.opened.append(authorization_url)
        location = await self.provider.sign_in(
            authorization_url, self.login, redirect_uri=REDIRECT_URI
        )
        self.redirected_to.append(location)

    async def callback(self) -> AuthorizationCodeResult:
        response = parse_qs(urlsplit(self.redirected_to[-1]).query)
        assert "error" not in response, response
        [code], [state], [iss] = response["code"], response["state"], response["iss"]
        return AuthorizationCodeResult(code=code, state=state, iss=iss)


def assistant_oauth(mcp_url: str, user: User, storage: Storage) -> OAuthClientProvider:
    """The SDK's OAuth for `mcp_url`, as an assistant registered as `CLIENT_ID` sets it up."""
    metadata = OAuthClientMetadata(
        client_name="Memory assistant",
        redirect_uris=[REDIRECT_URI],
        grant_types=["authorization_code"],
        token_endpoint_auth_method="none",
    )
    return OAuthClientProvider(
        server_url=mcp_url,
        client_metadata=metadata,
        storage=storage,
        redirect_handler=user.open,
        callback_handler=user.callback,
    )


def registration() -> OAuthClientInformationFull:
    """The client as registered with the provider (`public_client`)."""
    return OAuthClientInformationFull(
        client_id=CLIENT_ID,
        redirect_uris=[REDIRECT_URI],
        grant_types=["authorization_code"],
        token_endpoint_auth_method="none",
    )


async def call(client: Client, tool: str, **arguments: Any) -> Any:
    """A tool's structured result; fails on an error result."""
    result = await client.call_tool(tool, arguments)
    assert isinstance(result, CallToolResult)
    text = " ".join(block.text for block in result.content if isinstance(block, TextContent))
    assert not result.is_error, text
    return result.structured_content


def profile(*lines: str) -> str:
    return memory_md({Section.IDENTITY: list(lines)}, user_id=LOGIN)


# --- the sign-in ----------------------------------------------------------------------------------


async def test_the_sdk_client_signs_in_where_the_401_points_and_calls_the_tools_as_the_user(
    deployment: Deployment, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    provider, base_url, mcp_url = deployment.provider, deployment.base_url, deployment.mcp_url
    # the user's memory, and the same login's memory in another company
    for company, canary in ((COMPANY, OWN_CANARY), (OTHER_COMPANY, OTHER_CANARY)):
        created = await create(client, auth(LOGIN, company), profile(f"Known as {canary}"))
        assert created.status_code in (200, 201), created.text

    user = User(provider, LOGIN)
    storage = Storage(registration())
    seen: list[tuple[str, str, int]] = []

    async def record(response: httpx2.Response) -> None:
        request = response.request
        seen.append((request.method, str(request.url.copy_with(query=None)), response.status_code))

    oauth = assistant_oauth(mcp_url, user, storage)
    async with (
        httpx2.AsyncClient(
            auth=oauth, timeout=HTTP_TIMEOUT_SECONDS, event_hooks={"response": [record]}
        ) as http,
        Client(streamable_http_client(mcp_url, http_client=http)) as mcp,
    ):
        tools = {tool.name for tool in (await mcp.list_tools()).tools}
        read = await call(mcp, "read_memory")
        edited = profile(f"Known as {OWN_CANARY}", "Signed in through an assistant")
        edit = await call(mcp, "edit_memory", content=edited, expected_version=read["version"])

    # the 401, the metadata it names, the provider named there, one sign-in (between the
    # provider's metadata and its token endpoint), then the request again and the rest, signed in
    issuer = provider.issuer
    refused, resource, server, redeemed, *calls = seen
    assert refused == ("POST", mcp_url, 401)
    assert resource == ("GET", f"{base_url}{MCP_METADATA}", 200)
    assert server in {  # RFC 8414's document first, OpenID discovery's if there is none
        ("GET", f"{issuer}/.well-known/oauth-authorization-server", 200),
        ("GET", f"{issuer}/.well-known/openid-configuration", 200),
    }
    assert redeemed == ("POST", f"{issuer}/token", 200)
    assert len(calls) >= 4  # the refused request again, then at least list_tools and two tools
    assert set(calls) == {("POST", mcp_url, 200)}
    assert oauth.context.auth_server_url == issuer

    [opened] = user.opened
    page, query = urlsplit(opened), parse_qs(urlsplit(opened).query)
    assert f"{page.scheme}://{page.netloc}{page.path}" == f"{issuer}/auth"
    assert query["client_id"] == [CLIENT_ID]
    assert query["redirect_uri"] == [REDIRECT_URI]
    assert query["resource"] == [mcp_url]  # RFC 8707: the token is asked for the MCP URL
    assert query["code_challenge_method"] == ["S256"]

    # a JWT from the provider for the MCP URL, of the user who signed in
    assert storage.tokens is not None
    token = storage.tokens.access_token
    assert jwt.get_unverified_header(token)["alg"] == "RS256"
    claims = jwt.decode(token, options={"verify_signature": False})
    assert (claims["iss"], claims["sub"], claims["client_id"]) == (issuer, LOGIN, CLIENT_ID)
    assert claims["aud"] == mcp_url
    assert claims["org"] == {"id": COMPANY}

    # the tools acted as that user in that company
    assert {"read_memory", "edit_memory"} <= tools
    assert read["version"] == 1
    assert OWN_CANARY in read["content"]
    assert OTHER_CANARY not in read["content"]
    assert (edit["version"], edit["written"]) == (2, True)
    async with httpx.AsyncClient(base_url=base_url, timeout=HTTP_TIMEOUT_SECONDS) as http_api:
        me = await http_api.get("/v1/me", headers={"Authorization": f"Bearer {token}"})
    assert me.json() == {"user_id": LOGIN, "company_id": COMPANY, "roles": []}
    own = await client.get(ME, headers=auth(LOGIN, COMPANY))
    elsewhere = await client.get(ME, headers=auth(LOGIN, OTHER_COMPANY))
    assert (own.json()["version"], own.json()["content"]) == (2, edit["content"])
    assert "Signed in through an assistant" in edit["content"]
    assert (elsewhere.json()["version"], OTHER_CANARY in elsewhere.json()["content"]) == (1, True)
