"""The operators' rate-limit overrides per company."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import CheckConstraint, String, func
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from app.kit.db.base import Base


class CompanyRateLimits(Base):
    """A company's overrides of the service's rate limits; a company with no row has the
    defaults (the `RATE_LIMIT_*` settings).

    `limits` maps a route class to an object of scope -> `"QUOTA/WINDOW_SECONDS"` or `"off"`;
    a scope (or class) left out keeps the default. Company configuration, no user's data.
    """

    __tablename__ = "company_rate_limits"
    __table_args__ = (CheckConstraint("jsonb_typeof(limits) = 'object'", name="limits_object"),)

    company_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    limits: Mapped[dict[str, dict[str, str]]] = mapped_column(JSONB)
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())
    # who changed it last, as (company, user): operators change other companies' limits
    updated_by_company_id: Mapped[str] = mapped_column(String(128))
    updated_by: Mapped[str] = mapped_column(String(256))
