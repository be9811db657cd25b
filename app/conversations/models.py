"""Tables of the conversation domain: stored chat messages and the turns that saved them."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import BigInteger, CheckConstraint, Identity, Index, String, func
from sqlalchemy.orm import Mapped, mapped_column

from app.kit.db.base import Base


class Turn(Base):
    """One turn-save call: what it saved and which consolidation job it queued."""

    __tablename__ = "turns"
    __table_args__ = (Index("ix_turns_owner_chat", "company_id", "user_id", "chat_id"),)

    company_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    user_id: Mapped[str] = mapped_column(String(256))
    chat_id: Mapped[str] = mapped_column(String(128))
    space_id: Mapped[str] = mapped_column(String(128))
    history_mode: Mapped[str] = mapped_column(String(16))
    language_model: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())


class ChatMessage(Base):
    """A stored message; `id` orders messages (a global identity, so per-chat order is total)."""

    __tablename__ = "chat_messages"
    __table_args__ = (
        Index("ix_chat_messages_owner_chat_id", "company_id", "user_id", "chat_id", "id"),
        CheckConstraint("role IN ('system', 'user', 'assistant')", name="role"),
        CheckConstraint("source IN ('request', 'response', 'placeholder')", name="source"),
    )

    company_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(256))
    chat_id: Mapped[str] = mapped_column(String(128))
    turn_id: Mapped[uuid.UUID]
    role: Mapped[str] = mapped_column(String(16))
    content: Mapped[str]
    source: Mapped[str] = mapped_column(String(16))
    tokens: Mapped[int | None]  # NULL: not counted yet (counted when history is loaded)
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())


class IdempotencyKey(Base):
    """Stripe-style idempotency record, scoped to (company, user, key)."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (Index("ix_idempotency_keys_expires_at", "expires_at"),)

    company_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    request_hash: Mapped[str] = mapped_column(String(64))
    response_status: Mapped[int | None]
    response_body: Mapped[bytes | None]
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    expires_at: Mapped[datetime]
