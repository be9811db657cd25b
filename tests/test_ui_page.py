"""The memory page's files as the service serves them: their types and security headers, markup
the Content-Security-Policy can run as written (no inline script, style or handler), a token
field a form could never submit, and a script that keeps the token out of storage and puts the
service's text on the page as text only. The page at work: `tests/browser/`."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import httpx
import pytest

from app.config import PROJECT_ROOT

PAGE = "/ui/memory"
FILES = {
    PAGE: "text/html; charset=utf-8",
    "/ui/assets/memory.css": "text/css; charset=utf-8",
    "/ui/assets/memory.js": "text/javascript; charset=utf-8",
}
SCRIPT = PROJECT_ROOT / "app" / "ui" / "memory.js"


@pytest.mark.parametrize(("path", "media_type"), sorted(FILES.items()))
async def test_each_file_is_served_with_its_type_and_the_security_headers(
    client: httpx.AsyncClient, path: str, media_type: str
) -> None:
    response = await client.get(path)
    assert response.status_code == 200
    assert response.headers["content-type"] == media_type
    assert response.headers["referrer-policy"] == "no-referrer"
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["x-frame-options"] == "DENY"
    policy = dict(
        directive.partition(" ")[::2]
        for directive in response.headers["content-security-policy"].split("; ")
    )
    assert policy["default-src"] == "'self'"
    assert policy["script-src"] == "'self'"
    assert policy["style-src"] == "'self'"
    assert policy["connect-src"] == "'self'"
    assert policy["frame-ancestors"] == "'none'"
    assert policy["form-action"] == "'none'"
    assert "unsafe" not in response.headers["content-security-policy"]


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


async def test_the_markup_needs_nothing_the_policy_forbids(client: httpx.AsyncClient) -> None:
    markup = _Markup()
    markup.feed((await client.get(PAGE)).text)
    scripts = [attrs for tag, attrs in markup.tags if tag == "script"]
    assert scripts == [{"src": "assets/memory.js", "defer": None}]
    assert not markup.script_text
    assert "style" not in [tag for tag, _ in markup.tags]
    for tag, attrs in markup.tags:
        inline = [name for name in attrs if name == "style" or name.startswith("on")]
        assert not inline, f"<{tag}> has {inline}"
        for name in ("src", "href"):
            value = attrs.get(name) or ""
            assert not re.match(r"(https?:)?//", value), f"<{tag} {name}={value}> is off-site"


async def test_the_token_field_has_no_name_a_form_could_submit(client: httpx.AsyncClient) -> None:
    markup = _Markup()
    markup.feed((await client.get(PAGE)).text)
    fields = [attrs for tag, attrs in markup.tags if tag == "input"]
    token = next(attrs for attrs in fields if attrs.get("id") == "token")
    assert token["type"] == "password"
    assert "name" not in token


def test_the_script_keeps_the_token_in_memory_and_writes_text_only() -> None:
    source = SCRIPT.read_text(encoding="utf-8")
    for forbidden in (
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "localStorage",
        "sessionStorage",
        "document.cookie",
        "eval(",
        "new Function",
    ):
        assert forbidden not in source, forbidden
    assert "history.replaceState" in source
