"""A real OpenID Provider for tests: panva's oidc-provider (`tests/identity_provider/`) run by
Node on 127.0.0.1, and real access tokens obtained from it by the authorization code flow.

    async with IdentityProvider(accounts={"bob": {"org": {"id": "acme"}}}) as provider:
        token = await provider.access_token("bob", alg="ES256")
        issuers = [provider.issuer_entry(company_claim="org.id")]  # for AUTH_ISSUERS
        await provider.rotate("ES256")

`access_token` drives the provider's own sign-in and consent forms over HTTP (a fresh cookie jar
each time, PKCE S256) and redeems the code at the token endpoint with the confidential test
client; the access token is a JWT for the service's audience, signed with the key that signs
for `alg` at that moment, carrying the account's claims.

A browser application (the memory page) is registered once its origin is known; the provider
then answers CORS from that origin on its token endpoint:

    await provider.register_client(public_client("memory-page", [f"{base_url}/ui/memory"]))
    # UI_OIDC_ISSUER=provider.issuer, UI_OIDC_CLIENT_ID="memory-page"; the resource parameter
    # is optional (the provider defaults to its audience): {"resource": provider.resource()}

A client that builds its own authorization request (an MCP client's OAuth, say) hands its URL
to `sign_in`, which answers the forms as `access_token` does and returns where the provider
redirects to, the authorization response in its query:

    location = await provider.sign_in(authorization_url, "bob", redirect_uri=REDIRECT_URI)

The sign-in form accepts any login and password; the login is the token's `sub`.

Node and `npm ci` in `tests/identity_provider/` (`make test` runs it) are required: without
them starting fails with the command to run; the tests that need it error, they are not skipped.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qs, urlencode, urljoin, urlsplit

import httpx
import pytest

PROVIDER_DIR = Path(__file__).resolve().parent.parent / "identity_provider"
PROVIDER_SCRIPT = PROVIDER_DIR / "provider.mjs"
START_TIMEOUT_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 5.0
HTTP_TIMEOUT_SECONDS = 15.0

AUDIENCE = "context-memory"
ALGORITHMS = ("RS256", "ES256")
# Names the service to the provider (RFC 8707); never dereferenced. Its query picks the access
# token's audience and algorithm.
RESOURCE_BASE = "https://context-memory.test/"
TEST_CLIENT_ID = "memory-tests"
TEST_CLIENT_SECRET = "memory-tests-secret-" + "z" * 32
# The code is read from the redirect; nothing listens there.
TEST_REDIRECT_URI = "http://127.0.0.1:9/callback"
MAX_FORM_STEPS = 12


class IdentityProviderError(RuntimeError):
    """The provider could not be started, or refused a step of a sign-in."""


@dataclass(frozen=True, slots=True)
class OAuthClient:
    """A registered client as it signs in: a public one has no secret."""

    client_id: str
    redirect_uri: str
    secret: str | None = None


TEST_CLIENT = OAuthClient(TEST_CLIENT_ID, TEST_REDIRECT_URI, TEST_CLIENT_SECRET)


@dataclass(frozen=True, slots=True)
class SigningKey:
    kid: str
    alg: str
    signing: bool


@dataclass(frozen=True, slots=True)
class KeyRotation:
    alg: str
    old_kid: str
    new_kid: str


def confidential_client(
    client_id: str = TEST_CLIENT_ID,
    secret: str = TEST_CLIENT_SECRET,
    redirect_uris: Sequence[str] = (TEST_REDIRECT_URI,),
) -> dict[str, Any]:
    """Metadata of a client that authenticates at the token endpoint with a secret."""
    return {
        "client_id": client_id,
        "client_secret": secret,
        "redirect_uris": list(redirect_uris),
        "grant_types": ["authorization_code", "refresh_token"],
        "token_endpoint_auth_method": "client_secret_basic",
    }


def public_client(client_id: str, redirect_uris: Sequence[str]) -> dict[str, Any]:
    """Metadata of a browser application: no secret, PKCE, the token endpoint open to the
    origins of its redirect URIs (CORS)."""
    return {
        "client_id": client_id,
        "redirect_uris": list(redirect_uris),
        "grant_types": ["authorization_code"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
        "application_type": "web",
    }


def node_executable() -> str:
    """The `node` to run the provider with, or an error that says what is missing."""
    node = shutil.which("node")
    if node is None:
        raise IdentityProviderError(
            "Node.js is not installed (`node` is not on PATH); the identity provider tests need "
            "Node >= 20.19 and `npm ci` in tests/identity_provider (`make test` runs it)"
        )
    if not (PROVIDER_DIR / "node_modules" / "oidc-provider").is_dir():
        raise IdentityProviderError(
            "oidc-provider is not installed: run `npm ci` in tests/identity_provider "
            "(`make test` runs it)"
        )
    return node


class IdentityProvider:
    """One oidc-provider process: its own issuer URL, keys, clients and accounts.

    The confidential test client is always registered; `clients` adds others (see
    `public_client`). `accounts` maps a login to the claims its access tokens carry. Keys,
    accounts and clients can change while it runs, the HTTP server staying up.
    """

    def __init__(
        self,
        *,
        accounts: Mapping[str, Mapping[str, Any]] | None = None,
        clients: Sequence[Mapping[str, Any]] = (),
        audience: str = AUDIENCE,
        algorithms: Sequence[str] = ALGORITHMS,
        jwks_max_age: int | None = 300,
        cors_origins: Sequence[str] = (),
        access_token_ttl: int = 600,
    ) -> None:
        self.audience = audience
        self.algorithms = tuple(algorithms)
        self._config: dict[str, Any] = {
            "audience": audience,
            "algorithms": list(algorithms),
            "default_algorithm": algorithms[0],
            "jwks_max_age": jwks_max_age,
            "cors_origins": list(cors_origins),
            "access_token_ttl": access_token_ttl,
            "clients": [confidential_client(), *(dict(client) for client in clients)],
            "accounts": {login: dict(claims) for login, claims in (accounts or {}).items()},
        }
        self._workdir: tempfile.TemporaryDirectory[str] | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._admin: httpx.AsyncClient | None = None
        self._issuer: str | None = None

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Start Node on a free port of 127.0.0.1 and wait until discovery answers."""
        node = node_executable()
        self._workdir = tempfile.TemporaryDirectory(prefix="identity-provider-")
        workdir = Path(self._workdir.name)
        self._process = await asyncio.to_thread(_spawn, node, self._config, workdir)
        try:
            self._issuer = await self._wait_for_issuer(workdir / "stdout.log")
            self._admin = httpx.AsyncClient(base_url=self._issuer, timeout=HTTP_TIMEOUT_SECONDS)
            await self._wait_for_discovery()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL) and remove its files."""
        if self._admin is not None:
            await self._admin.aclose()
            self._admin = None
        if self._process is not None:
            await asyncio.to_thread(_terminate, self._process)
            self._process = None
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def issuer(self) -> str:
        if self._issuer is None:
            raise IdentityProviderError("the identity provider is not running")
        return self._issuer

    @property
    def jwks_uri(self) -> str:
        return f"{self.issuer}/jwks"

    def stderr(self) -> str:
        """What Node wrote on stderr so far (warnings, server errors)."""
        if self._workdir is None:
            return ""
        return _read(Path(self._workdir.name) / "stderr.log")

    def resource(self, *, alg: str | None = None, audience: str | None = None) -> str:
        """The resource indicator of access tokens for `audience` signed with `alg` (defaults:
        the provider's audience and first algorithm); pass it as `resource` when signing in."""
        query = urlencode({"aud": audience or self.audience, "alg": alg or self.algorithms[0]})
        return f"{RESOURCE_BASE}?{query}"

    def issuer_entry(self, **fields: Any) -> dict[str, Any]:
        """An `AUTH_ISSUERS` entry trusting this provider; `fields` adds or overrides keys."""
        entry: dict[str, Any] = {
            "issuer": self.issuer,
            "audiences": [self.audience],
            "algorithms": list(self.algorithms),
        }
        entry.update(fields)
        return entry

    # --- tokens ------------------------------------------------------------------------------

    async def access_token(
        self,
        login: str,
        *,
        alg: str | None = None,
        audience: str | None = None,
        scope: str = "openid memory",
        client: OAuthClient = TEST_CLIENT,
        origin: str | None = None,
    ) -> str:
        """A new access token of `login`, by the authorization code flow with PKCE through the
        provider's sign-in and consent forms (the password is not checked). `origin` is sent
        on the token request, as a browser application's would be (CORS)."""
        verifier = secrets.token_urlsafe(48)
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
        state = secrets.token_urlsafe(16)
        query = {
            "client_id": client.client_id,
            "response_type": "code",
            "redirect_uri": client.redirect_uri,
            "scope": scope,
            "state": state,
            "code_challenge": challenge.rstrip(b"=").decode(),
            "code_challenge_method": "S256",
            "resource": self.resource(alg=alg, audience=audience),
        }
        form = {
            "grant_type": "authorization_code",
            "redirect_uri": client.redirect_uri,
            "code_verifier": verifier,
        }
        auth = httpx.Auth()  # sends the request as it is
        if client.secret is None:
            form["client_id"] = client.client_id
        else:
            auth = httpx.BasicAuth(client.client_id, client.secret)
        headers = {"Origin": origin} if origin else {}
        async with httpx.AsyncClient(timeout=HTTP_TIMEOUT_SECONDS) as browser:
            authorize = f"{self.issuer}/auth?{urlencode(query)}"
            form["code"] = await self._sign_in(browser, authorize, login, client, state)
            response = await browser.post(
                f"{self.issuer}/token", data=form, auth=auth, headers=headers
            )
        if response.status_code != 200:
            raise IdentityProviderError(
                f"token endpoint answered {response.status_code}: {response.text}"
            )
        token = response.json().get("access_token")
        if not isinstance(token, str):
            raise IdentityProviderError(f"no access token in {response.text}")
        return token

    async def sign_in(self, authorization_url: str, login: str, *, redirect_uri: str) -> str:
        """Open `authorization_url` (the provider's authorization endpoint with a client's own
        request) with a fresh cookie jar, answer the sign-in form as `login` and the consent
        form, and return the URL the provider redirects to at `redirect_uri`: its query holds
        the authorization response (`code`, `state`, `iss`, or an `error`), checked by nobody
        here."""
        async with httpx.AsyncClient(timeout=HTTP_TIMEOUT_SECONDS) as browser:
            return await self._follow_sign_in(browser, authorization_url, login, redirect_uri)

    async def _sign_in(
        self, browser: httpx.AsyncClient, url: str, login: str, client: OAuthClient, state: str
    ) -> str:
        """Follow the provider's redirects and fill its forms until it redirects to the client
        with a code; return the code."""
        location = await self._follow_sign_in(browser, url, login, client.redirect_uri)
        return self._code_from(location, state)

    async def _follow_sign_in(
        self, browser: httpx.AsyncClient, url: str, login: str, redirect_uri: str
    ) -> str:
        """Follow the provider's redirects and fill its forms until it redirects to
        `redirect_uri`; return that redirect's URL."""
        response = await browser.get(url)
        for _ in range(MAX_FORM_STEPS):
            if response.is_redirect:
                location = urljoin(str(response.url), response.headers["location"])
                if location.startswith(redirect_uri):
                    return location
                response = await browser.get(location)
                continue
            if response.status_code != 200:
                raise IdentityProviderError(
                    f"sign-in of {login!r}: {response.status_code} at {response.url}: "
                    f"{response.text[:2000]}"
                )
            page_form = _prompt_form(response.text)
            if page_form is None:
                raise IdentityProviderError(f"sign-in of {login!r}: no form at {response.url}")
            fields = dict(page_form.fields)
            if fields.get("prompt") == "login":
                fields.update(login=login, password="any-password")
            target = urljoin(str(response.url), page_form.action)
            response = await browser.post(target, data=fields)
        raise IdentityProviderError(
            f"sign-in of {login!r} did not finish in {MAX_FORM_STEPS} steps"
        )

    def _code_from(self, location: str, state: str) -> str:
        params = parse_qs(urlsplit(location).query)
        if "error" in params:
            raise IdentityProviderError(f"authorization refused: {params}")
        if params.get("state") != [state] or params.get("iss") != [self.issuer]:
            raise IdentityProviderError(f"unexpected state or issuer in {location}")
        return params["code"][0]

    # --- test-only administration ------------------------------------------------------------

    async def keys(self) -> list[SigningKey]:
        """The published keys, in publication order."""
        return [SigningKey(**key) for key in await self._call("GET", "/keys")]

    async def signing_kid(self, alg: str) -> str:
        return next(key.kid for key in await self.keys() if key.alg == alg and key.signing)

    async def publish_key(self, alg: str) -> str:
        """Publish a new `alg` key next to the others; it does not sign yet. Returns its kid."""
        created = await self._call("POST", "/keys", {"alg": alg})
        return str(created["kid"])

    async def sign_with(self, kid: str) -> None:
        """Sign access tokens of the key's algorithm with it from now on."""
        await self._call("POST", f"/keys/{kid}/sign")

    async def withdraw(self, kid: str) -> None:
        """Remove a key that no longer signs from the JWKS."""
        await self._call("DELETE", f"/keys/{kid}")

    async def rotate(self, alg: str, *, pause: float = 0.0) -> KeyRotation:
        """A rolling key rotation: publish a new key, sign with it, withdraw the old one,
        waiting `pause` seconds between the steps."""
        old_kid = await self.signing_kid(alg)
        new_kid = await self.publish_key(alg)
        await asyncio.sleep(pause)
        await self.sign_with(new_kid)
        await asyncio.sleep(pause)
        await self.withdraw(old_kid)
        return KeyRotation(alg, old_kid, new_kid)

    async def add_account(self, login: str, claims: Mapping[str, Any]) -> None:
        """Give `login` these claims (replacing earlier ones) in tokens issued from now on."""
        await self._call("PUT", f"/accounts/{login}", dict(claims))

    async def register_client(self, metadata: Mapping[str, Any]) -> None:
        """Register a client (replacing one with the same client_id), e.g. `public_client`."""
        await self._call("POST", "/clients", dict(metadata))

    async def set_jwks_max_age(self, seconds: int | None) -> None:
        """The JWKS' Cache-Control max-age from now on; None sends `no-store`."""
        await self._call("PUT", "/jwks-cache", {"max_age": seconds})

    async def jwks_requests(self) -> int:
        """How many times the JWKS was fetched since the start."""
        return int((await self._call("GET", "/stats"))["jwks_requests"])

    async def _call(self, method: str, path: str, body: Any = None) -> Any:
        if self._admin is None:
            raise IdentityProviderError("the identity provider is not running")
        response = await self._admin.request(method, f"/__test__{path}", json=body)
        if response.status_code >= 300:
            raise IdentityProviderError(f"{method} {path}: {response.status_code} {response.text}")
        return response.json()

    # --- start-up ----------------------------------------------------------------------------

    async def _wait_for_issuer(self, stdout_path: Path) -> str:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            line = (await asyncio.to_thread(_read, stdout_path)).partition("\n")
            if line[1]:
                return str(json.loads(line[0])["issuer"])
            self._raise_if_exited()
            await asyncio.sleep(0.05)
        raise IdentityProviderError(
            f"the identity provider did not listen within {START_TIMEOUT_SECONDS:.0f} s; "
            f"stderr:\n{self.stderr()}"
        )

    async def _wait_for_discovery(self) -> None:
        assert self._admin is not None
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        last = "no answer"
        while time.monotonic() < deadline:
            self._raise_if_exited()
            try:
                response = await self._admin.get("/.well-known/openid-configuration")
            except httpx.TransportError as error:
                last = repr(error)
            else:
                if response.status_code == 200 and response.json().get("issuer") == self.issuer:
                    return
                last = f"{response.status_code} {response.text[:500]}"
            await asyncio.sleep(0.05)
        raise IdentityProviderError(
            f"discovery at {self.issuer} did not answer ({last}); stderr:\n{self.stderr()}"
        )

    def _raise_if_exited(self) -> None:
        if self._process is not None and self._process.poll() is not None:
            raise IdentityProviderError(
                f"the identity provider exited with status {self._process.returncode}; "
                f"stderr:\n{self.stderr()}"
            )


@dataclass(frozen=True, slots=True)
class _Form:
    action: str
    fields: tuple[tuple[str, str], ...]


class _FormParser(HTMLParser):
    """The POST forms of a page with their inputs' names and values."""

    def __init__(self) -> None:
        super().__init__()
        self.forms: list[_Form] = []
        self._action: str | None = None
        self._fields: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {name: value or "" for name, value in attrs}
        if tag == "form" and attributes.get("method", "get").lower() == "post":
            self._action, self._fields = attributes.get("action", ""), []
        elif tag == "input" and self._action is not None and attributes.get("name"):
            self._fields.append((attributes["name"], attributes.get("value", "")))

    def handle_endtag(self, tag: str) -> None:
        if tag == "form" and self._action is not None:
            self.forms.append(_Form(self._action, tuple(self._fields)))
            self._action = None


def _prompt_form(page: str) -> _Form | None:
    """The page's sign-in or consent form: the one that carries a `prompt`."""
    parser = _FormParser()
    parser.feed(page)
    return next((form for form in parser.forms if dict(form.fields).get("prompt")), None)


def _spawn(node: str, config: Mapping[str, Any], workdir: Path) -> subprocess.Popen[bytes]:
    """Write the configuration and start Node, its output going to files in `workdir`."""
    config_path = workdir / "provider.json"
    config_path.write_text(json.dumps(config), encoding="utf-8")
    command = [node, str(PROVIDER_SCRIPT), "--config", str(config_path), "--port", "0"]
    with (workdir / "stdout.log").open("wb") as stdout, (workdir / "stderr.log").open("wb") as err:
        return subprocess.Popen(
            command, cwd=PROVIDER_DIR, stdin=subprocess.DEVNULL, stdout=stdout, stderr=err
        )


def _terminate(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=STOP_TIMEOUT_SECONDS)


def _read(path: Path) -> str:
    with contextlib.suppress(FileNotFoundError):
        return path.read_text(encoding="utf-8", errors="replace")
    return ""


@pytest.fixture(name="identity_provider", scope="module")
async def identity_provider_fixture() -> AsyncIterator[IdentityProvider]:
    """An identity provider per test module: the test client, no accounts (add them with
    `add_account`). Register it with
    `from tests.helpers.identity_provider import identity_provider_fixture  # noqa: F401`."""
    async with IdentityProvider() as provider:
        yield provider
