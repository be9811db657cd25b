"""The admin console (`/ui/admin`) in headless Chromium against the real app on real PostgreSQL,
signed in through a real OpenID Provider (oidc-provider on Node, the code flow with PKCE) as each
of its three kinds of caller, each driving its pages' main actions through the public API:

- a space admin opens a space, turns Context memory off and on, turns web search on and sees the
  switch disabled with the seed's tooltip (and a click that changes nothing), and saves the
  consolidation settings, a Max Tokens outside 500..8000 refused before any request;
- an operator changes a feature flag and a rate limit, reads the usage chart (tokens and
  cost per day, by model, drawn as SVG), retries a dead job and finds both changes in the audit
  log;
- a company operator (`company_operator`) gets their own company's pages and no company list:
  changes a feature flag, switches a space's context memory through the company routes, finds
  both in the audit log under their name, and erases a user after typing the user's id;
- a platform operator lists the companies and offboards one after typing its id (skipped, with
  the reason, while the service has no company routes: it runs once they exist).

Every page is scanned with axe-core (no serious or critical violation), at 1100 px and at 320 px
wide (no sideways scrolling), and the guard fails a test on any request off the machine, script
error or Content-Security-Policy violation. Screenshots go to `var/artifacts/browser/`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from playwright.async_api import Page, ViewportSize, expect

from app.main import create_app
from tests.browser.harness import BrowserPage, Shots, serious_violations
from tests.helpers.apps import COMPANY, make_settings
from tests.helpers.db import admin_execute
from tests.helpers.identity_provider import IdentityProvider, public_client
from tests.helpers.serving import served

pytestmark = pytest.mark.browser

PAGE = "/ui/admin"
CLIENT_ID = "console-pages"
SCOPE = "openid memory"
SPACE_ADMIN = "sam"
OPERATOR = "olga"
PLATFORM_OPERATOR = "pat"
COMPANY_OPERATOR = "cora"
ACCOUNTS = {
    SPACE_ADMIN: {"roles": ["space_admin"]},
    COMPANY_OPERATOR: {"roles": ["company_operator"]},
    OPERATOR: {"roles": ["operator"]},
    PLATFORM_OPERATOR: {"roles": ["operator"]},
}
MEMORY_FLAG = "FEATURE_FLAG_ENABLE_CONTEXT_MEMORY_UN_22033"
WEB_SEARCH_FLAG = "ALLOW_CONTEXT_MEMORY_WITH_WEB_SEARCH_UN_22591"
TOOLTIP = (
    "Context memory is unavailable while web search is enabled, to keep user data out of "
    "external search queries."
)
NARROW: ViewportSize = {"width": 320, "height": 900}
# per million tokens: gpt-4o's day before yesterday costs 1200 * 2.5 + 300 * 10 = 6000 millionths
PRICES = {
    "gpt-4o": {"prompt_per_million": 2.5, "completion_per_million": 10.0},
    "gpt-4o-mini": {"prompt_per_million": 0.15, "completion_per_million": 0.6},
}
COMPANY_ROUTES = ("/v1/companies", "/v1/companies/{company_id}")


@pytest.fixture(scope="module")
async def provider() -> AsyncIterator[IdentityProvider]:
    async with IdentityProvider(accounts=ACCOUNTS) as identity_provider:
        yield identity_provider


@pytest.fixture(scope="module")
async def base_url(database_url: str, provider: IdentityProvider) -> AsyncIterator[str]:
    """The app trusting the provider (a platform issuer for `acme`, roles from `roles`) and
    offering sign-in with it; the console is registered as a public client."""
    entry = provider.issuer_entry(company=COMPANY, roles_claim="roles", platform=True)
    settings = make_settings(
        database_url,
        auth_issuers=[entry],
        ui_oidc_issuer=provider.issuer,
        ui_oidc_client_id=CLIENT_ID,
        ui_oidc_scope=SCOPE,
        ui_oidc_extra_params={"resource": provider.resource()},
        model_prices=PRICES,
    )
    async with served(create_app(settings)) as url:
        await provider.register_client(public_client(CLIENT_ID, [f"{url}{PAGE}"]))
        yield url


async def bearer(provider: IdentityProvider, login: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {await provider.access_token(login)}"}


async def sign_in(
    page: Page, base_url: str, provider: IdentityProvider, login: str, shot: Shots
) -> None:
    """Opens the console, signs in at the provider as `login` and waits for the console."""
    await page.goto(f"{base_url}{PAGE}")
    await page.get_by_role("button", name="Sign in", exact=True).click()
    await page.wait_for_url(f"{provider.issuer}/interaction/**")
    await page.get_by_placeholder("Enter any login").fill(login)
    await page.get_by_placeholder("and password").fill("any-password")
    await shot("provider-login")
    await page.get_by_role("button", name="Sign-in").click()
    consent = page.get_by_role("button", name="Continue")
    await expect(consent.or_(page.locator("#console"))).to_be_visible()
    if await consent.count():
        await consent.click()
    await page.wait_for_url(f"{base_url}{PAGE}")
    await expect(page.locator("#console")).to_be_visible()
    await expect(page.locator("#who")).to_have_text(f"{login} ({COMPANY})")


async def assert_accessible(page: Page, what: str) -> None:
    violations = await serious_violations(page)
    assert not violations, f"{what}: " + "\n".join(violations)


async def assert_fits(page: Page, shot: Shots, step: str) -> None:
    """At 320 px wide the page scrolls only downwards; back to the desktop size afterwards."""
    size = page.viewport_size
    await page.set_viewport_size(NARROW)
    width = await page.evaluate("() => document.documentElement.scrollWidth")
    assert width <= NARROW["width"], f"{step}: {width} px wide at 320 px"
    await shot(f"{step}-320px")
    if size is not None:
        await page.set_viewport_size(size)


async def open_page(page: Page, name: str) -> None:
    await (
        page.get_by_role("navigation", name="Console pages")
        .get_by_role("button", name=name, exact=True)
        .click()
    )
    await expect(page.get_by_role("heading", name=name, level=2)).to_be_focused()


async def space_settings(
    api: httpx.AsyncClient, headers: dict[str, str], space: str
) -> dict[str, Any]:
    response = await api.get(f"/v1/spaces/{space}", headers=headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


@pytest.mark.usefixtures("provider_pages")
async def test_a_space_admin_switches_context_memory_and_sees_it_blocked_by_web_search(
    web: BrowserPage, base_url: str, provider: IdentityProvider, api: httpx.AsyncClient
) -> None:
    page, shot = web.page, web.shot
    space = "space-console-1"
    operator = await bearer(provider, OPERATOR)
    flag = await api.put(
        f"/v1/companies/{COMPANY}/feature-flags/{MEMORY_FLAG}",
        json={"enabled": True},
        headers=operator,
    )
    assert flag.status_code == 200, flag.text
    admin = await bearer(provider, SPACE_ADMIN)

    await sign_in(page, base_url, provider, SPACE_ADMIN, shot)
    nav = page.get_by_role("navigation", name="Console pages")
    await expect(nav.get_by_role("button")).to_have_text(["Spaces"])  # nothing of an operator's
    await expect(nav.get_by_role("button", name="Spaces")).to_have_attribute("aria-current", "page")
    await page.get_by_label("Open a space by its id").fill(space)
    await page.get_by_role("button", name="Open space").click()
    await expect(page.get_by_role("heading", name=f"Space {space}")).to_be_focused()

    # Context memory: on by default, off, and on again, each through the API
    memory = page.get_by_role("switch", name="Context memory")
    await expect(memory).to_have_attribute("aria-checked", "true")
    await expect(memory).not_to_have_attribute("aria-disabled", "true")
    await shot("space-default")
    await memory.click()
    await expect(memory).to_have_attribute("aria-checked", "false")
    assert (await space_settings(api, admin, space))["context_memory"] is False
    await memory.press("Space")  # keyboard, as a switch is used
    await expect(memory).to_have_attribute("aria-checked", "true")
    assert (await space_settings(api, admin, space))["context_memory"] is True

    # web search on: the switch stays, disabled, with the seed's tooltip, and changes nothing
    web_search = page.get_by_role("switch", name="Web search")
    await web_search.click()
    await expect(web_search).to_have_attribute("aria-checked", "true")
    await expect(memory).to_have_attribute("aria-disabled", "true")
    await expect(memory).to_have_attribute("title", TOOLTIP)
    await expect(page.locator("#context-memory-state")).to_have_text("Unavailable")
    await memory.hover()
    tooltip = page.get_by_role("tooltip")
    await expect(tooltip).to_be_visible()
    await expect(tooltip).to_have_text(TOOLTIP)
    await shot("web-search-blocks-memory")
    before = await space_settings(api, admin, space)
    assert before["web_search"] is True
    assert before["switch"] == {"visible": True, "editable": False, "tooltip": TOOLTIP}
    await memory.click(force=True)  # a person can click it: it says why and changes nothing
    await expect(page.get_by_role("status")).to_have_text(TOOLTIP)
    await expect(memory).to_have_attribute("aria-checked", "true")
    assert await space_settings(api, admin, space) == before  # no request changed it
    await page.mouse.move(0, 0)
    await memory.blur()
    await expect(tooltip).to_be_hidden()
    await memory.focus()  # the tooltip shows for the keyboard too
    await expect(tooltip).to_be_visible()
    await assert_accessible(page, "space with web search on")
    await assert_fits(page, shot, "web-search-blocks-memory")

    # consolidation settings: out of range refused before any request, then saved
    await page.get_by_label("Use Orchestrator Language Model").uncheck()
    await page.get_by_label("Language Model", exact=True).fill("gpt-4o-mini")
    await page.get_by_label("Max Tokens").fill("9000")
    await page.get_by_role("button", name="Save consolidation settings").click()
    await expect(page.get_by_role("alert")).to_contain_text(
        "Max Tokens must be a whole number from 500 to 8000."
    )
    await expect(page.get_by_label("Max Tokens")).to_be_focused()
    await shot("max-tokens-out-of-range")
    assert (await space_settings(api, admin, space))["user_memory"]["max_tokens"] == 2000
    await page.get_by_label("Max Tokens").fill("1500")
    await page.get_by_role("button", name="Save consolidation settings").click()
    await expect(page.get_by_role("status")).to_have_text(
        f"The consolidation settings of space {space} were saved."
    )
    saved = await space_settings(api, admin, space)
    assert saved["user_memory"] == {
        "use_orchestrator_language_model": False,
        "language_model": "gpt-4o-mini",
        "max_tokens": 1500,
    }
    await shot("consolidation-saved")

    # web search off again: the switch is usable again
    await web_search.click()
    await expect(memory).not_to_have_attribute("aria-disabled", "true")
    await expect(page.locator("#context-memory-state")).to_have_text("On")
    await assert_accessible(page, "space")


async def seed_usage(database_url: str) -> None:
    """Two UTC days of model calls of two models in `acme`, as the worker's meter writes them."""
    await admin_execute(
        database_url,
        "INSERT INTO usage_daily_model_calls"
        " SELECT 'acme', (now() AT TIME ZONE 'UTC')::date - back, kind, model, calls, p, c"
        " FROM (VALUES (1, 'operations', 'gpt-4o', 3, 1200, 300),"
        " (1, 'gate', 'gpt-4o-mini', 3, 600, 6), (0, 'operations', 'gpt-4o', 1, 400, 100))"
        " AS seeded (back, kind, model, calls, p, c)",
    )


