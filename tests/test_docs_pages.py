"""`/docs` and `/redoc` work on a machine with no internet access: every URL the pages load is
the service's own and answers with the file the pinned fastapi-offline package ships. And the
OpenAPI they show is a newcomer's map: five tags by caller, each operation in exactly one,
with a summary and a description, and a bearer scheme that Authorize fills with the token."""

from __future__ import annotations

import base64
import hashlib
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from app.docs_pages import (
    ASSET_CACHE_CONTROL,
    ASSET_REWRITES,
    ASSET_TYPES,
    BLANK_IMAGE,
    REDOC_VENDOR_LOGO,
    asset_directory,
    asset_url,
)
from app.kit.api_tags import OPENAPI_TAGS

PAGES = ("/docs", "/redoc")
TAGS = ["orchestrator", "user", "space admin", "operator", "operations"]


class _References(HTMLParser):
    """Every URL an HTML page refers to: src/href attributes, and the inline scripts' text."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._in_script = tag == "script"
        for name, value in attrs:
            if name in ("src", "href", "spec-url") and value is not None:
                self.urls.append(value)

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.scripts.append(data)


def _policy(response: httpx.Response) -> dict[str, list[str]]:
    """The page's Content-Security-Policy: directive -> sources."""
    directives = [part.split() for part in response.headers["content-security-policy"].split(";")]
    return {name: sources for name, *sources in directives}


def _references(html: str) -> _References:
    parser = _References()
    parser.feed(html)
    return parser


async def _page(client: httpx.AsyncClient, path: str) -> str:
    response = await client.get(path)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    return response.text


@pytest.mark.parametrize("page", PAGES)
async def test_the_docs_pages_refer_only_to_the_service_itself(
    client: httpx.AsyncClient, page: str
) -> None:
    html = await _page(client, page)
    references = _references(html)

    assert references.urls, "the page refers to no asset at all"
    for url in references.urls:
        assert url.startswith("/"), f"{page} loads {url}"
        assert not url.startswith("//"), f"{page} loads {url}"
    # no absolute URL anywhere on the page, inline script included (fonts, CDNs, validator)
    assert not re.search(r"(?i)(?:https?:)?//[a-z0-9]", html), html


@pytest.mark.parametrize("page", PAGES)
async def test_the_browser_may_load_nothing_from_another_host(
    client: httpx.AsyncClient, page: str
) -> None:
    """ReDoc's script renders its vendor's logo from a CDN: the policy refuses it unsent."""
    response = await client.get(page)
    policy = _policy(response)
    keywords = {"'self'", "'none'", "'unsafe-inline'", "data:", "blob:"}

    assert policy["default-src"] == ["'self'"]
    assert policy["img-src"] == ["'self'", "data:"]
    assert policy["connect-src"] == ["'self'"]
    for name, sources in policy.items():
        for source in sources:
            assert source in keywords or source.startswith("'sha256-"), (page, name, source)


async def test_swagger_ui_may_run_its_start_up_script_and_no_other(
    client: httpx.AsyncClient,
) -> None:
    response = await client.get("/docs")
    (script,) = _references(response.text).scripts
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()

    assert _policy(response)["script-src"] == ["'self'", f"'sha256-{digest}'"]


async def test_swagger_ui_keeps_the_token_and_asks_no_validator(client: httpx.AsyncClient) -> None:
    (script,) = _references(await _page(client, "/docs")).scripts

    assert "url: '/openapi.json'" in script
    assert '"persistAuthorization": true' in script
    assert '"tryItOutEnabled": true' in script
    assert '"validatorUrl": null' in script
    assert "oauth2RedirectUrl: window.location.origin + '/docs/oauth2-redirect'" in script


async def test_redoc_reads_the_spec_of_the_service_and_no_web_font(
    client: httpx.AsyncClient,
) -> None:
    references = _references(await _page(client, "/redoc"))

    assert "/openapi.json" in references.urls
    assert asset_url("redoc.standalone.js") in references.urls


def _packaged(name: str) -> bytes:
    """The package's file, with the rewrites the service applies to it."""
    body = (asset_directory() / name).read_bytes()
    for text, replacement in ASSET_REWRITES.get(name, ()):
        body = body.replace(text.encode(), replacement.encode())
    return body


async def test_every_asset_the_pages_load_is_the_packaged_file(client: httpx.AsyncClient) -> None:
    loaded = {
        url
        for page in PAGES
        for url in _references(await _page(client, page)).urls
        if url.startswith("/docs/assets/")
    }
    assert {url.split("?")[0].rsplit("/", 1)[1] for url in loaded} == set(ASSET_TYPES)
    for url in sorted(loaded):
        response = await client.get(url)
        name = url.split("?")[0].rsplit("/", 1)[1]
        assert response.status_code == 200, url
        assert response.headers["content-type"] == ASSET_TYPES[name], url
        assert response.headers["cache-control"] == ASSET_CACHE_CONTROL
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.content == _packaged(name), url
        # the URL names the content: a new pinned version (or rewrite) is a new URL
        digest = hashlib.sha256(response.content).hexdigest()
        assert url.endswith(f"?v={digest[:20]}"), url
        assert response.headers["etag"] == f'"{digest[:20]}"'


