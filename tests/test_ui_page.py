"""The files of the memory page and the admin console as the service serves them: their types
and security headers (a Content-Security-Policy that adds exactly the OpenID issuer's origin,
and only for `connect-src`, when the page signs in with it), the sign-in configuration it reads
and nothing more, markup the policy can run as written (no inline script, style or handler), a
token field a form could never submit, and a script that keeps the token out of storage and puts
the service's text on the page as text only. The page at work: `tests/browser/`."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest

from app.kit.config import PROJECT_ROOT, Settings
from app.ui.router import issuer_origin
from tests.helpers.apps import TEST_JWT_SECRET, client_with

PAGE = "/ui/memory"
ADMIN = "/ui/admin"
CONFIG = "/ui/config.json"
FILES = {
    PAGE: "text/html; charset=utf-8",
    ADMIN: "text/html; charset=utf-8",
    "/ui/assets/memory.css": "text/css; charset=utf-8",
    "/ui/assets/memory.js": "text/javascript; charset=utf-8",
    "/ui/assets/signin.js": "text/javascript; charset=utf-8",
    "/ui/assets/admin.css": "text/css; charset=utf-8",
    "/ui/assets/admin.js": "text/javascript; charset=utf-8",
}
UI = PROJECT_ROOT / "app" / "ui"
SIGN_IN_SCRIPT = UI / "signin.js"
# each page's own script, after the shared sign-in script
PAGE_SCRIPTS = {PAGE: UI / "memory.js", ADMIN: UI / "admin.js"}
SCRIPTS = [SIGN_IN_SCRIPT, *PAGE_SCRIPTS.values()]
POLICY_WITHOUT_SIGN_IN = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
ISSUER = "https://login.example.com:8443/realms/acme"
SIGN_IN = {
    "ui_oidc_issuer": ISSUER,
    "ui_oidc_client_id": "memory-page",
    "ui_oidc_scope": "openid memory",
    "ui_oidc_extra_params": {"resource": "https://memory.example.com/"},
}
OTHER_HEADERS = {
    "referrer-policy": "no-referrer",
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "cross-origin-opener-policy": "same-origin",
    "cache-control": "no-cache",
}


def directives(policy: str) -> dict[str, str]:
    return dict(directive.partition(" ")[::2] for directive in policy.split("; "))


@pytest.mark.parametrize(("path", "media_type"), sorted(FILES.items()))
async def test_each_file_is_served_with_its_type_and_the_security_headers(
    client: httpx.AsyncClient, path: str, media_type: str
) -> None:
    response = await client.get(path)
    assert response.status_code == 200
    assert response.headers["content-type"] == media_type
    assert {name: response.headers[name] for name in OTHER_HEADERS} == OTHER_HEADERS
    policy = directives(response.headers["content-security-policy"])
    assert policy["default-src"] == "'self'"
    assert policy["script-src"] == "'self'"
    assert policy["style-src"] == "'self'"
    assert policy["connect-src"] == "'self'"
    assert policy["frame-ancestors"] == "'none'"
    assert policy["form-action"] == "'none'"
    assert "unsafe" not in response.headers["content-security-policy"]


@pytest.mark.parametrize("path", [*sorted(FILES), CONFIG])
async def test_without_sign_in_the_policy_allows_this_origin_only(
    client: httpx.AsyncClient, path: str
) -> None:
    response = await client.get(path)
    assert response.status_code == 200
    assert response.headers["content-security-policy"] == POLICY_WITHOUT_SIGN_IN


async def test_with_sign_in_the_policy_adds_exactly_the_issuers_origin_to_connect_src(
    database_url: str,
) -> None:
    expected = directives(POLICY_WITHOUT_SIGN_IN) | {
        "connect-src": "'self' https://login.example.com:8443"
    }
    async with client_with(database_url, **SIGN_IN) as http:
        for path in [*sorted(FILES), CONFIG]:
            response = await http.get(path)
            assert response.status_code == 200, path
            policy = response.headers["content-security-policy"]
            assert directives(policy) == expected, path
            assert list(directives(policy)) == list(directives(POLICY_WITHOUT_SIGN_IN)), path
            assert {name: response.headers[name] for name in OTHER_HEADERS} == OTHER_HEADERS


@pytest.mark.parametrize(
    ("issuer", "origin"),
    [
        ("https://login.example.com", "https://login.example.com"),
        ("https://login.example.com/", "https://login.example.com"),
        ("https://Login.Example.COM/realms/acme", "https://login.example.com"),
        ("https://login.example.com:443/tenant/v2.0", "https://login.example.com:443"),
        ("http://127.0.0.1:9000/issuer?x=1#f", "http://127.0.0.1:9000"),
        ("HTTPS://[::1]:8443/", "https://[::1]:8443"),
    ],
)
def test_the_issuers_origin_is_its_scheme_host_and_port(issuer: str, origin: str) -> None:
    assert issuer_origin(issuer) == origin


@pytest.mark.parametrize(
    "issuer",
    [
        "login.example.com",
        "ftp://login.example.com",
        "javascript:alert(1)",
        "https://",
        "https://user:secret@login.example.com",
        "https://login.example.com; script-src *",
        "https://login.example.com\r\nSet-Cookie: a=b",
        "https://*.example.com",
        "https://login.example.com:99999",
    ],
)
def test_an_issuer_that_is_not_one_http_origin_is_refused(issuer: str) -> None:
    with pytest.raises(ValueError, match="UI_OIDC_ISSUER"):
        issuer_origin(issuer)


async def test_without_sign_in_the_page_is_told_there_is_none(client: httpx.AsyncClient) -> None:
    response = await client.get(CONFIG)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"sign_in": None}


async def test_the_sign_in_configuration_holds_the_public_client_and_nothing_else(
    database_url: str,
) -> None:
    async with client_with(database_url, **SIGN_IN) as http:
        response = await http.get(CONFIG)
    assert response.status_code == 200
    assert response.json() == {
        "sign_in": {
            "issuer": ISSUER,
            "client_id": "memory-page",
            "scope": "openid memory",
            "extra_params": {"resource": "https://memory.example.com/"},
        }
    }
    text = response.text
    for private in (TEST_JWT_SECRET, database_url, "secret", "password", "postgres"):
        assert private not in text
    # a public client: there is no secret to configure, so none can be handed out
    assert [name for name in Settings.model_fields if name.startswith("ui_")] == [
        "ui_oidc_issuer",
        "ui_oidc_client_id",
        "ui_oidc_scope",
        "ui_oidc_extra_params",
    ]


async def test_the_page_is_not_part_of_the_api_description(client: httpx.AsyncClient) -> None:
    paths = (await client.get("/openapi.json")).json()["paths"]
    assert not [path for path in paths if path.startswith("/ui")]


class _Markup(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.script_text: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.script_text.append(data)


@pytest.mark.parametrize("page", sorted(PAGE_SCRIPTS))
async def test_the_markup_needs_nothing_the_policy_forbids(
    client: httpx.AsyncClient, page: str
) -> None:
    markup = _Markup()
    markup.feed((await client.get(page)).text)
    scripts = [attrs for tag, attrs in markup.tags if tag == "script"]
    assert scripts == [
        {"src": "assets/signin.js", "defer": None},
        {"src": f"assets/{PAGE_SCRIPTS[page].name}", "defer": None},
    ]
    assert not markup.script_text
    assert "style" not in [tag for tag, _ in markup.tags]
    for tag, attrs in markup.tags:
        inline = [name for name in attrs if name == "style" or name.startswith("on")]
        assert not inline, f"<{tag}> has {inline}"
        for name in ("src", "href"):
            value = attrs.get(name) or ""
            assert not re.match(r"(https?:)?//", value), f"<{tag} {name}={value}> is off-site"


@pytest.mark.parametrize("page", sorted(PAGE_SCRIPTS))
async def test_the_token_field_has_no_name_a_form_could_submit(
    client: httpx.AsyncClient, page: str
) -> None:
    markup = _Markup()
    markup.feed((await client.get(page)).text)
    fields = [attrs for tag, attrs in markup.tags if tag == "input"]
    token = next(attrs for attrs in fields if attrs.get("id") == "token")
    assert token["type"] == "password"
    assert "name" not in token


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda script: script.name)
def test_the_scripts_keep_the_token_in_memory_and_write_text_only(script: Path) -> None:
    source = script.read_text(encoding="utf-8")
    for forbidden in (
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "localStorage",
        "indexedDB",
        "document.cookie",
        "eval(",
        "new Function",
    ):
        assert forbidden not in source, forbidden
    if script != SIGN_IN_SCRIPT:
        code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("//"))
        assert "sessionStorage" not in code  # the shared sign-in script is its only user
        assert "ContextMemorySignIn.tokenFromFragment()" in source
        assert "storageKey: " in source


def test_the_sign_in_script_keeps_only_the_pending_sign_in_in_session_storage() -> None:
    source = SIGN_IN_SCRIPT.read_text(encoding="utf-8")
    assert "history.replaceState" in source
    # session storage holds the pending sign-in across the redirect, under the page's one key,
    # and nothing else: written once, read and removed together
    uses = re.findall(r"sessionStorage\.(\w+)\(([^()]*(?:\([^()]*\))?)\)", source)
    assert sorted(uses) == [
        ("getItem", "storageKey"),
        ("removeItem", "storageKey"),
        ("setItem", "storageKey, JSON.stringify(pending)"),
    ]
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("//"))
    assert code.count("sessionStorage") == len(uses)
    pending = re.search(r"const pending = \{([^}]*)\};", source)
    assert pending is not None
    assert re.findall(r"(\w+):", pending.group(1)) == ["issuer", "state", "nonce", "verifier"]


def test_the_sign_in_is_the_code_flow_with_pkce_and_random_state_and_nonce() -> None:
    source = SIGN_IN_SCRIPT.read_text(encoding="utf-8")
    assert 'response_type: "code"' in source
    assert 'code_challenge_method: "S256"' in source
    assert 'crypto.subtle.digest("SHA-256"' in source
    assert "crypto.getRandomValues" in source
    assert "Math.random" not in source
    for page_script in PAGE_SCRIPTS.values():  # a navigation, not a form: form-action 'none'
        assert "location.assign(" in page_script.read_text(encoding="utf-8")
    assert "/.well-known/openid-configuration" in source


def _functions(source: str, indent: int = 2) -> dict[str, str]:
    """The script's functions at `indent` (2: the top of its closure), by name: each one's
    text up to the line that closes it."""
    pad = " " * indent
    found = re.finditer(
        rf"^{pad}(?:async )?function (\w+)\(.*?^{pad}\}}$", source, flags=re.MULTILINE | re.DOTALL
    )
    return {match.group(1): match.group(0) for match in found}


@pytest.mark.parametrize("page", sorted(PAGE_SCRIPTS))
def test_a_token_from_a_link_is_used_only_when_the_page_opens_without_sign_in(page: str) -> None:
    source = PAGE_SCRIPTS[page].read_text(encoding="utf-8")
    shared = SIGN_IN_SCRIPT.read_text(encoding="utf-8")
    functions = _functions(source)
    # a changed fragment (a link to the open page) goes to one function, which uses no token
    assert re.findall(r'addEventListener\("hashchange", ([^)]*)\)', source) == [
        "tokenFromChangedFragment"
    ]
    changed = functions["tokenFromChangedFragment"]
    assert "tokenFromFragment()" in changed
    assert "useToken" not in changed
    assert "tokenFromOpeningLink" not in changed
    # the token of the opening link: used in the last branch only, once the configuration was
    # read and says there is no sign-in
    opening = functions["tokenFromOpeningLink"]
    branches = re.fullmatch(
        r"\s*if \(!signIn\.configKnown\) \{(?P<unknown>[^{}]*)\}"
        r" else if \(signIn\.config\) \{(?P<sign_in>[^{}]*)\}"
        r" else \{\s*useToken\(token\);\s*\}\s*",
        opening[opening.index("{") + 1 : opening.rindex("}")],
    )
    assert branches is not None, opening
    assert "useToken" not in branches.group("unknown") + branches.group("sign_in")
    # ... and the page reads that configuration before it decides
    start = functions["start"]
    assert start.index("await signIn.loadConfig()") < start.index("tokenFromOpeningLink(linked)")
    assert "configKnown =" not in source  # set by the shared script only, when it reads it
    setters = [name for name, text in _functions(shared, 4).items() if "configKnown =" in text]
    assert setters == ["loadConfig"]
    loader = _functions(shared, 4)["loadConfig"]
    assert 'signIn.configKnown = typeof config === "object";' in loader
    # a token reaches `useToken` from the opening link, the pasted field and a finished sign-in
    callers = sorted(
        name for name, text in functions.items() if name != "useToken" and "useToken(" in text
    )
    assert callers == ["start", "tokenFromOpeningLink"]
    # ... a finished sign-in through the shared flow, the one place of the shared script that
    # calls it, handed the page's `useToken` once
    assert source.count("useToken: (token, options) => useToken(token, options)") == 1
    shared_callers = [name for name, text in _functions(shared, 4).items() if "useToken(" in text]
    assert shared_callers == ["complete"]
    assert functions["start"].count("useToken(") == 1
    assert "useToken(token)" in start
    # the fragment's only readers: the opening and a change, each of which removes it at once
    readers = sorted(
        name
        for name, text in functions.items()
        if name != "tokenFromFragment" and "tokenFromFragment()" in text
    )
    assert readers == ["start", "tokenFromChangedFragment"]
    fragment = _functions(shared)["tokenFromFragment"]
    assert fragment.index("history.replaceState(") < fragment.index("return token")
