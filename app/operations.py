"""Operational endpoints: liveness, readiness (database + migrations at head), metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel
from starlette.responses import Response

from app.db import Database, database_is_ready, is_database_unavailable
from app.errors import ServiceUnavailable

router = APIRouter(tags=["operations"])


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    status: str
    database: str
    migration: str | None
    expected_migration: str | None


@router.get("/healthz", summary="The process is alive")
async def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    summary="The database is reachable and migrated to head",
    responses={503: {"description": "Not ready"}},
)
async def readyz(request: Request) -> Readiness:
    db: Database = request.app.state.database
    expected: str | None = request.app.state.head_revision
    retry_after = {
        "Retry-After": str(request.app.state.settings.db_unavailable_retry_after_seconds)
    }
    try:
        _, revision = await database_is_ready(db)
    except Exception as exc:
        if is_database_unavailable(exc):
            raise ServiceUnavailable("The database is unreachable.", headers=retry_after) from exc
        raise
    if revision != expected:
        raise ServiceUnavailable(
            f"Database schema is at {revision}, expected {expected}; run `python -m app migrate`.",
            headers=retry_after,
        )
    return Readiness(status="ready", database="ok", migration=revision, expected_migration=expected)


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    registry = request.app.state.metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
