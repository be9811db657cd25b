"""Tables of the profile domain: the logical `memory.md` file, its immutable versions, and what
the company's memory policy kept out of them.

`memory_files.head_version` is advanced by compare-and-set; the primary key of
`memory_versions` (company_id, user_id, version) is the unique constraint behind it.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    ForeignKeyConstraint,
    Identity,
    Index,
    String,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from app.kit.db.base import Base

VERSION_REASONS = (
    "consolidation",
    "condensation",
    "truncation",
    "user_edit",
    "restore",
    "retention",
)


class MemoryFile(Base):
    __tablename__ = "memory_files"
    __table_args__ = (
        ForeignKeyConstraint(
            ["company_id", "folder_id"], ["folders.company_id", "folders.id"], ondelete="CASCADE"
        ),
    )

    company_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    folder_id: Mapped[uuid.UUID]
    name: Mapped[str] = mapped_column(String(64), server_default=text("'memory.md'"))
    skip_ingestion: Mapped[bool] = mapped_column(server_default=text("true"))
    hidden_in_chat: Mapped[bool] = mapped_column(server_default=text("true"))
    head_version: Mapped[int] = mapped_column(server_default=text("0"))
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())


class MemoryVersion(Base):
    __tablename__ = "memory_versions"
    __table_args__ = (
        ForeignKeyConstraint(
            ["company_id", "user_id"],
            ["memory_files.company_id", "memory_files.user_id"],
            ondelete="CASCADE",
        ),
        CheckConstraint(
            "reason IN ('consolidation', 'condensation', 'truncation', 'user_edit', 'restore',"
            " 'retention')",
            name="reason",
        ),
        CheckConstraint("version >= 1", name="version_positive"),
    )

    company_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    version: Mapped[int] = mapped_column(primary_key=True)
    content: Mapped[str]
    sha256: Mapped[str] = mapped_column(String(64))
    tokens: Mapped[int]
    reason: Mapped[str] = mapped_column(String(16))
    operations: Mapped[list[dict[str, Any]]] = mapped_column(JSONB, server_default=text("'[]'"))
    source_turn_ids: Mapped[list[str]] = mapped_column(JSONB, server_default=text("'[]'"))
    model: Mapped[str | None] = mapped_column(String(128))
    tokens_in: Mapped[int | None]
    tokens_out: Mapped[int | None]
    job_id: Mapped[uuid.UUID | None]
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())


class MemoryPolicyAction(Base):
    """One thing the company's memory policy did to a write of a user's profile: a bullet
    dropped, or a value in it redacted. Never the value: its category, the detector's `kind`,
    the section, and the write it happened in (`version` is NULL when the write stored nothing,
    e.g. every new bullet of a consolidation was dropped). Goes with memory.md (FK cascade:
    opt-out and erasure) and with a clear of the profile.
    """

    __tablename__ = "memory_policy_actions"
    __table_args__ = (
        ForeignKeyConstraint(
            ["company_id", "user_id"],
            ["memory_files.company_id", "memory_files.user_id"],
            ondelete="CASCADE",
        ),
        CheckConstraint("action IN ('drop', 'redact')", name="action"),
        Index("ix_memory_policy_actions_owner", "company_id", "user_id", text("id DESC")),
    )

    company_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(256))
    occurred_at: Mapped[datetime] = mapped_column(server_default=func.now())
    version: Mapped[int | None]
    reason: Mapped[str] = mapped_column(String(16))
    category: Mapped[str] = mapped_column(String(32))
    kind: Mapped[str] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(16))
    section: Mapped[str] = mapped_column(String(64))
    source_turn_ids: Mapped[list[str]] = mapped_column(JSONB, server_default=text("'[]'"))
    job_id: Mapped[uuid.UUID | None]
