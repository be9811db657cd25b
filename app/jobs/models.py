"""The durable job queue's table: jobs of any kind, payloads holding ids only.

The kinds themselves belong to the domains that queue and handle them; the migration that made
the table constrains `kind` to the kinds the service registers (a test holds the two together).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import CheckConstraint, Index, String, func, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from app.db import Base

JOB_STATUSES = ("queued", "running", "retrying", "succeeded", "dead")


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        CheckConstraint(
            "status IN ('queued', 'running', 'retrying', 'succeeded', 'dead')", name="status"
        ),
        CheckConstraint("outcome IS NULL OR outcome IN ('noop', 'updated')", name="outcome"),
        Index(
            "ix_jobs_claimable",
            "run_after",
            postgresql_where=text("status IN ('queued', 'retrying')"),
        ),
        Index("ix_jobs_owner_status", "company_id", "user_id", "status"),
        # the claim scans pending jobs oldest first
        Index(
            "ix_jobs_pending_created",
            "created_at",
            "id",
            postgresql_where=text("status IN ('queued', 'retrying', 'running')"),
        ),
        # the operators' listing: a company's jobs, newest first
        Index("ix_jobs_company_created", "company_id", text("created_at DESC"), text("id DESC")),
    )

    company_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    user_id: Mapped[str] = mapped_column(String(256))
    kind: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), server_default=text("'queued'"))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'"))
    attempts: Mapped[int] = mapped_column(server_default=text("0"))
    max_attempts: Mapped[int]
    run_after: Mapped[datetime] = mapped_column(server_default=func.now())
    lease_token: Mapped[uuid.UUID | None]
    lease_expires_at: Mapped[datetime | None]
    locked_by: Mapped[str | None] = mapped_column(String(128))
    outcome: Mapped[str | None] = mapped_column(String(16))
    version: Mapped[int | None]
    error_class: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(String(512))
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())
    finished_at: Mapped[datetime | None]
