"""Schema types every domain shares: the identifier rules and `Schema`, the base of the response
bodies built from domain objects (the `company_id` path parameter is in app/kit/deps.py)."""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import BaseModel, ConfigDict, Field

IDENTIFIER_PATTERN: Final = r"^[A-Za-z0-9._:-]{1,128}$"
"""An id the callers choose (space, chat, request id): 1..128 of letters, digits and `._:-`, so
it is safe in a path, a header, a log line and a metric label as it is."""

COMPANY_ID_PATTERN: Final = r"^[^\x00-\x1f\x7f]+$"
"""A company id in a path: any text but control characters (a token's company id is printable;
PostgreSQL text holds no NUL), 1..128 of them."""

Identifier = Annotated[str, Field(pattern=IDENTIFIER_PATTERN)]
"""A body field or tool argument held to `IDENTIFIER_PATTERN` (path and query parameters state
the pattern in their own `Path`/`Query`, which FastAPI reads instead of a `Field`)."""


class Schema(BaseModel):
    """A response body read from a domain object's attributes: `Out.model_validate(obj)` where
    the object's names are the body's. A body that renames or computes a field says so in a
    classmethod `of` of its own."""

    model_config = ConfigDict(from_attributes=True)
