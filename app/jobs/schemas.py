"""Response bodies of the job routes: a user's view of one job and the operator's summary.

Neither carries a payload: operators see ids, statuses and fixed error descriptions only.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from app.jobs.enqueue import registered_kinds
from app.jobs.queue import JobKind, JobOutcome, JobStatus
from app.jobs.repository import JobRow


class JobError(BaseModel):
    """The last failure: an error class and a fixed description (never user text)."""

    model_config = ConfigDict(populate_by_name=True)

    error_class: str = Field(alias="class")
    message: str

    @classmethod
    def of(cls, job: JobRow) -> JobError | None:
        if job.error_class is None:
            return None
        return cls(error_class=job.error_class, message=job.error_message or "")


class JobView(BaseModel):
    """`GET /v1/jobs/{job_id}`: one of the caller's own jobs."""

    id: uuid.UUID
    status: JobStatus
    outcome: JobOutcome | None
    version: int | None
    attempts: int
    error: JobError | None

    @classmethod
    def of(cls, job: JobRow) -> JobView:
        return cls(
            id=job.id,
            status=job.status,
            outcome=job.outcome,
            version=job.version,
            attempts=job.attempts,
            error=JobError.of(job),
        )


def _declare_registered_kinds(schema: dict[str, JsonValue]) -> None:
    """The contract lists the kinds the domains registered (read when the schema is built)."""
    schema["enum"] = list(registered_kinds())


class JobSummary(BaseModel):
    """A job as operators see it (company listing, retry)."""

    id: uuid.UUID
    user_id: str
    kind: JobKind = Field(json_schema_extra=_declare_registered_kinds)
    status: JobStatus
    attempts: int
    max_attempts: int
    error: JobError | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, job: JobRow) -> JobSummary:
        return cls(
            id=job.id,
            user_id=job.user_id,
            kind=job.kind,
            status=job.status,
            attempts=job.attempts,
            max_attempts=job.max_attempts,
            error=JobError.of(job),
            created_at=job.created_at,
            updated_at=job.updated_at,
        )
