"""Bodies of the import routes: a company import's outcome, and a user's memory export sent back
(`GET /v1/me/memory/export`'s document, of which only `profile.content` is read).
"""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import BaseModel, ConfigDict, Field, JsonValue, StrictStr, field_validator

from app.kit.contract import NUL_FREE_PATTERN, JsonInt
from app.kit.schemas import Schema
from app.profiles.schemas import MAX_CONTENT_CHARS

NO_PROFILE: Final = (
    "The export holds no profile (it was taken when there was none); there is nothing to import."
)


class CompanyImportOut(Schema):
    """What an import loaded (or, replayed, what the first import of the same stream did)."""

    company_id: str
    sha256: str = Field(description="SHA-256 of the stream as received (what makes it the same)")
    records: dict[str, int] = Field(description="Records loaded, by type")
    replayed: bool = Field(
        description="`true`: this very stream had been imported into the company before, and "
        "nothing was written now"
    )


class ExportedProfileIn(BaseModel):
    """The export's `profile`: its `content` is imported; the rest says what it was."""

    model_config = ConfigDict(extra="forbid")

    content: Annotated[
        StrictStr,
        Field(max_length=MAX_CONTENT_CHARS, json_schema_extra={"pattern": NUL_FREE_PATTERN}),
    ]
    version: JsonInt | None = None
    tokens: JsonInt | None = None
    updated_at: StrictStr | None = None

    @field_validator("content")
    @classmethod
    def _no_nul(cls, value: str) -> str:
        if "\x00" in value:
            raise ValueError("must not contain NUL characters")
        return value


class MemoryImportIn(BaseModel):
    """A memory export as `GET /v1/me/memory/export` answers it. Only `profile.content` is
    read: the rest (ids, settings, versions, chats, jobs, audit events) is accepted so that the
    document can be sent back as it is, and is not imported."""

    model_config = ConfigDict(extra="forbid")

    profile: ExportedProfileIn = Field(
        description="The profile to import (an export taken when there was none, `null`, has "
        "nothing to import)"
    )
    user_id: StrictStr | None = None
    company_id: StrictStr | None = None
    exported_at: StrictStr | None = None
    settings: dict[str, JsonValue] | None = None
    versions: list[JsonValue] | None = None
    chats: list[JsonValue] | None = None
    jobs: list[JsonValue] | None = None
    audit_events: list[JsonValue] | None = None
    policy_actions: list[JsonValue] | None = None

    @field_validator("profile", mode="before")
    @classmethod
    def _has_profile(cls, value: object) -> object:
        if value is None:
            raise ValueError(NO_PROFILE)
        return value
