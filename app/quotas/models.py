"""The marks of the periodic quota check: one row per user or company found at or over a
stored-amount quota, read by turn-save's settings statement by primary key. Nobody under every
quota has a row, so the tables stay small."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, CheckConstraint, String, func
from sqlalchemy.orm import Mapped, mapped_column

from app.kit.db.base import Base


class UserQuotaMark(Base):
    """A user whose `used` amount of `quota` had reached `quota_limit` at `checked_at`."""

    __tablename__ = "user_quota_marks"
    __table_args__ = (CheckConstraint("quota IN ('user_history_messages')", name="quota"),)

    company_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    quota: Mapped[str] = mapped_column(String(32), primary_key=True)
    used: Mapped[int] = mapped_column(BigInteger)
    quota_limit: Mapped[int] = mapped_column(BigInteger)
    checked_at: Mapped[datetime] = mapped_column(server_default=func.now())


class CompanyQuotaMark(Base):
    """A company whose `used` amount of `quota` had reached `quota_limit` at `checked_at`."""

    __tablename__ = "company_quota_marks"
    __table_args__ = (CheckConstraint("quota IN ('company_storage_bytes')", name="quota"),)

    company_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    quota: Mapped[str] = mapped_column(String(32), primary_key=True)
    used: Mapped[int] = mapped_column(BigInteger)
    quota_limit: Mapped[int] = mapped_column(BigInteger)
    checked_at: Mapped[datetime] = mapped_column(server_default=func.now())
