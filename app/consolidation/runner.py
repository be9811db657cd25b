"""The worker as the service runs it: the consolidation pipeline registered for this domain's
job kinds, the language-model client, and the housekeeping steps the caller hands in, wired
into a `Worker` that lives as a task of the running event loop (started by the lifespan of
`serve` when `WORKER_ENABLED`, and of `python -m app worker`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from app.config import Settings
from app.consolidation.kinds import COALESCING, KINDS
from app.consolidation.pipeline import ConsolidationPipeline
from app.db import Database
from app.jobs.worker import Maintenance, Worker, WorkerConfig
from app.llm import create_chat_model
from app.observability import Metrics
from app.tokens import TokenCounters

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

    def __init__(
        self,
        database: Database,
        settings: Settings,
        metrics: Metrics,
        tokens: TokenCounters,
        *,
        maintenance: Sequence[Maintenance] = (),
    ) -> None:
        self._chat_model = create_chat_model(settings)
        self._pipeline = ConsolidationPipeline(
            database, settings, self._chat_model, metrics, tokens
        )
        self.worker = Worker(
            database.engine,
            dict.fromkeys(KINDS, self._pipeline.run),
            worker_config(settings),
            metrics,
            maintenance=maintenance,
        )
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self.worker.run(), name="consolidation-worker")
        engine = "the offline rules" if self._chat_model is None else "the language model"
        logger.info("consolidation worker started (%s)", engine)

    async def stop(self) -> None:
        self.worker.stop()
        try:
            if self._task is not None:
                await self._task
            await self._pipeline.recorder.flush()
        finally:
            if self._chat_model is not None:
                await self._chat_model.aclose()
            logger.info("consolidation worker stopped")
