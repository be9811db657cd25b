"""Application factory: lifespan (database, embedded PostgreSQL, in-process worker), middleware,
routers."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING

from fastapi import FastAPI
from starlette.responses import Response

from app import health
from app.control_plane import router as control_plane_router
from app.conversations import router as conversations_router
from app.docs_pages import install_docs_pages
from app.enablement import router as enablement_router
from app.erasure import router as erasure_router
from app.folders import router as folders_router
from app.identity import router as identity_router
from app.jobs import router as jobs_router
from app.jobs.wakeup import JobSignal
from app.kit.api_tags import OPENAPI_TAGS
from app.kit.auth.verifiers import log_verifiers
from app.kit.auth.verify import TokenVerifier
from app.kit.citus import runs_citus
from app.kit.config import Settings, get_settings, warn_unknown_settings
from app.kit.contract import install_contract
from app.kit.db.engine import Database, create_database
from app.kit.db.migrations import head_revision
from app.kit.jwks import KeyStore
from app.kit.lean_routes import guard_dependency_overrides
from app.kit.limits import (
    BodySizeLimitMiddleware,
    BodyTimeoutMiddleware,
    HeaderLimitMiddleware,
    StreamedLimit,
)
from app.kit.observability import Metrics, RequestContextMiddleware
from app.kit.problems import install_error_handlers, render_unexpected_error
from app.kit.spool import ReadSlots
from app.kit.startup import database_url, freeze_startup_objects
from app.kit.tokens import TokenCounters
from app.kit.traced_app import TracedApp, fastapi_telemetry
from app.kit.tracing import Tracing
from app.mcp_server.discovery import ResourceDiscovery
from app.mcp_server.endpoint import MCP_PATH, McpEndpoint, mcp_route
from app.portability import router as portability_router
from app.profiles import router as profiles_router
from app.profiles.versions import VersionPolicy
from app.quotas.limits import quota_limits
from app.rate_limits import router as rate_limits_router
from app.rate_limits import service as rate_limits_service
from app.turns import explicit_router, idempotency
from app.turns import router as turns_router
from app.turns.batching import TurnBatcher
from app.ui import router as ui_router
from app.usage import router as usage_router
from app.usage.meter import UsageMeter
from app.worker_main import consolidation_worker, offboarder, version_policy

if TYPE_CHECKING:
    from app.consolidation.runner import BackgroundWorker

API_DESCRIPTION = """
Memory as a service for AI chat orchestrators: a persistent, structured `memory.md` profile per
user ("What I know about you") plus conversation history resolved by one of four memory modes.
Every `/v1` route needs `Authorization: Bearer <JWT>`; errors are `application/problem+json`.
"""


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Everything a serving process holds, each resource entered and its release pushed on one
    stack: at shutdown (or when start-up fails part way) they are released in the reverse
    order, each one whether or not a release before it failed. Released first the MCP
    endpoint, then the overrides' refresh, the in-process worker (it finishes the jobs in hand)
    and its pool, the job signal, the usage meter (the counts since the last flush), the
    issuers' keys, the database, the embedded PostgreSQL, and last the tracing."""
    guard_dependency_overrides(app)  # overrides the lean routes would ignore: refused
    settings: Settings = app.state.settings
    tracing: Tracing = app.state.tracing
    verifier: TokenVerifier = app.state.token_verifier
    # before anything can fail: a mistyped DB_* or WORKER_* variable is then in the log too
    warn_unknown_settings(os.environ)
    async with AsyncExitStack() as stack:
        # pushed first to run last: flushes the spans still waiting for export, those of the
        # shutdown included (nothing to do unless `tracing.start()` below ran)
        stack.push_async_callback(asyncio.to_thread, tracing.stop)
        url, embedded = await database_url(settings)
        if embedded is not None:
            stack.push_async_callback(asyncio.to_thread, embedded.stop)
        database = create_database(url, settings)
        stack.push_async_callback(database.dispose)
        app.state.database = database
        app.state.turn_batcher = TurnBatcher(
            database.driver.connection,
            quota_limits(settings),
            max_batch=settings.turn_batch_max,
            in_flight=min(settings.turn_batch_in_flight, settings.db_hot_pool_size),
            observe=app.state.metrics.turn_save_batch_turns.observe,
            citus=partial(runs_citus, database.engine),
        )
        # the one tiktoken wrapper: loads the offline encoding now, not at the first request
        app.state.tokens = TokenCounters(settings.llm_encodings_dir)
        tracing.start()  # in this process: after `serve --workers N` spawned it
        # the trusted issuers' keys, before the first request; closed even if a fetch fails
        stack.push_async_callback(verifier.keys.close)
        await verifier.keys.open()
        log_verifiers(settings)  # which token checks are active, never a key
        # turns saved and contexts served, counted in memory, written every USAGE_FLUSH_SECONDS
        meter = UsageMeter(
            database,
            settings.usage_flush_seconds,
            on_flush_failure=app.state.metrics.usage_flush_failures.inc,
        )
        app.state.usage_meter = meter
        meter.start()
        stack.push_async_callback(meter.stop)
        # idle workers woken when turn-saves queue jobs (app/jobs/wakeup.py)
        app.state.job_signal = job_signal = JobSignal(
            database.driver.connect_kwargs, settings.job_notify_interval_ms / 1000
        )
        stack.push_async_callback(job_signal.close)
        await rate_limits_service.refresh_or_keep(database.engine, app.state.rate_limiter)
        policy = version_policy(settings, app.state.tokens, app.state.metrics)
        if settings.worker_enabled:
            # its own small pool: claims and heartbeats never wait behind request traffic
            worker_database = create_database(url, settings, pool_size=settings.worker_pool_size)
            stack.push_async_callback(worker_database.dispose)
            worker = _in_process_worker(app, worker_database, policy)
            worker.start()
            stack.push_async_callback(worker.stop)
        overrides = asyncio.create_task(
            rate_limits_service.keep_overrides_fresh(
                database.engine, app.state.rate_limiter, settings.rate_limit_refresh_seconds
            )
        )
        stack.push_async_callback(_cancel, overrides)
        mcp: McpEndpoint = app.state.mcp
        await stack.enter_async_context(
            mcp.running(database, policy, app.state.rate_limiter, tracing.tracer)
        )
        freeze_startup_objects()
        yield


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def _in_process_worker(app: FastAPI, database: Database, policy: VersionPolicy) -> BackgroundWorker:
    """The worker `serve` runs beside the API (`WORKER_ENABLED`), with its maintenance steps."""
    tracing: Tracing = app.state.tracing
    return consolidation_worker(
        database,
        app.state.settings,
        app.state.metrics,
        app.state.tokens,
        tracing,
        policy=policy,
        offboarder=app.state.offboarder,
    )


