"""The API documentation pages, `/docs` (Swagger UI) and `/redoc` (ReDoc), served with their
JavaScript, CSS and favicon from the pinned `fastapi-offline` package: the pages work on a
machine with no internet access. The only importer of fastapi_offline.

Nothing on either page loads from another host: the assets are this service's own URLs, ReDoc
gets no web fonts, Swagger UI's online validator badge is off, and the one absolute URL ReDoc's
script would load by itself (its vendor's logo, from a CDN) is served as a blank inline image.
The pages' Content-Security-Policy holds the browser to the service alone, should a later
version of either script reach out. The assets are read once per process (2.8 MB) and their
URLs carry a digest of their content, so they are cached for a year and any change is a new
URL. Swagger UI keeps the bearer token pasted into Authorize across page reloads
(`persistAuthorization`, in local storage).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import functools
import hashlib
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from importlib import metadata, resources
from pathlib import Path
from typing import Any, Final

import fastapi_offline
from fastapi import FastAPI
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

DOCS_PATH: Final = "/docs"
REDOC_PATH: Final = "/redoc"
OAUTH2_REDIRECT_PATH: Final = "/docs/oauth2-redirect"
ASSETS_PATH: Final = "/docs/assets"

# The files fastapi-offline ships, by the name they are served under, with their media type.
ASSET_TYPES: Final[Mapping[str, str]] = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "redoc.standalone.js": "text/javascript; charset=utf-8",
    "favicon.png": "image/png",
}

ASSETS_VERSION: Final = metadata.version("fastapi-offline")
ASSET_CACHE_CONTROL: Final = "public, max-age=31536000, immutable"

REDOC_VENDOR_LOGO: Final = "https://cdn.redoc.ly/redoc/logo-mini.svg"
# a transparent 1x1 GIF: ReDoc's menu footer keeps its text, and the browser fetches nothing
BLANK_IMAGE: Final = (
    "data:image/gif;base64,R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7"
)
# What is served differently from the packaged file: (file, [(text, replacement)])
ASSET_REWRITES: Final[Mapping[str, tuple[tuple[str, str], ...]]] = {
    "redoc.standalone.js": ((REDOC_VENDOR_LOGO, BLANK_IMAGE),),
}

SWAGGER_UI_PARAMETERS: Final[Mapping[str, Any]] = {
    "persistAuthorization": True,  # the pasted token survives a reload
    "tryItOutEnabled": True,  # every operation opens ready to send, with its example
    "displayRequestDuration": True,
    "filter": True,  # a search box over tags
    "defaultModelsExpandDepth": 0,  # schemas listed, collapsed
    "validatorUrl": None,  # no badge fetched from the online validator
}


# Only the service itself: scripts are its own files (and, on /docs, the one inline script that
# starts Swagger UI, by its hash); styles may be inline (both UIs set them at run time); ReDoc's
# search runs in a worker made from a blob.
_CSP_COMMON: Final = (
    "default-src 'self'",
    "style-src 'self' 'unsafe-inline'",
    "img-src 'self' data:",
    "font-src 'self' data:",
    "connect-src 'self'",
    "worker-src 'self' blob:",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",
)
REDOC_CSP: Final = "; ".join(("script-src 'self'", *_CSP_COMMON))
_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)


def swagger_ui_csp(html: str) -> str:
    """The policy of a Swagger UI page: its own scripts, and its inline start-up script by hash."""
    hashes = [_hash_source(script) for script in _INLINE_SCRIPT.findall(html)]
    return "; ".join((" ".join(("script-src 'self'", *hashes)), *_CSP_COMMON))


def _hash_source(script: str) -> str:
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    return f"'sha256-{digest}'"


def asset_directory() -> Path:
    return Path(str(resources.files(fastapi_offline) / "static"))


@dataclass(frozen=True, slots=True)
class Asset:
    """One file as it is served: where it is, its media type and the digest that versions it.
    Its bytes are read when it is served, not held: the assets are ~2.7 MB, asked for once
    per browser and version (`ASSET_CACHE_CONTROL`)."""

    path: Path
    media_type: str
    digest: str

    def body(self) -> bytes:
        """The file's bytes with `ASSET_REWRITES` applied."""
        body = self.path.read_bytes()
        for text, replacement in ASSET_REWRITES.get(self.path.name, ()):
            body = body.replace(text.encode(), replacement.encode())
        return body

    @property
    def etag(self) -> str:
        return f'"{self.digest}"'


