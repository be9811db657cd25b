"""What the browser tests share: where Debian's Chromium is and how it is started, the guard that
keeps a page on 127.0.0.1, and the numbered screenshots each test writes to
`var/artifacts/browser/`."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from playwright.async_api import BrowserContext, ConsoleMessage, Page, Route, ViewportSize

from app.kit.config import PROJECT_ROOT

ARTIFACTS = PROJECT_ROOT / "var" / "artifacts" / "browser"
SYSTEM_CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
LOCAL_HOST = "127.0.0.1"
DESKTOP: ViewportSize = {"width": 1100, "height": 900}


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def chromium_executable() -> str | None:
    """Debian's Chromium: on PATH, or where the package installs it."""
    found = shutil.which("chromium")
    if found:
        return found
    return str(SYSTEM_CHROMIUM) if SYSTEM_CHROMIUM.is_file() else None


@dataclass
class Guard:
    """What the page tried that it must not: requests to any host but 127.0.0.1, script errors
    and Content-Security-Policy violations."""

    blocked: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    csp_violations: list[str] = field(default_factory=list)

    async def route(self, route: Route) -> None:
        url = route.request.url
        parts = urlsplit(url)
        if parts.scheme in ("http", "https", "ws", "wss") and parts.hostname != LOCAL_HOST:
            self.blocked.append(url)
            await route.abort("blockedbyclient")
            return
        await route.continue_()

    def console(self, message: ConsoleMessage) -> None:
        if "Content Security Policy" in message.text:
            self.csp_violations.append(message.text)

    def problems(self) -> list[str]:
        return (
            [f"request off the machine: {url}" for url in self.blocked]
            + [f"script error: {error}" for error in self.page_errors]
            + [f"CSP violation: {text}" for text in self.csp_violations]
        )

    def assert_clean(self) -> None:
        """Fail now (not at teardown) on anything seen so far; what is reported is forgotten."""
        problems = self.problems()
        self.blocked.clear()
        self.page_errors.clear()
        self.csp_violations.clear()
        assert not problems, "\n".join(problems)


@dataclass
class Sent:
    """What the pages of a context sent, request by request (URL without its fragment, which no
    request carries, every header, the body), recorded by a route that then lets the request go
    on as before: to show that a value never left the page."""

    requests: list[str] = field(default_factory=list)

    async def route(self, route: Route) -> None:
        request = route.request
        headers = await request.all_headers()
        self.requests.append(
            "\n".join(
                [
                    urlsplit(request.url)._replace(fragment="").geturl(),
                    *(f"{name}: {value}" for name, value in headers.items()),
                    request.post_data or "",
                ]
            )
        )
        await route.fallback()

    def carrying(self, value: str) -> list[str]:
        return [sent for sent in self.requests if value in sent]


async def record_sent(context: BrowserContext) -> Sent:
    """A `Sent` for every request of `context` from now on (ahead of the routes set before)."""
    sent = Sent()
    await context.route("**/*", sent.route)
    return sent


@dataclass
class Shots:
    """Full-page screenshots of one test, numbered in the order taken."""

    page: Page
    test: str
    taken: list[Path] = field(default_factory=list)

    async def __call__(self, step: str, *, full_page: bool = True) -> Path:
        if not self.taken:  # this run's screenshots replace the last run's, none left over
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            for old in ARTIFACTS.glob(f"{self.test}-[0-9][0-9]-*.png"):
                old.unlink()
        path = ARTIFACTS / f"{self.test}-{len(self.taken) + 1:02d}-{step}.png"
        await self.page.screenshot(path=str(path), full_page=full_page)
        self.taken.append(path)
        return path


@dataclass
class BrowserPage:
    page: Page
    context: BrowserContext
    guard: Guard
    shot: Shots


AXE_SCRIPT = PROJECT_ROOT / "tests" / "browser" / "axe" / "node_modules" / "axe-core" / "axe.min.js"
BLOCKING_IMPACTS = frozenset({"serious", "critical"})


async def serious_violations(page: Page) -> list[str]:
    """axe-core's serious and critical violations on the page as it stands, one line each
    (rule, impact, the first offending elements). axe-core is evaluated by the driver, not
    loaded by the page, so the page's Content-Security-Policy stays as served."""
    if not AXE_SCRIPT.is_file():
        raise AssertionError(f"{AXE_SCRIPT} is missing: run `make test-browser` (needs npm)")
    if not await page.evaluate("() => typeof axe === 'object'"):
        await page.evaluate(AXE_SCRIPT.read_text(encoding="utf-8"))
    results = await page.evaluate("() => axe.run(document, { resultTypes: ['violations'] })")
    return [
        f"{violation['id']} ({violation['impact']}): "
        + "; ".join(" ".join(node["target"]) for node in violation["nodes"][:3])
        for violation in results["violations"]
        if violation["impact"] in BLOCKING_IMPACTS
    ]