async def test_an_asset_the_browser_holds_is_not_sent_again(client: httpx.AsyncClient) -> None:
    first = await client.get("/docs/assets/swagger-ui.css")
    again = await client.get(
        "/docs/assets/swagger-ui.css", headers={"If-None-Match": first.headers["etag"]}
    )
    other = await client.get("/docs/assets/swagger-ui.css", headers={"If-None-Match": '"x"'})

    assert again.status_code == 304
    assert again.content == b""
    assert again.headers["cache-control"] == ASSET_CACHE_CONTROL
    assert other.status_code == 200


async def test_redoc_shows_its_vendor_logo_from_nowhere(client: httpx.AsyncClient) -> None:
    """The packaged ReDoc renders an image from its vendor's CDN (unless the rewrite is obsolete,
    which this test then says); the served one renders a blank inline image instead."""
    packaged = (asset_directory() / "redoc.standalone.js").read_bytes()
    served = (await client.get("/docs/assets/redoc.standalone.js")).content

    assert packaged.count(REDOC_VENDOR_LOGO.encode()) == 1
    assert REDOC_VENDOR_LOGO.encode() not in served
    assert served.count(f'src:"{BLANK_IMAGE}"'.encode()) == 1


def test_the_stylesheet_embeds_its_images() -> None:
    """Swagger UI's CSS loads nothing by itself: its images are data URIs."""
    css = (asset_directory() / "swagger-ui.css").read_text(encoding="utf-8")
    targets = re.findall(r"url\(\s*['\"]?([^'\")]*)", css)

    assert targets
    assert all(target.startswith("data:") for target in targets), targets


async def test_only_the_packaged_assets_are_served(client: httpx.AsyncClient) -> None:
    """The package's own modules sit next to its static directory: none of them is served."""
    for name in ("core.py", "LICENSE", "x.js"):
        response = await client.get(f"/docs/assets/{name}")

        assert response.status_code == 404, name
        assert response.headers["content-type"] == "application/problem+json"


# --- the OpenAPI the pages show -----------------------------------------------------------------


def _operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, operation)
        for path, item in spec["paths"].items()
        for method, operation in item.items()
    ]


def test_the_tags_are_the_five_callers_in_order_each_described(app: FastAPI) -> None:
    tags = app.openapi()["tags"]

    assert [tag["name"] for tag in tags] == TAGS
    assert tags == OPENAPI_TAGS
    assert all(len(tag["description"]) > 80 for tag in tags), tags


def test_every_operation_has_one_tag_a_summary_and_a_description(app: FastAPI) -> None:
    operations = _operations(app.openapi())
    by_tag = {tag: [f"{m} {p}" for m, p, op in operations if op["tags"] == [tag]] for tag in TAGS}

    assert len(operations) >= 29
    for method, path, operation in operations:
        (tag,) = operation["tags"]
        assert tag in TAGS, (method, path)
        assert operation["summary"].strip(), (method, path)
        description = operation["description"]
        assert description.startswith(("Called ", "Scraped ")), (method, path, description)
        sentences = re.findall(r"(?<!e\.g)\.(?:\s|$)", description.strip())
        assert 1 <= len(sentences) <= 3, (method, path, description)
    assert all(by_tag.values()), by_tag
    assert "POST /v1/chats/{chat_id}/context" in by_tag["orchestrator"]
    assert "GET /v1/chats/{chat_id}/messages" in by_tag["orchestrator"]
    assert "PUT /v1/me/memory" in by_tag["user"]
    assert "PATCH /v1/spaces/{space_id}" in by_tag["space admin"]
    assert "PUT /v1/companies/{company_id}/feature-flags/{flag}" in by_tag["operator"]
    assert by_tag["operations"] == ["GET /healthz", "GET /readyz", "GET /metrics"]


def test_authorize_takes_the_bearer_token_as_it_is(app: FastAPI) -> None:
    spec = app.openapi()
    schemes = spec["components"]["securitySchemes"]

    assert schemes == {
        "HTTPBearer": {
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": "JWT",
            "description": schemes["HTTPBearer"]["description"],
        }
    }
    for method, path, operation in _operations(spec):
        secured = operation.get("security") == [{"HTTPBearer": []}]
        assert secured is path.startswith("/v1/"), (method, path)


def test_the_package_ships_every_asset_the_pages_need() -> None:
    static: Path = asset_directory()

    assert sorted(path.name for path in static.iterdir() if path.is_file()) == sorted(ASSET_TYPES)
