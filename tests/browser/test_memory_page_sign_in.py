"""The memory page signs in with a real OpenID Provider (oidc-provider, run by Node on 127.0.0.1)
in headless Chromium: the authorization code flow with PKCE as a public client, the provider's
own login and consent pages, the access token used for `/v1/me/*` (the service trusts the
provider through AUTH_ISSUERS), an address bar and storage left clean, and a sign-out that ends
the provider's session too. Answers that do not belong to the sign-in the page started (another
`state`, another `nonce`) are refused, and a token in a link (`#token=`, on opening the page or
in a changed fragment) signs no one in. Screenshots of every step go to
`var/artifacts/browser/`.

The provider's pages import a web font from off the machine: that request, made by a provider
page only, is blocked like every other one, and recorded apart from the guard's failures.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import httpx
import pytest
from playwright.async_api import BrowserContext, Page, Request, Route, expect

from app.main import create_app
from app.profiles.document import Section
from tests.browser.harness import BrowserPage, Shots, record_sent
from tests.helpers.apps import COMPANY, make_settings
from tests.helpers.identity_provider import IdentityProvider, public_client
from tests.helpers.profiles import memory_md
from tests.helpers.serving import served

pytestmark = pytest.mark.browser

PAGE = "/ui/memory"
CLIENT_ID = "memory-page"
SCOPE = "openid memory"
LOGIN = "erin"
NOT_USED = "The token in the link was not used"


def with_query(url: str, **changes: str) -> str:
    parts = urlsplit(url)
    query = {name: values[-1] for name, values in parse_qs(parts.query).items()}
    return urlunsplit(parts._replace(query=urlencode({**query, **changes})))


@pytest.fixture(scope="module")
async def provider() -> AsyncIterator[IdentityProvider]:
    async with IdentityProvider() as identity_provider:
        yield identity_provider


@pytest.fixture(scope="module")
async def base_url(database_url: str, provider: IdentityProvider) -> AsyncIterator[str]:
    """The app trusting the provider's access tokens and offering sign-in with it; the page is
    registered at the provider as a public client once its address is known."""
    settings = make_settings(
        database_url,
        auth_issuers=[provider.issuer_entry(company=COMPANY)],
        ui_oidc_issuer=provider.issuer,
        ui_oidc_client_id=CLIENT_ID,
        ui_oidc_scope=SCOPE,
        ui_oidc_extra_params={"resource": provider.resource()},
    )
    async with served(create_app(settings)) as url:
        page_url = f"{url}{PAGE}"
        await provider.register_client(
            {**public_client(CLIENT_ID, [page_url]), "post_logout_redirect_uris": [page_url]}
        )
        yield url


def requests_to(page: Page, url: str) -> list[Request]:
    """The requests the page will make whose URL (without its query) is `url`."""
    seen: list[Request] = []

    def record(request: Request) -> None:
        if request.url.split("?")[0] == url:
            seen.append(request)

    page.on("request", record)
    return seen


def query_of(url: str) -> dict[str, str]:
    return {name: values[-1] for name, values in parse_qs(urlsplit(url).query).items()}


async def sign_in_at_provider(page: Page, provider: IdentityProvider, shot: Shots) -> None:
    """The provider's login form (any login), then its consent form if it asks; returns once
    the browser is back on the memory page."""
    await page.wait_for_url(f"{provider.issuer}/interaction/**")
    login = page.get_by_placeholder("Enter any login")
    await expect(login).to_be_visible()
    await login.fill(LOGIN)
    await page.get_by_placeholder("and password").fill("any-password")
    await shot("provider-login")
    await page.get_by_role("button", name="Sign-in").click()
    consent = page.get_by_role("button", name="Continue")
    await expect(consent.or_(page.locator("#main"))).to_be_visible()
    if await consent.count():
        await shot("provider-consent")
        await consent.click()
    await expect(page.locator("#main")).to_be_attached()


@pytest.mark.usefixtures("provider_pages")
async def test_a_user_signs_in_with_the_provider_sees_their_memory_and_signs_out(
    web: BrowserPage, base_url: str, provider: IdentityProvider
) -> None:
    page, shot = web.page, web.shot
    page_url = f"{base_url}{PAGE}"
    authorizations = requests_to(page, f"{provider.issuer}/auth")
    token_requests = requests_to(page, f"{provider.issuer}/token")

    # signed out: the page offers sign-in, and pasting a token stays for development
    await page.goto(page_url)
    sign_in = page.get_by_role("button", name="Sign in", exact=True)
    await expect(sign_in).to_be_visible()
    await expect(page.locator("#token-form")).to_be_visible()
    await expect(page.locator("#workspace")).to_be_hidden()
    await shot("signed-out")

    # the authorization request: code flow, PKCE S256, state, nonce, the service's resource
    await sign_in.click()
    await sign_in_at_provider(page, provider, shot)
    await page.wait_for_url(page_url)
    assert len(authorizations) == 1
    asked = query_of(authorizations[0].url)
    assert asked["response_type"] == "code"
    assert asked["client_id"] == CLIENT_ID
    assert asked["redirect_uri"] == page_url
    assert asked["scope"] == SCOPE
    assert asked["code_challenge_method"] == "S256"
    assert len(asked["code_challenge"]) == 43
    assert len(asked["state"]) >= 43
    assert len(asked["nonce"]) >= 43
    assert asked["state"] != asked["nonce"]
    assert asked["resource"] == provider.resource()
    assert "code_verifier" not in asked

    # signed in: the user's memory page, from the provider's access token
    await expect(page.locator("#workspace")).to_be_visible()
    await expect(page.locator("#who")).to_have_text(f"{LOGIN} ({COMPANY})")
    await expect(page.get_by_role("button", name="Sign out")).to_be_visible()
    await expect(sign_in).to_be_hidden()
    await expect(page.locator("#token-form")).to_be_hidden()
    await expect(page.locator("#profile")).to_contain_text("Nothing yet")
    await expect(page.get_by_role("switch", name="Context memory")).to_be_visible()
    await shot("signed-in")

    # ... with the code exchanged once, by the page, with its verifier
    assert len(token_requests) == 1
    exchange = token_requests[0]
    form = query_of(f"?{exchange.post_data or ''}")
    assert form["grant_type"] == "authorization_code"
    assert form["client_id"] == CLIENT_ID
    assert form["redirect_uri"] == page_url
    assert len(form["code_verifier"]) >= 43
    assert "client_secret" not in form
    response = await exchange.response()
    assert response is not None
    access_token = (await response.json())["access_token"]

    # the address bar holds no code or state, no storage anything, and no cookie the token
    assert page.url == page_url
    assert await page.evaluate("() => location.search + location.hash") == ""
    stored = await page.evaluate("() => [sessionStorage.length, localStorage.length]")
    assert stored == [0, 0]
    assert access_token not in await page.evaluate("() => document.cookie")
    async with httpx.AsyncClient(base_url=base_url) as api:
        me = await api.get("/v1/me", headers={"Authorization": f"Bearer {access_token}"})
    assert me.status_code == 200, me.text
    assert me.json()["user_id"] == LOGIN

    # sign out: the token is forgotten, the provider asks to end its session, and the page is
    # back signed out
    await page.get_by_role("button", name="Sign out").click()
    await page.wait_for_url(f"{provider.issuer}/**")
    confirm = page.get_by_role("button", name="Yes, sign me out")
    await expect(confirm).to_be_visible()
    await shot("provider-sign-out")
    await confirm.click()
    await page.wait_for_url(page_url)
    await expect(sign_in).to_be_visible()
    await expect(page.locator("#workspace")).to_be_hidden()
    await expect(page.locator("#signed-in")).to_be_hidden()
    await shot("signed-out-again")

    # the provider's session ended with it: signing in again asks for a login
    await sign_in.click()
    await page.wait_for_url(f"{provider.issuer}/interaction/**")
    await expect(page.get_by_placeholder("Enter any login")).to_be_visible()


async def forge_authorization(context: BrowserContext, issuer: str, parameter: str) -> None:
    """The page's authorization request reaches the provider with `parameter` set to "forged"
    (the provider's answer comes back through redirects, which routes do not see)."""

    async def forge(route: Route) -> None:
        url = route.request.url
        if query_of(url).get(parameter) != "forged":
            changed = with_query(url, **{parameter: "forged"})
            await route.fulfill(status=302, headers={"Location": changed})
            return
        await route.fallback()

    await context.route(lambda url: url.startswith(f"{issuer}/auth?"), forge)


@pytest.mark.usefixtures("provider_pages")
async def test_an_answer_with_another_state_is_refused_before_any_code_is_exchanged(
    web: BrowserPage, base_url: str, provider: IdentityProvider
) -> None:
    page, shot = web.page, web.shot
    page_url = f"{base_url}{PAGE}"
    token_requests = requests_to(page, f"{provider.issuer}/token")
    await forge_authorization(web.context, provider.issuer, "state")

    await page.goto(page_url)
    await page.get_by_role("button", name="Sign in", exact=True).click()
    await sign_in_at_provider(page, provider, shot)
    await page.wait_for_url(page_url)

    alert = page.get_by_role("alert")
    await expect(alert).to_contain_text("You were not signed in.")
    await expect(alert).to_contain_text("its state does not match")
    await expect(page.locator("#workspace")).to_be_hidden()
    await expect(page.get_by_role("button", name="Sign in", exact=True)).to_be_visible()
    assert page.url == page_url
    assert await page.evaluate("() => sessionStorage.length") == 0
    assert token_requests == []
    await shot("state-refused")


@pytest.mark.usefixtures("provider_pages")
async def test_an_id_token_with_another_nonce_is_refused_and_no_token_is_used(
    web: BrowserPage, base_url: str, provider: IdentityProvider
) -> None:
    page, shot = web.page, web.shot
    page_url = f"{base_url}{PAGE}"
    me_requests = requests_to(page, f"{base_url}/v1/me")
    await forge_authorization(web.context, provider.issuer, "nonce")

    await page.goto(page_url)
    await page.get_by_role("button", name="Sign in", exact=True).click()
    await sign_in_at_provider(page, provider, shot)
    await page.wait_for_url(page_url)

    alert = page.get_by_role("alert")
    await expect(alert).to_contain_text("You were not signed in.")
    await expect(alert).to_contain_text("its nonce does not match")
    await expect(page.locator("#workspace")).to_be_hidden()
    assert me_requests == []
    assert page.url == page_url
    assert await page.evaluate("() => sessionStorage.length") == 0
    await shot("nonce-refused")


async def attackers_token(base_url: str, provider: IdentityProvider, login: str) -> str:
    """An access token of another user of the company, from the company's provider, with a
    memory of their own: the service accepts it, so a page that used it would show that memory."""
    token = await provider.access_token(login)
    async with httpx.AsyncClient(base_url=base_url) as api:
        headers = {"Authorization": f"Bearer {token}"}
        me = await api.get("/v1/me", headers=headers)
        assert me.status_code == 200, me.text
        assert me.json()["user_id"] == login
        content = memory_md({Section.WORK: ["Planted by the link"]}, user_id=login)
        put = await api.put(
            "/v1/me/memory", json={"content": content}, headers={**headers, "If-None-Match": "*"}
        )
        assert put.status_code == 201, put.text
    return token


@pytest.mark.usefixtures("provider_pages")
async def test_a_token_in_the_link_signs_no_one_in_when_sign_in_is_configured(
    web: BrowserPage, base_url: str, provider: IdentityProvider
) -> None:
    page, shot = web.page, web.shot
    page_url = f"{base_url}{PAGE}"
    token = await attackers_token(base_url, provider, "mallory")
    sent = await record_sent(web.context)

    await page.goto(f"{page_url}#token={token}")
    status = page.locator("#status")
    await expect(status).to_contain_text(NOT_USED)
    await expect(status).to_contain_text("Sign in with your company account instead.")
    await expect(page.get_by_role("button", name="Sign in", exact=True)).to_be_visible()
    await expect(page.locator("#signed-in")).to_be_hidden()
    await expect(page.locator("#workspace")).to_be_hidden()
    await shot("link-token-ignored")

    # the token left the address bar and the page, and no request carried it
    assert page.url == page_url
    assert await page.evaluate("() => location.hash") == ""
    assert token not in await page.content()
    assert any("/ui/config.json" in request for request in sent.requests)
    assert sent.carrying(token) == []
    assert not [request for request in sent.requests if "authorization:" in request.lower()]


@pytest.mark.usefixtures("provider_pages")
async def test_a_token_in_a_changed_fragment_does_not_switch_the_signed_in_user(
    web: BrowserPage, base_url: str, provider: IdentityProvider
) -> None:
    page, shot = web.page, web.shot
    page_url = f"{base_url}{PAGE}"
    token = await attackers_token(base_url, provider, "trudy")
    sent = await record_sent(web.context)

    await page.goto(page_url)
    await page.get_by_role("button", name="Sign in", exact=True).click()
    await sign_in_at_provider(page, provider, shot)
    await page.wait_for_url(page_url)
    await expect(page.locator("#workspace")).to_be_visible()
    await expect(page.locator("#who")).to_have_text(f"{LOGIN} ({COMPANY})")
    editor = page.locator("#editor")
    unsaved = f"{await editor.input_value()}\n- Not saved yet"
    await editor.fill(unsaved)
    # the recorder sees the bearer tokens the page sends: erin's, from the sign-in
    assert any("authorization: bearer" in request.lower() for request in sent.requests)

    # a link to the open page with the attacker's token: a same-document navigation
    await page.evaluate("(token) => { location.hash = `token=${token}`; }", token)
    status = page.locator("#status")
    await expect(status).to_contain_text(NOT_USED)
    await expect(status).to_contain_text(f"you are still signed in as {LOGIN} ({COMPANY})")
    await expect(page.locator("#who")).to_have_text(f"{LOGIN} ({COMPANY})")
    await expect(page.locator("#profile")).not_to_contain_text("Planted by the link")
    await expect(editor).to_have_value(unsaved)
    await shot("changed-fragment-ignored")
    assert page.url == page_url
    assert await page.evaluate("() => location.hash") == ""
    assert token not in await page.content()
    assert sent.carrying(token) == []