DEAD_JOB = "7b0c6a52-5d1e-4c7e-9d55-0a4a8e0c2f11"


async def seed_dead_job(database_url: str) -> None:
    """A consolidation of `acme` dead-lettered after its last attempt, as the worker leaves it."""
    await admin_execute(
        database_url,
        "INSERT INTO jobs (company_id, id, user_id, kind, status, attempts, max_attempts,"
        " error_class, error_message) VALUES ('acme', '7b0c6a52-5d1e-4c7e-9d55-0a4a8e0c2f11',"
        " 'alice', 'consolidation', 'dead', 5, 5, 'ModelTimeout',"
        " 'The model did not answer in time.')",
    )


@pytest.mark.usefixtures("provider_pages")
async def test_an_operator_changes_a_flag_and_a_rate_limit_and_reads_the_usage_chart(
    web: BrowserPage,
    base_url: str,
    provider: IdentityProvider,
    api: httpx.AsyncClient,
    database_url: str,
) -> None:
    page, shot = web.page, web.shot
    await seed_usage(database_url)
    await seed_dead_job(database_url)
    job_id = DEAD_JOB
    operator = await bearer(provider, OPERATOR)
    registered = await api.post("/v1/companies", json={"company_id": COMPANY}, headers=operator)
    assert registered.status_code in (200, 201), registered.text

    await sign_in(page, base_url, provider, OPERATOR, shot)
    # the `operator` role is a platform operator's: the company list first, then the company
    await expect(page.get_by_role("heading", name="Companies", level=2)).to_be_focused()
    await (
        page.locator(f'tr[data-company="{COMPANY}"]')
        .get_by_role("button", name=f"Open {COMPANY}")
        .click()
    )
    await expect(page.locator("#company-name")).to_have_text(COMPANY)
    await expect(page.get_by_role("heading", name="Feature flags", level=2)).to_be_focused()

    # a feature flag, by keyboard
    flag = page.get_by_role("switch", name=WEB_SEARCH_FLAG)
    await expect(flag).to_have_attribute("aria-checked", "false")
    await flag.focus()
    await page.keyboard.press("Enter")
    await expect(page.get_by_role("status")).to_have_text(f"{WEB_SEARCH_FLAG} is on.")
    await expect(page.get_by_role("switch", name=WEB_SEARCH_FLAG)).to_have_attribute(
        "aria-checked", "true"
    )
    flags = (await api.get(f"/v1/companies/{COMPANY}/feature-flags", headers=operator)).json()[
        "flags"
    ]
    assert {item["flag"]: item["enabled"] for item in flags}[WEB_SEARCH_FLAG] is True
    await shot("flags")
    await assert_accessible(page, "feature flags")

    # a rate limit: turns per user, 240 a minute
    await open_page(page, "Rate limits")
    await page.locator("#limit-turns-user-mode").select_option("limit")
    await page.locator("#limit-turns-user-quota").fill("240")
    await page.locator("#limit-turns-user-window").fill("60")
    await page.get_by_role("button", name="Save rate limits").click()
    await expect(page.get_by_role("status")).to_have_text("The rate limits were saved.")
    limits = (await api.get(f"/v1/companies/{COMPANY}/rate-limits", headers=operator)).json()
    assert limits["turns"]["user"] == {
        "limit": {"quota": 240, "window_seconds": 60},
        "overridden": True,
    }
    assert limits["context"]["user"]["overridden"] is False
    await shot("rate-limits")
    await assert_accessible(page, "rate limits")

    # usage: a bar per day and model, in tokens and in cost, and the figures as a table
    await open_page(page, "Usage")
    tokens = page.locator("#tokens-chart svg[role=img]")
    await expect(tokens).to_be_visible()
    await expect(page.locator("#tokens-chart rect")).to_have_count(3)
    await expect(page.locator("#cost-chart svg[role=img]")).to_be_visible()
    await expect(page.get_by_role("list", name="Models").get_by_role("listitem")).to_have_text(
        ["gpt-4o", "gpt-4o-mini"]
    )
    heights = {
        (await rect.get_attribute("data-day"), await rect.get_attribute("data-model")): float(
            await rect.get_attribute("height") or 0
        )
        for rect in await page.locator("#tokens-chart rect").all()
    }
    today = datetime.now(UTC).date()
    yesterday = today - timedelta(days=1)
    assert heights[(str(yesterday), "gpt-4o")] == pytest.approx(
        heights[(str(today), "gpt-4o")] * 3, rel=0.01
    )
    await expect(page.locator("#usage-totals")).to_contain_text("2,606 model tokens")
    # cost: yesterday 0.006 (gpt-4o) + 0.0000936 (gpt-4o-mini), today 0.002 (gpt-4o)
    await expect(page.locator("#cost-chart rect")).to_have_count(3)
    cost = {
        await rect.get_attribute("data-day"): float(await rect.get_attribute("height") or 0)
        for rect in await page.locator('#cost-chart rect[data-model="gpt-4o"]').all()
    }
    assert cost[str(yesterday)] == pytest.approx(cost[str(today)] * 3, rel=0.01)
    await page.get_by_text("The figures as a table").click()
    await expect(page.locator("#usage-rows tr")).to_have_count(3)
    await shot("usage")
    await assert_accessible(page, "usage")
    await assert_fits(page, shot, "usage")

    # jobs: the dead one retried
    await open_page(page, "Jobs")
    retry = page.get_by_role("button", name=f"Retry job {job_id[:8]}")
    await expect(retry).to_be_visible()
    await shot("dead-job")
    await assert_accessible(page, "jobs")
    await retry.click()
    await expect(page.get_by_role("status")).to_have_text(f"Job {job_id[:8]} was queued again.")
    await expect(page.locator("#jobs-empty")).to_be_visible()  # no dead job left
    listed = (await api.get(f"/v1/companies/{COMPANY}/jobs", headers=operator)).json()["items"]
    assert [(job["id"], job["status"]) for job in listed] == [(job_id, "queued")]

    # the audit log names both changes
    await open_page(page, "Audit log")
    audit = page.locator("#audit")
    await expect(audit).to_contain_text(WEB_SEARCH_FLAG)
    await expect(audit).to_contain_text("rate_limits")
    await shot("audit")
    await assert_accessible(page, "audit log")

    # the other pages load and pass the scan too
    for name in ("Spaces", "Memory policy", "Model budget", "Erasure requests"):
        await open_page(page, name)
        await assert_accessible(page, name)
        await shot(name.lower().replace(" ", "-"))
    await assert_fits(page, shot, "erasure")


