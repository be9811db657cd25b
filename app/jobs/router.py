"""Job routes: a user polls one of their own jobs; operators list a company's jobs (the
dead-letter view with `?status=dead`) and send a dead job back to the queue."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query

from app.jobs import repository as stored_jobs
from app.jobs.errors import JobNotFound
from app.jobs.queue import JobStatus
from app.jobs.schemas import JobSummary, JobView
from app.kit.api_tags import OPERATOR, USER
from app.kit.auth.dependencies import CompanyOperatorDep, PrincipalDep
from app.kit.deps import CompanyIdPath, PageDep, SessionDep
from app.kit.pagination import Page

router = APIRouter()  # full paths, no prefix: metrics label by template; a tag per caller

_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "No such job"}}


async def _job_id(
    job_id: Annotated[
        str,
        Path(
            description="A job's id: `consolidation.job_id` of a saved turn, or `id` of a "
            "consolidation request"
        ),
    ],
) -> uuid.UUID:
    """A job id that is not a UUID names no job: 404, not 422."""
    try:
        return uuid.UUID(job_id)
    except ValueError as exc:
        raise JobNotFound from exc


JobIdDep = Annotated[uuid.UUID, Depends(_job_id)]


@router.get(
    "/v1/jobs/{job_id}",
    tags=[USER],
    summary="One of the caller's jobs",
    description="Called by whoever holds the person's token and a job id from a saved turn or "
    "a consolidation request (the person's tools, or the orchestrator on their behalf), to "
    "poll until the consolidation has run. Another user's job is a 404.",
    responses=_NOT_FOUND,
)
async def read_my_job(principal: PrincipalDep, job_id: JobIdDep, session: SessionDep) -> JobView:
    job = await stored_jobs.get_job(session, principal.company_id, principal.user_id, job_id)
    return JobView.of(job)


@router.get(
    "/v1/companies/{company_id}/jobs",
    tags=[OPERATOR],
    summary="A company's jobs, newest first",
    description="Called by an operator watching the consolidation queue of a company; "
    "`?status=dead` lists the jobs that failed every attempt, to retry them.",
)
async def list_company_jobs(
    _operator: CompanyOperatorDep,
    company_id: CompanyIdPath,
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
    tags=[OPERATOR],
    summary="Queue a dead-lettered job again",
    description="Called by an operator once the cause of a dead job is fixed (say, the "
    "language model is reachable again): the job goes back to the queue with fresh attempts.",
    responses={**_NOT_FOUND, 409: {"description": "The job is not dead"}},
)
async def retry_dead_job(
    _operator: CompanyOperatorDep, company_id: CompanyIdPath, job_id: JobIdDep, session: SessionDep
) -> JobSummary:
    return JobSummary.of(await stored_jobs.retry_dead_job(session, company_id, job_id))
