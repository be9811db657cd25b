"""Job routes: a user polls one of their own jobs; operators list a company's jobs (the
dead-letter view with `?status=dead`) and send a dead job back to the queue."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from app.auth import Principal, PrincipalDep, require_role
from app.db import SessionDep
from app.errors import NotFound
from app.jobs import repository as stored_jobs
from app.jobs.queue import JobStatus
from app.jobs.schemas import JobSummary, JobView
from app.pagination import Page, PageDep

router = APIRouter(tags=["jobs"])  # full paths, no prefix: metrics label by template

OperatorDep = Annotated[Principal, Depends(require_role("operator"))]
_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "No such job"}}


async def _job_id(job_id: str) -> uuid.UUID:
    """A job id that is not a UUID names no job: 404, not 422."""
    try:
        return uuid.UUID(job_id)
    except ValueError as exc:
        raise NotFound("No such job.") from exc


JobIdDep = Annotated[uuid.UUID, Depends(_job_id)]


@router.get("/v1/jobs/{job_id}", summary="One of the caller's jobs", responses=_NOT_FOUND)
async def read_my_job(principal: PrincipalDep, job_id: JobIdDep, session: SessionDep) -> JobView:
    job = await stored_jobs.get_job(session, principal.company_id, principal.user_id, job_id)
    return JobView.of(job)


@router.get("/v1/companies/{company_id}/jobs", summary="A company's jobs, newest first")
async def list_company_jobs(
    _operator: OperatorDep,
    company_id: str,
    session: SessionDep,
    page: PageDep,
    status: Annotated[JobStatus | None, Query(description="Only jobs in this status")] = None,
) -> Page[JobSummary]:
    jobs = await stored_jobs.list_jobs(session, company_id, status, page)
    return Page[JobSummary](
        items=[JobSummary.of(job) for job in jobs.items], next_cursor=jobs.next_cursor
    )


@router.post(
    "/v1/companies/{company_id}/jobs/{job_id}/retry",
    summary="Queue a dead-lettered job again",
    responses={**_NOT_FOUND, 409: {"description": "The job is not dead"}},
)
async def retry_dead_job(
    _operator: OperatorDep, company_id: str, job_id: JobIdDep, session: SessionDep
) -> JobSummary:
    return JobSummary.of(await stored_jobs.retry_dead_job(session, company_id, job_id))
