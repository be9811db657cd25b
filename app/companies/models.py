"""Tables of the company registry.

`companies` is a company table (its first key column `company_id`: distributed on Citus with
the others, and erased with the company). `platform_events` and `company_offboardings` are
platform tables, named by `subject_company` and without a `company_id` column, so that they
survive the company they describe (reference tables on Citus, `app/kit/citus.py`'s plan).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Final

from sqlalchemy import BigInteger, CheckConstraint, Identity, Index, String, func, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from app.kit.db.base import Base

ORIGINS: Final = ("operator", "first_use", "import")
"""How a company came to be registered: `POST /v1/companies`, its own operators' first call to
its company routes, or a company import."""
OFFBOARDING_STATUSES: Final = ("queued", "running", "done")


class Company(Base):
    """A company the service serves: its id (as its tokens name it), a display name, how and
    when it was registered. Everything else about it is counted from its data."""

    __tablename__ = "companies"
    __table_args__ = (CheckConstraint(f"origin IN {ORIGINS}", name="origin"),)

    company_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    display_name: Mapped[str] = mapped_column(String(200))
    origin: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())


class PlatformEvent(Base):
    """The platform-level log: a company registered, its offboarding requested and finished.
    Counts and names only, never content; kept when the company it names is erased. The actor
    is (`actor_company_id`, `actor_id`), anonymised when that user is erased."""

    __tablename__ = "platform_events"
    __table_args__ = (
        Index("ix_platform_events_subject_company_id", "subject_company", "id"),
        Index("ix_platform_events_actor", "actor_company_id", "actor_id"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True), primary_key=True)
    occurred_at: Mapped[datetime] = mapped_column(server_default=func.now())
    subject_company: Mapped[str] = mapped_column(String(128))
    actor_company_id: Mapped[str] = mapped_column(String(128))
    actor_id: Mapped[str] = mapped_column(String(256))
    action: Mapped[str] = mapped_column(String(64))
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSONB)


class CompanyOffboarding(Base):
    """The durable record of one offboarding: queued by `DELETE /v1/companies/{company_id}`,
    run table by table (each table's deletion committed with its count in `erased`), done once
    a pass over every company table found nothing left. At most one unfinished per company."""

    __tablename__ = "company_offboardings"
    __table_args__ = (
        CheckConstraint(f"status IN {OFFBOARDING_STATUSES}", name="status"),
        CheckConstraint("jsonb_typeof(erased) = 'object'", name="erased_object"),
        Index(
            "uq_company_offboardings_unfinished",
            "subject_company",
            unique=True,
            postgresql_where=text("status <> 'done'"),
        ),
        Index("ix_company_offboardings_subject_company", "subject_company", "requested_at"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    subject_company: Mapped[str] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(16), server_default=text("'queued'"))
    requested_at: Mapped[datetime] = mapped_column(server_default=func.now())
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    erased: Mapped[dict[str, int]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    passes: Mapped[int] = mapped_column(server_default=text("0"))
