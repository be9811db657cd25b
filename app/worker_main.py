"""The consolidation worker as a process of its own (`python -m app worker`): its database pool,
token counters, metrics and tracing, and the worker with its maintenance steps, without the API
(no app, routes, token verification or web framework loaded: a smaller process, up sooner).
`serve` builds its in-process worker (`WORKER_ENABLED`) with `consolidation_worker` too.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from app import models
from app.control_plane.offboarding import Offboarder
from app.conversations.retention import chat_retention_steps
from app.kit.citus import company_tables
from app.kit.config import Settings, warn_unknown_settings
from app.kit.db.engine import Database, create_database
from app.kit.observability import Metrics
from app.kit.startup import database_url, freeze_startup_objects
from app.kit.tokens import TokenCounters
from app.kit.tracing import Tracing
from app.profiles.retention import memory_retention_steps
from app.profiles.versions import VersionPolicy
from app.quotas.maintenance import quota_check_step
from app.turns.repository import prune_idempotency_keys

if TYPE_CHECKING:
    from app.consolidation.runner import BackgroundWorker


def offboarder() -> Offboarder:
    """Every company table, children first: what an offboarding erases, in that order."""
    return Offboarder(tuple(table.name for table in reversed(company_tables(models.metadata))))


def version_policy(settings: Settings, tokens: TokenCounters, metrics: Metrics) -> VersionPolicy:
    return VersionPolicy(
        tokens.stored,
        settings.memory_max_versions,
        on_policy_actions=metrics.observe_memory_policy_actions,
        users_with_memory_quota=settings.quota_company_users_with_memory,
    )


def consolidation_worker(  # noqa: PLR0913 - the process's parts, then by keyword
    database: Database,
    settings: Settings,
    metrics: Metrics,
    tokens: TokenCounters,
    tracing: Tracing,
    *,
    policy: VersionPolicy,
    offboarder: Offboarder,
) -> BackgroundWorker:
    """The worker with its maintenance steps, on `database` (its own pool). The consolidation
    pipeline is imported here: an API process whose worker is off never loads it, nor the
    model client's SDK."""
    from app.consolidation.runner import BackgroundWorker  # noqa: PLC0415

    return BackgroundWorker(
        database,
        settings,
        metrics,
        tokens,
        tracer=tracing.tracer,
        instrument_http_client=tracing.instrument_http_client,
        maintenance=(
            prune_idempotency_keys,
            *chat_retention_steps(settings.chat_retention_days),
            *memory_retention_steps(policy, metrics),
            quota_check_step(
                user_history_messages=settings.quota_user_history_messages,
                company_storage_bytes=settings.quota_company_storage_bytes,
                interval_seconds=settings.quota_check_interval_seconds,
            ),
            offboarder.resume_step,
        ),
    )


@asynccontextmanager
async def running_worker(
    settings: Settings, tracing: Tracing | None = None
) -> AsyncIterator[Metrics]:
    """The worker running until the block ends (then it stops gracefully: the jobs in hand
    finish within the grace period, the rest go back to the queue); yields its metrics."""
    warn_unknown_settings(os.environ)  # a mistyped DB_* or WORKER_* variable is in the log
    tracing = tracing or Tracing.from_environment()
    url, embedded = await database_url(settings)
    database = create_database(url, settings, pool_size=settings.worker_pool_size)
    metrics = Metrics()
    tokens = TokenCounters(settings.llm_encodings_dir)
    tracing.start()
    worker = consolidation_worker(
        database,
        settings,
        metrics,
        tokens,
        tracing,
        policy=version_policy(settings, tokens, metrics),
        offboarder=offboarder(),
    )
    try:
        worker.start()
        freeze_startup_objects()
        yield metrics
    finally:
        await worker.stop()
        await database.dispose()
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)
        await asyncio.to_thread(tracing.stop)
