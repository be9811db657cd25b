"""`POST /v1/me/memory/consolidations`: consolidate one exchange now (async, or `?wait=true`)."""

from __future__ import annotations

from typing import Annotated, Any, Final

from fastapi import APIRouter, Body, Depends, Query, Request, Response, status

from app.jobs.schemas import JobView
from app.kit.api_tags import USER
from app.kit.auth.dependencies import PrincipalDep
from app.kit.config import Settings
from app.kit.db.engine import Database
from app.rate_limits.dependency import rate_limited
from app.rate_limits.policy import RouteClass
from app.turns.explicit import ConsolidationRequest, request_consolidation, wait_for_job

router = APIRouter(tags=[USER])  # full paths, no prefix: metrics label by template

JOB_LINKS: dict[str, Any] = {  # OpenAPI links: the job to poll
    "Job": {
        "operationRef": "#/paths/~1v1~1jobs~1{job_id}/get",
        "parameters": {"job_id": "$response.body#/id"},
    }
}


# Request example, as Swagger UI's "Try it out" sends it (`tests/test_openapi_examples.py`)
CONSOLIDATION_EXAMPLES: Final[dict[str, Any]] = {
    "exchange": {
        "summary": "One exchange to remember",
        "value": {
            "space_id": "space-1",
            "user": "I moved to Zurich last month and now commute by train.",
            "assistant": "Thanks, I'll keep that in mind.",
        },
    },
}


@router.post(
    "/v1/me/memory/consolidations",
    dependencies=[Depends(rate_limited(RouteClass.CONSOLIDATIONS))],
    summary="Consolidate one exchange into your memory (queued; `wait=true` for the result)",
    status_code=status.HTTP_202_ACCEPTED,
    responses={
        200: {
            "description": "Finished (with `wait=true`): succeeded or dead",
            "model": JobView,
            "links": JOB_LINKS,
        },
        202: {"description": "Queued (poll the job)", "links": JOB_LINKS},
        409: {"description": "Context memory is not enabled for you in this space"},
    },
)
async def consolidate_exchange(
    body: Annotated[ConsolidationRequest, Body(openapi_examples=CONSOLIDATION_EXAMPLES)],
    principal: PrincipalDep,
    *,
    request: Request,
    response: Response,
    wait: Annotated[bool, Query(description="Wait for the consolidation to finish")] = False,
    wait_seconds: Annotated[
        float,
        Query(alias="timeout", gt=0, le=120, description="Seconds to wait with `wait=true`"),
    ] = 30.0,
) -> JobView:
    """Called for the person (an assistant, a script, a test of the memory) who wants one
    exchange consolidated now, outside a chat; it needs context memory active in the space.
    The exchange is committed and queued before waiting starts; a wait that times out answers
    202 with the job still pending (poll `GET /v1/jobs/{job_id}`)."""
    database: Database = request.app.state.database
    settings: Settings = request.app.state.settings
    job_id = await request_consolidation(database, principal, body, settings=settings)
    request.app.state.job_signal.poke()
    job = await wait_for_job(database, principal, job_id, wait_seconds if wait else 0)
    if job.status in ("succeeded", "dead"):
        response.status_code = status.HTTP_200_OK
    response.headers["Location"] = f"/v1/jobs/{job_id}"
    return JobView.of(job)
