"""Tables of the enablement domain: company flags, space settings, user settings, the company's
memory policy, audit log."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, CheckConstraint, Identity, Index, String, func, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from app.kit.db.base import Base

DEFAULT_LANGUAGE_MODEL = "AZURE_GPT_4o_2024_1120"
DEFAULT_MAX_TOKENS = 2000
MIN_MAX_TOKENS = 500
MAX_MAX_TOKENS = 8000
MAX_POLICY_DAYS = 3650
"""The longest retention a memory policy may set, in days (about ten years; 0 means never)."""


class CompanyFeatureFlag(Base):
    __tablename__ = "company_feature_flags"

    company_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    flag: Mapped[str] = mapped_column(String(128), primary_key=True)
    enabled: Mapped[bool]
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())
    # who changed it last, as (company, user): operators change other companies' flags
    updated_by_company_id: Mapped[str] = mapped_column(String(128))
    updated_by: Mapped[str] = mapped_column(String(256))


class CompanyMemoryPolicy(Base):
    """What a company allows in its users' memories; a company with no row has the defaults
    (`app.enablement.memory_policy.DEFAULT_POLICY`).

    `actions` maps a category to `drop`, `redact` or `allow`; a category missing from it (one
    added to the service after the policy was saved) reads as its default.
    """

    __tablename__ = "company_memory_policies"
    __table_args__ = (
        CheckConstraint(
            f"recent_topics_days BETWEEN 0 AND {MAX_POLICY_DAYS}", name="recent_topics_days_range"
        ),
        CheckConstraint(
            f"inactive_memory_days BETWEEN 0 AND {MAX_POLICY_DAYS}",
            name="inactive_memory_days_range",
        ),
        CheckConstraint("jsonb_typeof(actions) = 'object'", name="actions_object"),
    )

    company_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    actions: Mapped[dict[str, str]] = mapped_column(JSONB)
    recent_topics_days: Mapped[int]
    inactive_memory_days: Mapped[int]
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())
    # who changed it last, as (company, user): operators change other companies' policies
    updated_by_company_id: Mapped[str] = mapped_column(String(128))
    updated_by: Mapped[str] = mapped_column(String(256))


class SpaceSettings(Base):
    """A space's saved settings; a space with no row reads as its defaults."""

    __tablename__ = "space_settings"
    __table_args__ = (
        CheckConstraint(
            f"max_tokens BETWEEN {MIN_MAX_TOKENS} AND {MAX_MAX_TOKENS}", name="max_tokens_range"
        ),
    )

    company_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    space_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    # NULL = key absent = enabled (seed: "treated as enabled when the key is absent")
    context_memory: Mapped[bool | None]
    web_search: Mapped[bool] = mapped_column(server_default=text("false"))
    use_orchestrator_language_model: Mapped[bool] = mapped_column(server_default=text("true"))
    language_model: Mapped[str] = mapped_column(
        String(128), server_default=text(f"'{DEFAULT_LANGUAGE_MODEL}'")
    )
    max_tokens: Mapped[int] = mapped_column(server_default=text(str(DEFAULT_MAX_TOKENS)))
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())
    updated_by_company_id: Mapped[str] = mapped_column(String(128))
    updated_by: Mapped[str] = mapped_column(String(256))


class UserSettings(Base):
    __tablename__ = "user_settings"

    company_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    context_memory: Mapped[bool | None]  # NULL = never saved = enabled
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())


class AuditEvent(Base):
    """Who changed what, when, old -> new; never memory content.

    The actor is (`actor_company_id`, `actor_id`): a user id means something only within its
    company, and an operator's events live in the log of the company they changed.
    """

    __tablename__ = "audit_events"
    __table_args__ = (
        Index("ix_audit_events_company_id_id_desc", "company_id", text("id DESC")),
        Index("ix_audit_events_actor", "actor_company_id", "actor_id"),  # the erasure's lookup
    )

    company_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True), primary_key=True)
    occurred_at: Mapped[datetime] = mapped_column(server_default=func.now())
    actor_company_id: Mapped[str] = mapped_column(String(128))
    actor_id: Mapped[str] = mapped_column(String(256))
    action: Mapped[str] = mapped_column(String(64))
    target_kind: Mapped[str] = mapped_column(String(32))
    target_id: Mapped[str] = mapped_column(String(256))
    old: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    new: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
