"""Cursor pagination shared by every list endpoint: `{"items": [...], "next_cursor": ...}`.

A cursor is an opaque base64url JSON object holding the sort key of the last item returned;
a tampered or foreign cursor is a 422 naming the `cursor` query parameter.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Generic, TypeVar

import orjson
from fastapi import Depends, Query
from pydantic import BaseModel

from app.errors import Unprocessable

T = TypeVar("T")
DEFAULT_LIMIT = 50
MAX_LIMIT = 100
_MAX_CURSOR_CHARS = 512


class Page(BaseModel, Generic[T]):
    items: list[T]
    next_cursor: str | None


def encode_cursor(position: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(position)).decode().rstrip("=")


def decode_cursor(cursor: str) -> dict[str, Any]:
    try:
        if len(cursor) > _MAX_CURSOR_CHARS:
            raise ValueError("too long")
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        value = orjson.loads(raw)
    except (ValueError, binascii.Error, orjson.JSONDecodeError) as exc:
        raise Unprocessable.field("query.cursor", "The cursor is not valid.") from exc
    if not isinstance(value, dict):
        raise Unprocessable.field("query.cursor", "The cursor is not valid.")
    return value


@dataclass(frozen=True)
class PageRequest:
    limit: int
    position: dict[str, Any] | None

    def key(self, name: str, kind: type[T]) -> T | None:
        """The cursor's value for `name`, type-checked (422 when the cursor was tampered with)."""
        if self.position is None:
            return None
        value = self.position.get(name)
        if not isinstance(value, kind):
            raise Unprocessable.field("query.cursor", "The cursor is not valid.")
        return value


async def _page_request(
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="Page size")] = DEFAULT_LIMIT,
    cursor: Annotated[
        str | None, Query(max_length=_MAX_CURSOR_CHARS, description="From `next_cursor`")
    ] = None,
) -> PageRequest:
    return PageRequest(limit=limit, position=decode_cursor(cursor) if cursor else None)


PageDep = Annotated[PageRequest, Depends(_page_request)]


def page_of(items: list[T], limit: int, position_of: Callable[[T], dict[str, Any]]) -> Page[T]:
    """Build a page from up to `limit + 1` fetched rows (the extra row means "there is more")."""
    more = len(items) > limit
    kept = items[:limit]
    next_cursor = encode_cursor(position_of(kept[-1])) if more and kept else None
    return Page[T](items=kept, next_cursor=next_cursor)
