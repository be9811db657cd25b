"""The erasure's answer: what was deleted and what was anonymised, as counts."""

from __future__ import annotations

from pydantic import Field

from app.kit.schemas import Schema


class DeletedOut(Schema):
    profile: bool = Field(description="The memory.md profile existed and was deleted")
    versions: int
    folder: bool = Field(description="The folder user-memory/<your id> and its access entries")
    chats: int
    turns: int
    messages: int
    jobs: int = Field(description="All your jobs, finished ones included")
    idempotency_keys: int
    settings: bool = Field(description="Your stored setting (it is back at its default)")
    audit_events: int = Field(description="Audit events about your setting and memory")


class AnonymisedOut(Schema):
    audit_events: int = Field(
        description="Audit events of changes you made to company flags, spaces or memory "
        "policies, kept without your id"
    )
    settings: int = Field(
        description="Company flags, spaces and memory policies you changed last, kept without "
        "your id"
    )


class ErasureOut(Schema):
    deleted: DeletedOut
    anonymised: AnonymisedOut
