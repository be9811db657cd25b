"""Serves the memory page and its two assets, read once from this package, with the security
headers every response of the page carries.

The page holds no data: it is `public`, and everything it shows comes from `/v1/me/*` with the
token the user pastes or hands over in the URL fragment. The headers keep that token in the page:
no script or style but the page's own files, requests only to this origin, no framing, and no
`Referer` (the fragment never travels in one, but the policy leaves nothing to chance). A form
action of `'none'` means a page whose script failed cannot submit the token field as a query
string.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from fastapi import APIRouter
from starlette.responses import Response

PAGE_PATH: Final = "/ui/memory"
ASSETS_PATH: Final = "/ui/assets"

CONTENT_SECURITY_POLICY: Final = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-cache",
}

_HERE = Path(__file__).resolve().parent
_FILES: Final = {
    name: (_HERE / name).read_bytes() for name in ("memory.html", "memory.css", "memory.js")
}

router = APIRouter(include_in_schema=False)


def _file(name: str, media_type: str) -> Response:
    return Response(_FILES[name], media_type=media_type, headers=SECURITY_HEADERS)


@router.get(PAGE_PATH)
async def memory_page() -> Response:
    return _file("memory.html", "text/html; charset=utf-8")


@router.get(f"{ASSETS_PATH}/memory.css")
async def memory_css() -> Response:
    return _file("memory.css", "text/css; charset=utf-8")


@router.get(f"{ASSETS_PATH}/memory.js")
async def memory_js() -> Response:
    return _file("memory.js", "text/javascript; charset=utf-8")