def create_app(settings: Settings | None = None, tracing: Tracing | None = None) -> FastAPI:
    """The app; `tracing` as the `OTEL_*` variables say unless given (tests hand in their own
    exporter: nothing global is set either way)."""
    settings = settings or get_settings()
    tracing = tracing or Tracing.from_environment()
    app = TracedApp(
        title="Context Memory Service",
        version="0.1.0",
        description=API_DESCRIPTION,
        openapi_tags=OPENAPI_TAGS,
        lifespan=lifespan,
        # FastAPI's own pages load Swagger UI and ReDoc from a CDN; these are served locally
        docs_url=None,
        redoc_url=None,
        # the server span of each request when tracing is on; a constant check when off
        telemetry=fastapi_telemetry(tracing),
    )
    app.door = tracing.door()
    metrics = Metrics()
    app.state.settings = settings
    app.state.tracing = tracing
    app.state.metrics = metrics
    app.state.token_verifier = TokenVerifier(
        settings,
        keys=KeyStore(settings, on_fetch=metrics.observe_jwks_fetch),
        on_role_dropped=metrics.observe_role_dropped,
    )
    app.state.head_revision = head_revision()
    app.state.offboarder = offboarder()
    app.state.rate_limiter = rate_limits_service.limiter_for(settings)
    app.state.export_slots = ReadSlots(
        settings.export_read_concurrency, settings.export_read_company_concurrency
    )

    install_error_handlers(app)
    install_contract(
        app,
        header_max_lengths={
            idempotency.HEADER: idempotency.max_key_length(settings.idempotency_key_max_length)
        },
    )

    async def render_unexpected(exc: BaseException) -> Response:
        return render_unexpected_error(
            exc,
            retry_after_seconds=settings.db_unavailable_retry_after_seconds,
            on_unavailable=metrics.database_unavailable.inc,
        )

    app.add_middleware(
        BodySizeLimitMiddleware,
        max_bytes=settings.max_body_bytes,
        streamed=[StreamedLimit(portability_router.COMPANY_IMPORT, settings.import_max_bytes)],
    )
    app.add_middleware(
        BodyTimeoutMiddleware,
        seconds=settings.request_body_timeout_seconds,
        streamed=[portability_router.COMPANY_IMPORT],
    )
    app.add_middleware(
        HeaderLimitMiddleware,
        max_count=settings.max_request_headers,
        max_bytes=settings.max_request_header_bytes,
    )
    app.add_middleware(
        RequestContextMiddleware,
        metrics=metrics,
        render_error=render_unexpected,
        exemplars=tracing.enabled,
    )

    # The two calls of every chat turn are routes of the app itself, tried first: through
    # include_router they would be matched twice per request (the router's table, then the
    # route's), behind every route included before them.
    app.router.routes.extend(turns_router.router.routes)
    app.include_router(health.router)
    app.include_router(identity_router.router)
    app.include_router(erasure_router.router)
    app.include_router(enablement_router.router)
    app.include_router(rate_limits_router.router)
    app.include_router(profiles_router.settings_router)
    app.include_router(folders_router.router)
    app.include_router(profiles_router.router)
    app.include_router(jobs_router.router)
    app.include_router(explicit_router.router)
    app.include_router(conversations_router.router)
    app.include_router(portability_router.router)
    app.include_router(usage_router.router)
    app.include_router(control_plane_router.router)
    discovery = ResourceDiscovery(settings, MCP_PATH)
    app.state.mcp = McpEndpoint(discovery)
    app.router.routes.append(mcp_route(app.state.mcp))
    app.router.routes.extend(discovery.routes())
    install_docs_pages(app)
    app.include_router(ui_router.router)
    guard_dependency_overrides(app)
    return app
