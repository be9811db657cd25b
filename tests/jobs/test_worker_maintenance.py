"""The worker's housekeeping: expired idempotency keys are pruned while it runs."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from fastapi import FastAPI

from app.jobs.worker import Worker, WorkerConfig
from app.kit.db.engine import Database
from app.kit.observability import Metrics
from app.turns.repository import prune_idempotency_keys
from tests.helpers.db import admin_execute, rows
from tests.helpers.worker import wait_for


async def never_called(*_: object) -> str:
    raise AssertionError("no job is queued in this test")


async def test_expired_idempotency_keys_are_pruned_while_live_ones_stay(
    app: FastAPI, database_url: str, tmp_path: Path
) -> None:
    await admin_execute(
        database_url,
        """INSERT INTO idempotency_keys
           (company_id, user_id, key, request_hash, response_status, response_body, expires_at)
           VALUES ('acme', 'alice', 'old', 'h', 202, '\\x7b7d', now() - interval '1 hour'),
                  ('acme', 'alice', 'live', 'h', 202, '\\x7b7d', now() + interval '1 hour')""",
    )
    database: Database = app.state.database
    config = WorkerConfig(
        concurrency=1,
        poll_seconds=0.05,
        lease_seconds=30,
        batch_size=1,
        heartbeat_file=tmp_path / "heartbeat",
    )
    worker = Worker(
        database.engine,
        {"consolidation": never_called},
        config,
        Metrics(),
        maintenance=(prune_idempotency_keys,),
    )
    running = asyncio.create_task(worker.run())
    try:

        async def pruned() -> bool:
            keys = await rows(app, "SELECT key FROM idempotency_keys ORDER BY key")
            return [row.key for row in keys] == ["live"]

        await wait_for(pruned, seconds=10)
        assert (tmp_path / "heartbeat").exists()
    finally:
        worker.stop()
        await running


async def test_a_running_worker_exports_its_heartbeat_and_the_database_queue(
    app: FastAPI, database_url: str
) -> None:
    """The gauges `ContextMemoryWorkersSilent` and the queue panels read: the heartbeat moves
    while the worker runs, and the queue depth is the database's."""
    await admin_execute(
        database_url,
        """INSERT INTO jobs
             (id, company_id, user_id, kind, status, payload, max_attempts, run_after)
           VALUES (gen_random_uuid(), 'acme', 'alice', 'consolidation', 'dead', '{}', 5, now())""",
    )
    database: Database = app.state.database
    metrics = Metrics()
    config = WorkerConfig(concurrency=1, poll_seconds=0.05, lease_seconds=30, batch_size=1)
    worker = Worker(database.engine, {"consolidation": never_called}, config, metrics)
    started = time.time()
    running = asyncio.create_task(worker.run())
    try:

        async def reported() -> bool:
            return metrics.registry.get_sample_value("queue_depth", {"status": "dead"}) == 1

        await wait_for(reported, seconds=10)
        beat = metrics.registry.get_sample_value("worker_last_heartbeat_timestamp_seconds")
        assert beat is not None
        assert started <= beat <= time.time()
        assert metrics.registry.get_sample_value("queue_depth", {"status": "queued"}) == 0
    finally:
        worker.stop()
        await running
