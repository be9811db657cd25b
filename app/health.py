"""Operational endpoints: liveness, readiness (database + migrations at head), metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from prometheus_client.exposition import choose_encoder
from pydantic import BaseModel
from starlette.responses import Response

from app.kit.api_tags import OPERATIONS
from app.kit.db.engine import Database
from app.kit.db.errors import is_database_unavailable
from app.kit.db.readiness import database_is_ready
from app.kit.errors import DatabaseUnreachable, IssuerKeysStale, SchemaNotMigrated

router = APIRouter(tags=[OPERATIONS])


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    status: str
    database: str
    migration: str | None
    expected_migration: str | None


@router.get(
    "/healthz",
    summary="The process is alive",
    description="Called by a load balancer or a container orchestrator's liveness probe, every "
    "few seconds: 200 as long as the process answers, whatever the database's state.",
)
async def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    summary="The database is reachable and migrated to head",
    description="Called by a readiness probe before traffic is sent to this process, and after "
    "a deployment: 200 once the database answers and its schema is at the migration this "
    "version expects; 503 (with `Retry-After`) otherwise.",
    responses={503: {"description": "Not ready"}},
)
async def readyz(request: Request) -> Readiness:
    db: Database = request.app.state.database
    expected: str | None = request.app.state.head_revision
    retry_after: int = request.app.state.settings.db_unavailable_retry_after_seconds
    try:
        _, revision = await database_is_ready(db)
    except Exception as exc:
        if is_database_unavailable(exc):
            raise DatabaseUnreachable(retry_after) from exc
        raise
    stale = await request.app.state.token_verifier.keys.stale_issuers()
    if stale:
        raise IssuerKeysStale(stale, retry_after)
    if revision != expected:
        raise SchemaNotMigrated(revision, expected, retry_after)
    return Readiness(status="ready", database="ok", migration=revision, expected_migration=expected)


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    description="Scraped by Prometheus: request latency by route template, 503s for an "
    "unreachable database, the job queue, consolidation outcomes and model tokens, as counted "
    "by the process that answers. In the Prometheus text format, or OpenMetrics when the "
    "scraper asks for it (`Accept: application/openmetrics-text`), whose latency buckets carry "
    "trace ids as exemplars when tracing is on.",
    response_class=Response,
)
async def metrics(request: Request) -> Response:
    registry = request.app.state.metrics.registry
    # prometheus_client's own negotiation: exemplars exist only in OpenMetrics
    encode, content_type = choose_encoder(request.headers.get("accept", ""))
    return Response(encode(registry), media_type=content_type)
