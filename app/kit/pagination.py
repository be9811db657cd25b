"""Cursor pagination shared by every list endpoint: `{"items": [...], "next_cursor": ...}`.

A cursor is an opaque base64url JSON object holding the sort key of the last item returned;
a tampered or foreign cursor is a 422 naming the `cursor` query parameter. That includes a
well-formed cursor whose values the query could not carry (an id past the column's range, a
boolean for a number, a timestamp out of range): its owner reads it through the typed accessors
of `PageRequest`, which check it against what the database takes, never through the raw dict.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Generic, TypeVar
from uuid import UUID

import orjson
from pydantic import BaseModel

from app.kit.errors import Unprocessable

T = TypeVar("T")
DEFAULT_LIMIT = 50
MAX_LIMIT = 100
MAX_CURSOR_CHARS = 512
INTEGER_MAX: Final = 2**31 - 1
"""The largest value of a PostgreSQL `integer` column (a version number)."""
BIGINT_MAX: Final = 2**63 - 1
"""The largest value of a PostgreSQL `bigint` column (an identity id)."""


class Page(BaseModel, Generic[T]):
    items: list[T]
    next_cursor: str | None


def encode_cursor(position: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(position)).decode().rstrip("=")


def decode_cursor(cursor: str) -> dict[str, Any]:
    try:
        if len(cursor) > MAX_CURSOR_CHARS:
            raise ValueError("too long")
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        value = orjson.loads(raw)
    except (ValueError, binascii.Error, orjson.JSONDecodeError) as exc:
        raise _invalid_cursor() from exc
    if not isinstance(value, dict):
        raise _invalid_cursor()
    return value


@dataclass(frozen=True)
class PageRequest:
    limit: int
    position: dict[str, Any] | None

    def key(self, name: str, kind: type[T]) -> T | None:
        """The cursor's value for `name`, type-checked (422 when the cursor was tampered with).

        JSON's `true` is not a number here (Python's bool is an int), and no integer outside
        a `bigint` is taken: the driver would refuse it mid-query, a 500."""
        if self.position is None:
            return None
        value = self.position.get(name)
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise _invalid_cursor()
        if isinstance(value, int) and not -BIGINT_MAX - 1 <= value <= BIGINT_MAX:
            raise _invalid_cursor()
        return value

    def integer(self, name: str, *, maximum: int = BIGINT_MAX) -> int | None:
        """The cursor's integer `name`, within 0..`maximum` (the range of its column)."""
        value = self.key(name, int)
        if value is not None and not 0 <= value <= maximum:
            raise _invalid_cursor()
        return value

    def text(self, name: str, *, max_length: int) -> str | None:
        """The cursor's string `name`: 1..`max_length` characters (its column's width), none
        of them NUL (which no PostgreSQL text holds)."""
        value = self.key(name, str)
        if value is not None and not (0 < len(value) <= max_length and "\x00" not in value):
            raise _invalid_cursor()
        return value

    def instant(self, name: str) -> datetime | None:
        """The cursor's timestamp `name`, as `datetime.isoformat()` wrote it (with its offset),
        one that exists in UTC too (the driver sends it in UTC; `0001-01-01T00:00+05:00` has
        no UTC twin)."""
        text = self.key(name, str)
        if text is None:
            return None
        try:
            when = datetime.fromisoformat(text)
            if when.tzinfo is None or when.isoformat() != text:
                raise ValueError("not a timestamp this service wrote")
            when.astimezone(UTC)
        except (ValueError, OverflowError) as exc:
            raise _invalid_cursor() from exc
        return when

    def uuid(self, name: str) -> UUID | None:
        """The cursor's UUID `name`, in the canonical form this service writes."""
        text = self.key(name, str)
        if text is None:
            return None
        try:
            value = UUID(text)
        except ValueError as exc:
            raise _invalid_cursor() from exc
        if str(value) != text:
            raise _invalid_cursor()
        return value


def _invalid_cursor() -> Unprocessable:
    return Unprocessable.field("query.cursor", "The cursor is not valid.")


def page_of(items: list[T], limit: int, position_of: Callable[[T], dict[str, Any]]) -> Page[T]:
    """Build a page from up to `limit + 1` fetched rows (the extra row means "there is more")."""
    more = len(items) > limit
    kept = items[:limit]
    next_cursor = encode_cursor(position_of(kept[-1])) if more and kept else None
    return Page[T](items=kept, next_cursor=next_cursor)
