"""Serves the pages of `/ui` — the memory page and the admin console — with their assets and
their sign-in configuration, read once from this package, with the security headers every
response of the pages carries.

The page holds no data: it is `public`, and everything it shows comes from `/v1/me/*` with a
token the user gets by signing in with the company's OpenID provider (`UI_OIDC_ISSUER` and
`UI_OIDC_CLIENT_ID`: the authorization code flow with PKCE, run by the page as a public client),
pastes, or, only without that sign-in (development), hands over in the URL fragment of the link
that opens the page (the configuration below tells the page which; see memory.js for why a
link's token is never used otherwise). The admin console (`/ui/admin`) is served the same way
and signs in with the same code (signin.js, shared by both pages); it calls the admin routes of
`/v1` with the token of a space admin or an operator. The headers keep that token in the page:
no script or style but the page's own files, requests only to this origin and, with sign-in
configured, to the issuer's origin (its discovery document and token endpoint; the authorization
request is a navigation), no framing, and no `Referer` (the fragment never travels in one, but
the policy leaves nothing to chance). A form action of `'none'` means a page whose script failed
cannot submit the token field as a query string.

The policy depends on the settings, so it is built from the app's settings on each response.
This package imports nothing of `app`: `SignInSettings` names the few settings it reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, Protocol
from urllib.parse import urlsplit

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

PAGE_PATH: Final = "/ui/memory"
ADMIN_PATH: Final = "/ui/admin"
ASSETS_PATH: Final = "/ui/assets"
CONFIG_PATH: Final = "/ui/config.json"

_DIRECTIVES: Final = (
    ("default-src", "'self'"),
    ("script-src", "'self'"),
    ("style-src", "'self'"),
    ("img-src", "'self'"),
    ("connect-src", "'self'"),
    ("object-src", "'none'"),
    ("base-uri", "'none'"),
    ("form-action", "'none'"),
    ("frame-ancestors", "'none'"),
)
_OTHER_HEADERS: Final = {
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-cache",
}
_HOST_CHARACTERS: Final = frozenset("abcdefghijklmnopqrstuvwxyz0123456789.-")

_HERE = Path(__file__).resolve().parent
_ASSETS: Final = {
    "memory.css": "text/css; charset=utf-8",
    "memory.js": "text/javascript; charset=utf-8",
    "signin.js": "text/javascript; charset=utf-8",
    "admin.css": "text/css; charset=utf-8",
    "admin.js": "text/javascript; charset=utf-8",
}
_FILES: Final = {
    name: (_HERE / name).read_bytes() for name in ("memory.html", "admin.html", *_ASSETS)
}


class SignInSettings(Protocol):
    """The settings the page reads (`app.kit.config.Settings` has them)."""

    @property
    def ui_oidc_issuer(self) -> str | None: ...
    @property
    def ui_oidc_client_id(self) -> str | None: ...
    @property
    def ui_oidc_scope(self) -> str: ...
    @property
    def ui_oidc_extra_params(self) -> dict[str, str]: ...


def issuer_origin(issuer: str) -> str:
    """`scheme://host[:port]` of an `http(s)` issuer URL, as a CSP source expression.

    Anything else (another scheme, no host, credentials, a character a header or a policy would
    read as a separator) raises `ValueError`: the policy never holds more than one origin.
    """
    parts = urlsplit(issuer)
    scheme = parts.scheme.lower()
    host = parts.hostname or ""
    try:
        port = parts.port
    except ValueError as error:
        raise ValueError(f"UI_OIDC_ISSUER {issuer!r} has an invalid port") from error
    if scheme not in ("http", "https") or not host or parts.username or parts.password:
        raise ValueError(f"UI_OIDC_ISSUER {issuer!r} is not an http(s) URL with a host")
    if ":" in host:  # IPv6, bracketed as in the URL
        if not set(host) <= set("0123456789abcdef:."):
            raise ValueError(f"UI_OIDC_ISSUER {issuer!r} has an invalid host")
        host = f"[{host}]"
    elif not set(host) <= _HOST_CHARACTERS:
        raise ValueError(f"UI_OIDC_ISSUER {issuer!r} has an invalid host")
    return f"{scheme}://{host}" if port is None else f"{scheme}://{host}:{port}"


def content_security_policy(issuer: str | None) -> str:
    """The page's policy: its own origin only, and the issuer's origin for `connect-src` when
    the page signs in with an OpenID provider."""
    extra = {"connect-src": issuer_origin(issuer)} if issuer else {}
    return "; ".join(
        f"{name} {value} {extra[name]}" if name in extra else f"{name} {value}"
        for name, value in _DIRECTIVES
    )


def security_headers(settings: SignInSettings) -> dict[str, str]:
    return {
        "Content-Security-Policy": content_security_policy(settings.ui_oidc_issuer),
        **_OTHER_HEADERS,
    }


def sign_in_config(settings: SignInSettings) -> dict[str, object] | None:
    """What the page needs to sign in, all of it public (a public client has no secret), or
    `None` when the page offers no sign-in."""
    if settings.ui_oidc_issuer is None or settings.ui_oidc_client_id is None:
        return None
    return {
        "issuer": settings.ui_oidc_issuer,
        "client_id": settings.ui_oidc_client_id,
        "scope": settings.ui_oidc_scope,
        "extra_params": dict(settings.ui_oidc_extra_params),
    }


router = APIRouter(include_in_schema=False)


def _settings(request: Request) -> SignInSettings:
    settings: SignInSettings = request.app.state.settings
    return settings


def _file(request: Request, name: str, media_type: str) -> Response:
    headers = security_headers(_settings(request))
    return Response(_FILES[name], media_type=media_type, headers=headers)


@router.get(PAGE_PATH)
async def memory_page(request: Request) -> Response:
    return _file(request, "memory.html", "text/html; charset=utf-8")


@router.get(ADMIN_PATH)
async def admin_console(request: Request) -> Response:
    return _file(request, "admin.html", "text/html; charset=utf-8")


def _asset_route(name: str, media_type: str) -> None:
    async def asset(request: Request) -> Response:
        return _file(request, name, media_type)

    router.add_api_route(f"{ASSETS_PATH}/{name}", asset, methods=["GET"], name=name)


for _name, _media_type in _ASSETS.items():
    _asset_route(_name, _media_type)


@router.get(CONFIG_PATH)
async def memory_page_config(request: Request) -> Response:
    settings = _settings(request)
    return JSONResponse({"sign_in": sign_in_config(settings)}, headers=security_headers(settings))