@pytest.mark.usefixtures("provider_pages")
async def test_a_company_operator_runs_their_company_and_erases_a_user_of_it(
    web: BrowserPage, base_url: str, provider: IdentityProvider, api: httpx.AsyncClient
) -> None:
    if not await company_routes_present(api):
        pytest.skip("needs the company routes")
    page, shot = web.page, web.shot
    space = "space-console-company"
    settings_route = f"/v1/companies/{COMPANY}/spaces/{space}/settings"
    company_operator = await bearer(provider, COMPANY_OPERATOR)
    platform = await bearer(provider, PLATFORM_OPERATOR)
    flag = await api.put(
        f"/v1/companies/{COMPANY}/feature-flags/{MEMORY_FLAG}",
        json={"enabled": True},
        headers=platform,
    )
    assert flag.status_code == 200, flag.text
    # what the console leaves out, the service refuses: no company list for this role
    refused = await api.get("/v1/companies", headers=company_operator)
    assert refused.status_code == 403, refused.text
    flags_route = f"/v1/companies/{COMPANY}/feature-flags"

    async def web_search_allowed() -> bool:
        listed = (await api.get(flags_route, headers=company_operator)).json()["flags"]
        return bool({item["flag"]: item["enabled"] for item in listed}[WEB_SEARCH_FLAG])

    await sign_in(page, base_url, provider, COMPANY_OPERATOR, shot)
    await expect(page.locator("#roles")).to_have_text("· company operator")
    nav = page.get_by_role("navigation", name="Console pages")
    await expect(nav.get_by_role("button")).to_have_text(
        [
            "Spaces",
            "Feature flags",
            "Memory policy",
            "Rate limits",
            "Model budget",
            "Usage",
            "Jobs",
            "Audit log",
            "Erasure requests",
        ]
    )
    await expect(page.locator("#company-name")).to_have_text(COMPANY)
    await expect(page.locator("#back-to-companies")).to_be_hidden()
    await expect(page.get_by_role("heading", name="Feature flags", level=2)).to_be_focused()

    # a feature flag of their own company, and back
    allowed = await web_search_allowed()
    flag_switch = page.get_by_role("switch", name=WEB_SEARCH_FLAG)
    await flag_switch.click()
    state = "off" if allowed else "on"
    await expect(page.get_by_role("status")).to_have_text(f"{WEB_SEARCH_FLAG} is {state}.")
    assert await web_search_allowed() is not allowed
    await page.get_by_role("switch", name=WEB_SEARCH_FLAG).click()
    await expect(page.get_by_role("switch", name=WEB_SEARCH_FLAG)).to_have_attribute(
        "aria-checked", "true" if allowed else "false"
    )
    assert await web_search_allowed() is allowed
    await assert_accessible(page, "company operator's feature flags")

    # a space of the company, through the company routes; web search off there
    await open_page(page, "Spaces")
    await page.get_by_label("Open a space by its id").fill(space)
    await page.get_by_role("button", name="Open space").click()
    await expect(page.get_by_role("heading", name=f"Space {space}")).to_be_focused()
    memory = page.get_by_role("switch", name="Context memory")
    await expect(memory).to_have_attribute("aria-checked", "true")
    await memory.click()
    await expect(memory).to_have_attribute("aria-checked", "false")
    stored = await api.get(settings_route, headers=company_operator)
    assert stored.status_code == 200, stored.text
    assert stored.json()["context_memory"] is False
    assert stored.json()["updated_by"] == COMPANY_OPERATOR
    audit = await api.get(f"/v1/companies/{COMPANY}/audit-events", headers=platform)
    assert audit.status_code == 200, audit.text
    assert any(
        event["actor_id"] == COMPANY_OPERATOR and space in json.dumps(event)
        for event in audit.json()["items"]
    ), audit.json()["items"][:3]
    await shot("company-operator-space")
    await assert_accessible(page, "company operator's space")
    await assert_fits(page, shot, "company-operator-space")

    # their audit log names their changes
    await open_page(page, "Audit log")
    await expect(page.locator("#audit")).to_contain_text(WEB_SEARCH_FLAG)
    await expect(page.locator("#audit")).to_contain_text(space)
    await assert_accessible(page, "company operator's audit log")

    # the other pages load and pass the scan too
    for name in ("Memory policy", "Rate limits", "Model budget", "Usage", "Jobs"):
        await open_page(page, name)
        await assert_accessible(page, f"company operator's {name}")

    # an erasure request: confirmed by typing the user's id; its receipt announced
    await open_page(page, "Erasure requests")
    await page.get_by_label("Erase everything the service holds about a user (user id)").fill(
        "road-runner"
    )
    await page.get_by_role("button", name="Erase user…").click()
    dialog = page.get_by_role("dialog")
    erase = dialog.get_by_role("button", name="Erase user")
    await expect(erase).to_be_disabled()
    await dialog.get_by_label("Type the user id (road-runner) to confirm").fill("road-runner")
    await erase.click()
    await expect(page.get_by_role("status")).to_contain_text("road-runner was erased.")
    await shot("company-operator-erasure")
    await assert_accessible(page, "company operator's erasure requests")
    await assert_fits(page, shot, "company-operator-erasure")


