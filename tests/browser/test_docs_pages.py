"""`/docs` and `/redoc` in headless Chromium with every request off 127.0.0.1 refused: both
render the whole API from the service's own assets (the `web` fixture fails a test whose page
tried to reach any other host)."""

from __future__ import annotations

import httpx
import pytest
from playwright.async_api import expect

from tests.browser.harness import BrowserPage

pytestmark = pytest.mark.browser

HTTP_METHODS = frozenset({"get", "put", "post", "delete", "patch", "head", "options", "trace"})
RENDER_TIMEOUT_MS = 20_000


async def operations(api: httpx.AsyncClient) -> set[tuple[str, str]]:
    """(METHOD, path) of every operation the published OpenAPI lists."""
    spec = (await api.get("/openapi.json")).json()
    return {
        (method.upper(), path)
        for path, item in spec["paths"].items()
        for method in item
        if method in HTTP_METHODS
    }


async def test_swagger_ui_lists_every_operation_with_no_network(
    web: BrowserPage, api: httpx.AsyncClient, base_url: str
) -> None:
    page = web.page
    expected = await operations(api)
    assert len(expected) > 20

    await page.goto(f"{base_url}/docs")
    blocks = page.locator(".opblock")
    await expect(blocks).to_have_count(len(expected), timeout=RENDER_TIMEOUT_MS)
    shown = set()
    for index in range(await blocks.count()):
        block = blocks.nth(index)
        method = await block.locator(".opblock-summary-method").inner_text()
        path = await block.locator(".opblock-summary-path").get_attribute("data-path")
        shown.add((method.strip().upper(), path))
    assert shown == expected
    await page.wait_for_load_state("networkidle")
    web.guard.assert_clean()
    await web.shot("swagger-ui")


async def test_redoc_renders_its_menu_with_no_network(
    web: BrowserPage, api: httpx.AsyncClient, base_url: str
) -> None:
    page = web.page
    expected = await operations(api)

    await page.goto(f"{base_url}/redoc")
    menu_operations = page.locator("[role=menu] li[data-item-id*='/operation/']")
    await expect(menu_operations).to_have_count(len(expected), timeout=RENDER_TIMEOUT_MS)
    await expect(page.get_by_role("search")).to_be_visible()
    await page.wait_for_load_state("networkidle")
    await web.shot("redoc", full_page=False)  # the whole page is many megabytes
    web.guard.assert_clean()
