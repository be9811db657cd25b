"""Fixtures of the browser tests: Debian's Chromium driven headless by Playwright, the app served
by uvicorn on a free port of 127.0.0.1, a page that may reach nothing but that address, and the
screenshots each test writes to `var/artifacts/browser/`.

Playwright's own browser download is not used: the tests launch the system's `chromium` and are
skipped, with the command that installs it, where there is none. Playwright starts it on a
fresh temporary profile directory that it deletes afterwards.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.async_api import Browser, Playwright, Route, async_playwright
from playwright.async_api import Error as PlaywrightError

from app.kit.config import Settings
from app.main import create_app
from tests.browser.harness import (
    CHROMIUM_ARGS,
    DESKTOP,
    LOCAL_HOST,
    BrowserPage,
    Guard,
    Shots,
    chromium_executable,
    origin_of,
)
from tests.helpers.identity_provider import IdentityProvider
from tests.helpers.serving import served


@pytest.fixture(scope="session")
def chromium_path() -> str:
    path = chromium_executable()
    if path is None:
        pytest.skip("Chromium not installed: run `make test-browser`")
    return path


@pytest.fixture(scope="session")
async def playwright() -> AsyncIterator[Playwright]:
    async with async_playwright() as driver:
        yield driver


@pytest.fixture(scope="session")
async def browser(playwright: Playwright, chromium_path: str) -> AsyncIterator[Browser]:
    chromium = await playwright.chromium.launch(
        executable_path=chromium_path, headless=True, args=list(CHROMIUM_ARGS)
    )
    try:
        yield chromium
    finally:
        await chromium.close()


@pytest.fixture(scope="module")
async def base_url(settings: Settings) -> AsyncIterator[str]:
    """The app served by uvicorn on 127.0.0.1 (its own lifespan, the test database)."""
    async with served(create_app(settings)) as url:
        yield url


@pytest.fixture
async def api(base_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """The public API over real HTTP, for what happens behind the page's back."""
    async with httpx.AsyncClient(base_url=base_url) as http:
        yield http


@pytest.fixture
async def web(browser: Browser, request: pytest.FixtureRequest) -> AsyncIterator[BrowserPage]:
    """A page in a fresh browser context that may only talk to 127.0.0.1; the test fails when
    the page tried anything else, threw a script error or broke its Content-Security-Policy."""
    context = await browser.new_context(viewport=DESKTOP, accept_downloads=True)
    guard = Guard()
    await context.route("**/*", guard.route)
    page = await context.new_page()
    page.on("pageerror", lambda error: guard.page_errors.append(str(error)))
    page.on("console", guard.console)
    name = re.sub(r"[^A-Za-z0-9_-]+", "_", request.node.name).strip("_")
    try:
        yield BrowserPage(page, context, guard, Shots(page, name))
    finally:
        with contextlib.suppress(PlaywrightError):  # the browser went away with the failure
            await context.close()
    guard.assert_clean()


@pytest.fixture
async def provider_pages(web: BrowserPage, provider: IdentityProvider) -> list[str]:
    """Requests off the machine that the OpenID provider's own pages make (its web font):
    blocked, and listed here instead of failing the guard. Anything else still reaches the
    guard. `provider` is the module's identity provider fixture."""
    blocked: list[str] = []
    provider_origin = origin_of(provider.issuer)

    async def route(route: Route) -> None:
        request = route.request
        off_machine = urlsplit(request.url).hostname != LOCAL_HOST
        if off_machine and origin_of(request.frame.url) == provider_origin:
            blocked.append(request.url)
            await route.abort("blockedbyclient")
            return
        await route.fallback()

    await web.context.route("**/*", route)
    return blocked
