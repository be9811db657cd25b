"""The worker as the service runs it: the consolidation pipeline registered for this domain's
job kinds, the language-model client, and the housekeeping steps the caller hands in, wired
into a `Worker` that lives as a task of the running event loop (started by the lifespan of
`serve` when `WORKER_ENABLED`, and of `python -m app worker`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from opentelemetry.trace import Tracer

from app.consolidation.kinds import COALESCING, KINDS
from app.consolidation.pipeline import ConsolidationPipeline
from app.jobs.wakeup import JobWakeups
from app.jobs.worker import Maintenance, Worker, WorkerConfig
from app.kit.config import Settings
from app.kit.db.engine import Database
from app.kit.llm import create_chat_model
from app.kit.observability import Metrics
from app.kit.tokens import TokenCounters
from app.kit.tracing import NO_TRACER

logger = logging.getLogger("app.consolidation")


def worker_config(settings: Settings) -> WorkerConfig:
    return WorkerConfig(
        concurrency=settings.worker_concurrency,
        poll_seconds=settings.worker_poll_seconds,
        lease_seconds=settings.job_lease_seconds,
        batch_size=settings.job_batch_size,
        heartbeat_file=settings.worker_heartbeat_file,
        coalesce=COALESCING,
    )


class BackgroundWorker:
    """The worker as a task of the running event loop, with its language-model client.

    Started by the lifespan of `serve` (when `WORKER_ENABLED`) and of `python -m app worker`,
    which hand in the other domains' `maintenance` steps. `stop()` stops claiming, lets running
    jobs finish within the worker's grace period (the rest are released to the queue), writes
    any usage the database refused earlier, then closes the model client.
    """

    def __init__(  # noqa: PLR0913 - the last three are optional, by keyword
        self,
        database: Database,
        settings: Settings,
        metrics: Metrics,
        tokens: TokenCounters,
        *,
        maintenance: Sequence[Maintenance] = (),
        tracer: Tracer = NO_TRACER,
        instrument_http_client: Callable[[object], None] | None = None,
    ) -> None:
        """`tracer`: the runs' spans and their steps'; `instrument_http_client` traces the
        model client's HTTP requests (when tracing is on)."""
        self._chat_model = create_chat_model(settings, instrument_http_client)
        self._pipeline = ConsolidationPipeline(
            database, settings, self._chat_model, metrics, tokens, tracer=tracer
        )
        self._wakeups = (
            JobWakeups(database.listen_kwargs) if database.listen_kwargs is not None else None
        )
        self.worker = Worker(
            database.engine,
            dict.fromkeys(KINDS, self._pipeline.run),
            worker_config(settings),
            metrics,
            maintenance=maintenance,
            tracer=tracer,
            wakeups=self._wakeups,
        )
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._wakeups is not None:
            self._wakeups.start()
        self._task = asyncio.create_task(self.worker.run(), name="consolidation-worker")
        engine = "the offline rules" if self._chat_model is None else "the language model"
        woken = "woken by NOTIFY" if self._wakeups is not None else "polling only"
        logger.info("consolidation worker started (%s, %s)", engine, woken)

    async def stop(self) -> None:
        self.worker.stop()
        try:
            if self._task is not None:
                await self._task
            await self._pipeline.recorder.flush()
        finally:
            if self._wakeups is not None:
                await self._wakeups.close()
            if self._chat_model is not None:
                await self._chat_model.aclose()
            logger.info("consolidation worker stopped")