async def company_routes_present(api: httpx.AsyncClient) -> bool:
    paths = (await api.get("/openapi.json")).json()["paths"]
    return all(route in paths for route in COMPANY_ROUTES)


@pytest.mark.usefixtures("provider_pages")
async def test_a_platform_operator_lists_companies_and_offboards_one_with_typed_confirmation(
    web: BrowserPage, base_url: str, provider: IdentityProvider, api: httpx.AsyncClient
) -> None:
    if not await company_routes_present(api):
        pytest.skip("needs the company routes")
    page, shot = web.page, web.shot
    leaving = "initech-leaving"
    operator = await bearer(provider, PLATFORM_OPERATOR)
    created = await api.post("/v1/companies", json={"company_id": leaving}, headers=operator)
    assert created.status_code in (200, 201), created.text

    await sign_in(page, base_url, provider, PLATFORM_OPERATOR, shot)
    await expect(page.get_by_role("heading", name="Companies", level=2)).to_be_focused()
    row = page.locator(f'tr[data-company="{leaving}"]')
    await expect(row).to_be_visible()
    await shot("companies")
    await assert_accessible(page, "companies")
    await assert_fits(page, shot, "companies")

    # any company's pages
    await row.get_by_role("button", name=f"Open {leaving}").click()
    await expect(page.locator("#company-name")).to_have_text(leaving)
    await expect(page.get_by_role("heading", name="Feature flags", level=2)).to_be_focused()

    # an erasure request, confirmed by typing the user's id, and its receipt
    await open_page(page, "Erasure requests")
    await page.get_by_label("Erase everything the service holds about a user (user id)").fill(
        "wile"
    )
    await page.get_by_role("button", name="Erase user…").click()
    erase = page.get_by_role("dialog").get_by_role("button", name="Erase user")
    await expect(erase).to_be_disabled()
    await page.get_by_role("dialog").get_by_label("Type the user id (wile) to confirm").fill("wile")
    await erase.click()
    await expect(page.get_by_role("status")).to_contain_text("wile was erased.")
    # wile had nothing stored: the receipt is the answer announced (zeros), and the audit log
    # records no erasure of nothing (tests/control_plane/test_erasure_requests.py)
    await expect(page.locator("#erasures li")).to_have_count(0)
    await expect(page.locator("#erasures-empty")).to_be_visible()
    await shot("erasure-receipt")
    await assert_accessible(page, "erasure requests")
    await page.get_by_role("button", name="All companies").click()

    # offboarding: confirmed only once the company's id is typed
    await (
        page.locator(f'tr[data-company="{leaving}"]')
        .get_by_role("button", name=f"Offboard {leaving}…")
        .click()
    )
    dialog = page.get_by_role("dialog")
    confirm = dialog.get_by_role("button", name="Offboard and erase")
    await expect(confirm).to_be_disabled()
    await dialog.get_by_label(f"Type the company id ({leaving}) to confirm").fill(leaving[:-1])
    await expect(confirm).to_be_disabled()
    await dialog.get_by_label(f"Type the company id ({leaving}) to confirm").fill(leaving)
    await expect(confirm).to_be_enabled()
    await shot("offboard-confirm")
    await assert_accessible(page, "offboarding dialog")
    await confirm.click()
    await expect(
        page.get_by_role("heading", name=f"Offboarding receipt for {leaving}")
    ).to_be_focused()
    await shot("offboard-receipt")
    gone = await api.get(f"/v1/companies/{leaving}", headers=operator)
    assert gone.status_code in (200, 202, 404), gone.text


@pytest.mark.usefixtures("provider_pages")
async def test_without_the_company_routes_the_console_offers_no_company_list(
    web: BrowserPage, base_url: str, provider: IdentityProvider, api: httpx.AsyncClient
) -> None:
    """Until the service has the company routes, an operator gets their own company's pages and
    no company list or erasure form: the console offers only what the API has."""
    if await company_routes_present(api):
        pytest.skip("the service has the company routes")
    page, shot = web.page, web.shot
    await sign_in(page, base_url, provider, PLATFORM_OPERATOR, shot)
    nav = page.get_by_role("navigation", name="Console pages")
    await expect(nav.get_by_role("button", name="Companies")).to_have_count(0)
    await open_page(page, "Erasure requests")
    await expect(page.locator("#erasure-absent")).to_have_text(
        "This service does not offer this yet: it needs the company routes."
    )
    await expect(
        page.get_by_label("Erase everything the service holds about a user (user id)")
    ).to_be_hidden()
    await shot("erasure-without-company-routes")
