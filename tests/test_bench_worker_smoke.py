"""The worker benchmark's harness at toy scale, so bench/worker_bench.py cannot silently rot: turns
saved through the app are drained by a real `python -m app worker` process, the benchmark's
fixed-latency model server answers the real pipeline with valid gate and operations replies, and
the in-process statement count sees the claims."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI

from app.kit.llm import OpenAIChatModel
from bench.fixed_latency_llm import FixedLatencyLLM
from bench.worker_drain import TurnQueue, WorkerProcess, WorkerSetup, connect, run_drain
from bench.worker_statements import OWNER_QUERY, TRANSACTION, count_statements
from tests.helpers.db import rows
from tests.helpers.worker import make_handler, make_worker


async def test_a_worker_process_drains_turns_saved_through_the_app_one_claim_per_user(
    database_url: str, tmp_path: Path
) -> None:
    db = await connect(database_url)
    try:
        async with (
            TurnQueue(database_url, "smoke-co") as queue,
            WorkerProcess(WorkerSetup("rules", concurrency=2), database_url, tmp_path) as worker,
        ):
            result = await run_drain(
                queue, worker, db, tag="smoke", users=3, turns_per_user=2, timeout_seconds=60
            )
    finally:
        await db.close()

    assert not result.timed_out
    assert (result.turns, result.jobs, result.succeeded, result.dead, result.pending) == (
        6,
        6,
        6,
        0,
        0,
    )
    # both turns of a user were queued before the worker ran: coalesced into one consolidation
    assert result.claims == 3
    # each user stated one fact the offline engine records: one version each
    assert (result.updated_claims, result.versions) == (3, 3)
    assert result.memory_after is not None
    assert result.peak_rss_kb >= result.memory_after.rss_kb > 0


async def test_the_fixed_latency_model_answers_the_pipeline_with_gate_and_operations(
    app: FastAPI, database_url: str
) -> None:
    async with (
        FixedLatencyLLM(latency_seconds=0.0) as stub,
        TurnQueue(database_url, "smoke-stub") as queue,
        OpenAIChatModel(api_key=None, base_url=stub.base_url, timeout_seconds=5.0) as model,
    ):
        await queue.queue("stub", users=2, turns_per_user=2)
        handler, metrics, _ = make_handler(app, model)
        worker = make_worker(app, handler, metrics)
        while await worker.run_once() is not None:
            pass

    # one claim per user (a fact and chit-chat): the offline engine reads the fact, so the gate
    # is skipped and the operations call ADDs it
    assert stub.stats.calls == {"operations_update": 2}
    jobs = await rows(app, "SELECT status, outcome FROM jobs WHERE company_id = 'smoke-stub'")
    assert [(job.status, job.outcome) for job in jobs] == [("succeeded", "updated")] * 4
    (count,) = await rows(
        app, "SELECT count(*) AS n FROM memory_versions WHERE company_id = 'smoke-stub'"
    )
    assert count.n == 2


async def test_the_statement_count_sees_one_owner_query_per_claim_on_a_single_slot(
    database_url: str,
) -> None:
    db = await connect(database_url)
    try:
        async with TurnQueue(database_url, "smoke-count") as queue:
            count = await count_statements(
                database_url, queue, db, tag="count", users=3, concurrency=1
            )
    finally:
        await db.close()

    assert count.claims == 3
    # the owner look takes the owner's lock in the same statement; then the queue is empty
    assert count.statements[OWNER_QUERY] >= 3
    assert count.statements[TRANSACTION] >= 3  # the driver's BEGINs are seen too
    assert count.per_claim() > count.per_claim(OWNER_QUERY)
