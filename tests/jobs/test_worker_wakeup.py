"""Idle workers are woken when a turn-save queues a job (NOTIFY), not left to their next poll;
the listening session comes back after the server ends it; behind a transaction pooler only a
direct URL is listened on."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import httpx
from fastapi import FastAPI

from app.jobs.wakeup import CHANNEL, JobSignal, JobWakeups
from app.jobs.worker import Worker, WorkerConfig
from app.kit.db.engine import Database, create_database
from app.kit.observability import Metrics
from tests.helpers.apps import AuthFactory, make_settings
from tests.helpers.db import admin_execute
from tests.helpers.polling import wait_until
from tests.helpers.settings import enable_company
from tests.helpers.turns import queue_turn

LONG_POLL_SECONDS = 60.0
"""Longer than any wait below: a job claimed in time was claimed because of a wake-up."""


async def recording_worker(
    database: Database, wakeups: JobWakeups | None, claimed: asyncio.Queue[float]
) -> Worker:
    async def handler(*_: object) -> str:
        await claimed.put(time.monotonic())
        return "noop"

    config = WorkerConfig(
        concurrency=2,
        poll_seconds=LONG_POLL_SECONDS,
        lease_seconds=30,
        batch_size=10,
        shutdown_grace_seconds=1,
    )
    return Worker(database.engine, {"consolidation": handler}, config, Metrics(), wakeups=wakeups)


async def test_a_queued_turn_wakes_an_idle_worker_long_before_its_poll(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(client, auth)
    database: Database = app.state.database
    assert database.listen_kwargs is not None
    wakeups = JobWakeups(database.listen_kwargs)
    claimed: asyncio.Queue[float] = asyncio.Queue()
    worker = await recording_worker(database, wakeups, claimed)
    wakeups.start()
    running = asyncio.create_task(worker.run())
    try:
        await wait_until(lambda: wakeups.listening, 10, what="the worker listening")
        for n in range(3):
            saved = time.monotonic()
            # another user each time: the handler leaves its claim running, holding its user
            await queue_turn(client, auth, "I work as a data engineer", user=f"user-{n}")
            at = await asyncio.wait_for(claimed.get(), 10)
            assert at - saved < 5, "claimed at the poll, not woken"
        assert wakeups.notifications >= 3
        assert app.state.job_signal.sent >= 3
    finally:
        worker.stop()
        await running
        await wakeups.close()


async def test_the_listening_session_comes_back_after_the_server_ends_it(
    app: FastAPI, database_url: str
) -> None:
    database: Database = app.state.database
    assert database.listen_kwargs is not None
    wakeups = JobWakeups(database.listen_kwargs, reconnect_seconds=0.1)
    wakeups.start()
    try:
        await wait_until(lambda: wakeups.listening, 10, what="listening")
        await admin_execute(
            database_url,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'context-memory-listen'",
        )
        await wait_until(lambda: not wakeups.listening, 10, what="the session seen ended")
        armed = wakeups.armed()
        await wait_until(lambda: wakeups.listening, 10, what="listening again")
        assert armed.is_set(), "back, it wakes the slots for what it may have missed"
        armed = wakeups.armed()
        conn = await asyncpg.connect(**database.listen_kwargs)
        try:
            await conn.execute(f"NOTIFY {CHANNEL}")
        finally:
            await conn.close()
        await asyncio.wait_for(armed.wait(), 10)
    finally:
        await wakeups.close()
    assert not wakeups.listening


async def test_pokes_in_a_burst_cost_one_notification_per_interval(app: FastAPI) -> None:
    database: Database = app.state.database
    signal = JobSignal(database.driver.connect_kwargs, 0.5)
    try:
        for _ in range(200):
            signal.poke()
        await wait_until(lambda: signal.sent >= 1, 5, what="the first notification")
        for _ in range(200):
            signal.poke()
        await wait_until(lambda: signal.sent >= 2, 5, what="the second notification")
        # it falls quiet once an interval passed with no poke pending: none was left to send
        await wait_until(lambda: not signal.sending, 5, what="the signal falling quiet")
        assert signal.sent == 2
    finally:
        await signal.close()
    off = JobSignal(database.driver.connect_kwargs, 0)
    off.poke()
    assert not off.sending  # nothing is on its way, nor will be
    assert off.sent == 0


async def test_a_notification_that_cannot_be_sent_fails_no_request(app: FastAPI) -> None:
    database: Database = app.state.database
    unreachable = {**database.driver.connect_kwargs, "host": "127.0.0.1", "port": 9}
    signal = JobSignal(unreachable, 0.01)
    signal.poke()
    await wait_until(lambda: not signal.sending, 10, what="the attempt over")
    assert signal.sent == 0
    await signal.close()


def test_behind_a_transaction_pooler_the_worker_listens_only_on_the_listen_url(
    database_url: str,
) -> None:
    pooled = make_settings(database_url, db_pgbouncer_transaction_mode=True)
    direct = make_settings(
        database_url,
        db_pgbouncer_transaction_mode=True,
        database_listen_url="postgresql://listener@db.internal:5433/memory",
    )
    assert create_database(str(pooled.async_database_url), pooled).listen_kwargs is None
    kwargs = create_database(str(direct.async_database_url), direct).listen_kwargs
    assert kwargs is not None
    assert (kwargs["host"], kwargs["port"], kwargs["user"]) == ("db.internal", 5433, "listener")
    assert kwargs["database"] == "memory"
