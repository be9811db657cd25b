"""Request and response bodies of the user's memory routes (`/v1/me/memory...`).

The one request body forbids unknown fields, so a client cannot send `user_id`, `version` or
`turn_count`; those are the service's to write.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, field_validator

from app.detectors import Category
from app.kit.contract import NUL_FREE_PATTERN
from app.kit.pagination import Page
from app.kit.schemas import Schema
from app.profiles.policy import describe
from app.profiles.policy_actions import PolicyActionRecord
from app.profiles.service import VersionDiff
from app.profiles.versions import VersionInfo, VersionReason, VersionRow

MAX_CONTENT_CHARS: Final = 200_000


class MemoryIn(BaseModel):
    """A complete memory.md. Any frontmatter in it is ignored; the service writes its own."""

    model_config = ConfigDict(extra="forbid")

    content: Annotated[
        StrictStr,
        Field(max_length=MAX_CONTENT_CHARS, json_schema_extra={"pattern": NUL_FREE_PATTERN}),
    ]

    @field_validator("content")
    @classmethod
    def _no_nul(cls, value: str) -> str:
        if "\x00" in value:
            raise ValueError("must not contain NUL characters")
        return value


class MemoryOut(BaseModel):
    """The current profile. `version` is also the ETag (quoted) for If-Match / If-None-Match."""

    content: str
    version: int
    tokens: int = Field(description="Tokens of the profile body, as stored with the version")
    updated_at: datetime

    @classmethod
    def of(cls, row: VersionRow) -> MemoryOut:
        return cls(
            content=row.content, version=row.version, tokens=row.tokens, updated_at=row.created_at
        )


class OperationOut(BaseModel):
    op: str
    section: str
    old: str | None
    new: str | None


class VersionSummaryOut(Schema):
    """A retained version without its content."""

    version: int
    sha256: str
    tokens: int
    reason: VersionReason
    created_at: datetime
    model: str | None
    tokens_in: int | None
    tokens_out: int | None
    source_turn_ids: list[str]
    job_id: uuid.UUID | None
    operation_counts: dict[str, int] = Field(description="ADD / UPDATE / DELETE counts")

    @classmethod
    def page(cls, page: Page[VersionInfo]) -> Page[VersionSummaryOut]:
        return Page[VersionSummaryOut](
            items=[cls.model_validate(info) for info in page.items], next_cursor=page.next_cursor
        )


class VersionOut(VersionSummaryOut):
    """A retained version with its content and the operations that produced it."""

    content: str
    operations: list[OperationOut]


class VersionDiffOut(BaseModel):
    """A unified diff from version `from` (0: the empty document) to version `to`."""

    from_version: int = Field(alias="from")
    to: int
    diff: str

    @classmethod
    def of(cls, diff: VersionDiff) -> VersionDiffOut:
        return cls.model_validate(
            {"from": diff.from_version, "to": diff.to_version, "diff": diff.diff}
        )


# --- what the memory policy kept out ------------------------------------------------------------

UNKNOWN_CATEGORY: Final = "was not allowed by your company's memory policy"


def _description(category: str) -> str:
    """The user's words for a recorded category (one this build no longer knows: generic)."""
    try:
        return describe(Category(category))
    except ValueError:
        return UNKNOWN_CATEGORY


class PolicyActionOut(BaseModel):
    """One thing your company's memory policy kept out of your memory: a line not remembered
    (`drop`) or a value hidden in it (`redact`). Never the value itself."""

    occurred_at: datetime
    description: str = Field(description='Why, in words: e.g. "looked like a password or key"')
    category: str = Field(description="`secrets`, `payment_cards`, `email_addresses`, ...")
    kind: str = Field(description="What exactly it looked like, e.g. `password`, `iban`, `email`")
    action: Literal["drop", "redact"] = Field(
        description="`drop`: the line was not remembered; `redact`: it was, with the value "
        "replaced by `[redacted: <kind>]`"
    )
    section: str
    version: int | None = Field(
        description="The version written with it; null when the write stored nothing else"
    )
    reason: str = Field(description="The write: `consolidation`, `user_edit`, `restore`, ...")
    source_turn_ids: list[str] = Field(description="The turns a consolidation read")
    job_id: uuid.UUID | None

    @classmethod
    def of(cls, record: PolicyActionRecord) -> PolicyActionOut:
        return cls.model_validate(
            {
                "occurred_at": record.occurred_at,
                "description": _description(record.category),
                "category": record.category,
                "kind": record.kind,
                "action": record.action,
                "section": record.section,
                "version": record.version,
                "reason": record.reason,
                "source_turn_ids": record.source_turn_ids,
                "job_id": record.job_id,
            }
        )

    @classmethod
    def page(cls, page: Page[PolicyActionRecord]) -> Page[PolicyActionOut]:
        return Page[PolicyActionOut](
            items=[cls.of(record) for record in page.items], next_cursor=page.next_cursor
        )


# --- export ---------------------------------------------------------------------------------------


class ExportSettingsOut(BaseModel):
    context_memory: bool


class TurnOut(Schema):
    id: uuid.UUID
    space_id: str
    history_mode: str
    language_model: str | None
    created_at: datetime


class ChatMessageOut(Schema):
    id: int
    turn_id: uuid.UUID
    role: str
    content: str
    source: str
    created_at: datetime


class ChatOut(BaseModel):
    chat_id: str
    turns: list[TurnOut]
    messages: list[ChatMessageOut] = Field(description="In stored order")


class JobOut(Schema):
    id: uuid.UUID
    kind: str
    status: str
    outcome: str | None
    version: int | None
    created_at: datetime
    finished_at: datetime | None


class AuditEventOut(Schema):
    id: int
    occurred_at: datetime
    action: str
    old: dict[str, object] | None
    new: dict[str, object] | None


class MemoryExportOut(BaseModel):
    """Everything the service holds about the caller, as one document."""

    user_id: str
    company_id: str
    exported_at: datetime
    settings: ExportSettingsOut
    profile: MemoryOut | None
    versions: list[VersionOut] = Field(description="Every retained version, oldest first")
    chats: list[ChatOut]
    jobs: list[JobOut] = Field(description="Your consolidation jobs (ids only, no payload)")
    audit_events: list[AuditEventOut] = Field(description="Changes of your own setting")
    policy_actions: list[PolicyActionOut] = Field(
        description="What your company's memory policy kept out of your memory, oldest first: "
        "each line not remembered and each value hidden, when, where and why (never the value)"
    )


# --- user settings ------------------------------------------------------------------------------


class UserSettingsOut(BaseModel):
    context_memory: bool


class UserSettingsPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    context_memory: StrictBool = Field(
        description="`false` permanently deletes your memory (profile, versions, pending jobs)."
    )


class MemoryDeletionOut(Schema):
    profile: bool
    versions: int
    jobs: int
    folder: bool


class UserSettingsUpdateOut(Schema):
    context_memory: bool
    deleted: MemoryDeletionOut | None = Field(
        description="What turning context memory off deleted; `null` when turning it on."
    )
