"""The durable job queue's tables: jobs of any kind, payloads holding ids only, and when the
queue last served each company (the claim's fairness record).

The kinds themselves belong to the domains that queue and handle them; the migration that made
the table constrains `kind` to the kinds the service registers (a test holds the two together).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import CheckConstraint, Index, String, Text, func, text
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import Mapped, mapped_column

from app.kit.db.base import Base

JOB_STATUSES = ("queued", "running", "retrying", "succeeded", "dead")


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        CheckConstraint(
            "status IN ('queued', 'running', 'retrying', 'succeeded', 'dead')", name="status"
        ),
        CheckConstraint("outcome IS NULL OR outcome IN ('noop', 'updated')", name="outcome"),
        # the claim's order; `run_after IS NOT NULL` (always true) keeps any other query of
        # waiting jobs off it: only the claim's `run_after <= now()` proves it (migration 0011)
        Index(
            "ix_jobs_claimable",
            "run_after",
            postgresql_where=text("status IN ('queued', 'retrying') AND run_after IS NOT NULL"),
        ),
        Index("ix_jobs_owner_status", "company_id", "user_id", "status"),
        # an owner's waiting jobs of a kind: the quota's count and the coalescing target
        Index(
            "ix_jobs_waiting_owner",
            "company_id",
            "user_id",
            "kind",
            postgresql_where=text("status IN ('queued', 'retrying')"),
        ),
        # the claim's check that an owner holds no live lease: running jobs only, a few rows
        Index(
            "ix_jobs_running_owner",
            "company_id",
            "user_id",
            postgresql_where=text("status = 'running'"),
        ),
        # the claim walks the companies with pending jobs, then each one's pending jobs oldest
        # first (the predicate is the claim's literal `status IN (...)`, so plans can prove it)
        Index(
            "ix_jobs_pending_company",
            "company_id",
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
    # the W3C traceparent of each turn that queued the job or joined it, when sampled
    trace_context: Mapped[list[str] | None] = mapped_column(ARRAY(Text))


class JobCompanyClaim(Base):
    """When a worker last claimed a job of the company: the claim serves the company served least
    recently first (`app/jobs/queue.py`), so one company's backlog cannot starve another's.

    One row per company ever served, upserted by the claim's own transaction. It holds company
    ids and times only, nothing about any user, so erasing a user has nothing to delete here; a
    company export leaves it out (it describes this deployment's queue, not the company's data).
    """

    __tablename__ = "job_company_claims"

    company_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    last_claimed_at: Mapped[datetime]