@functools.cache
def load_assets() -> Mapping[str, Asset]:
    """Every asset, read from the package once per process, with `ASSET_REWRITES` applied."""
    directory = asset_directory()
    missing = [name for name in ASSET_TYPES if not (directory / name).is_file()]
    if missing:
        raise RuntimeError(f"fastapi-offline {ASSETS_VERSION} lacks {missing} in {directory}")
    assets: dict[str, Asset] = {}
    for name, media_type in ASSET_TYPES.items():
        asset = Asset(directory / name, media_type, "")
        digest = hashlib.sha256(asset.body()).hexdigest()[:20]
        assets[name] = dataclasses.replace(asset, digest=digest)
    return assets


def install_docs_pages(app: FastAPI) -> None:
    """Serve `/docs`, `/docs/oauth2-redirect`, `/redoc` and their assets on `app`, which must be
    built with `docs_url=None, redoc_url=None` (FastAPI's own pages load from a CDN)."""
    assets = load_assets()
    title, openapi_url = app.title, app.openapi_url or "/openapi.json"

    async def swagger_ui(request: Request) -> HTMLResponse:
        root = _root_path(request)
        page = get_swagger_ui_html(
            openapi_url=root + openapi_url,
            title=f"{title} - Swagger UI",
            swagger_js_url=asset_url("swagger-ui-bundle.js", root),
            swagger_css_url=asset_url("swagger-ui.css", root),
            swagger_favicon_url=asset_url("favicon.png", root),
            oauth2_redirect_url=root + OAUTH2_REDIRECT_PATH,
            swagger_ui_parameters=dict(SWAGGER_UI_PARAMETERS),
        )
        page.headers["Content-Security-Policy"] = swagger_ui_csp(bytes(page.body).decode())
        return page

    async def oauth2_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    async def redoc(request: Request) -> HTMLResponse:
        root = _root_path(request)
        page = get_redoc_html(
            openapi_url=root + openapi_url,
            title=f"{title} - ReDoc",
            redoc_js_url=asset_url("redoc.standalone.js", root),
            redoc_favicon_url=asset_url("favicon.png", root),
            with_google_fonts=False,
        )
        page.headers["Content-Security-Policy"] = REDOC_CSP
        return page

    for path, endpoint in (
        (DOCS_PATH, swagger_ui),
        (OAUTH2_REDIRECT_PATH, oauth2_redirect),
        (REDOC_PATH, redoc),
    ):
        app.add_api_route(path, endpoint, methods=["GET"], include_in_schema=False)
    for name, asset in assets.items():
        app.add_api_route(
            f"{ASSETS_PATH}/{name}",
            _asset_endpoint(asset),
            methods=["GET"],
            include_in_schema=False,
        )


def asset_url(name: str, root_path: str = "") -> str:
    """The URL a page loads asset `name` from, versioned by the asset's digest."""
    return f"{root_path}{ASSETS_PATH}/{name}?v={load_assets()[name].digest}"


def _root_path(request: Request) -> str:
    """The prefix the service is mounted under behind a proxy (usually empty)."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def _asset_endpoint(asset: Asset) -> Callable[[Request], Awaitable[Response]]:
    # The ETag is the content's digest, so every replica answers the same one.
    headers = {
        "Cache-Control": ASSET_CACHE_CONTROL,
        "ETag": asset.etag,
        "X-Content-Type-Options": "nosniff",
    }

    async def serve_asset(request: Request) -> Response:
        if asset.etag in _entity_tags(request.headers.get("if-none-match")):
            return Response(status_code=304, headers=headers)
        body = await asyncio.to_thread(asset.body)
        return Response(body, media_type=asset.media_type, headers=headers)

    return serve_asset


def _entity_tags(header: str | None) -> set[str]:
    """The tags of an If-None-Match header, weak ones as their strong form."""
    if not header:
        return set()
    return {tag.strip().removeprefix("W/") for tag in header.split(",")}
