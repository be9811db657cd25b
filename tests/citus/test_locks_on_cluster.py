"""Advisory locks on the cluster: every holder of one key takes it on the same node (the
coordinator), so holders exclude each other there as on one PostgreSQL. A statement routed to
one shard would take its lock on that shard's worker, where a holder on the coordinator never
sees it: these tests fail then (the second holder gets through)."""

from __future__ import annotations

import asyncio

import asyncpg
import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import make_url

from app.conversations.repository import lock_user_history
from app.jobs.queue import LOCK_NAMESPACE
from tests.helpers.apps import COMPANY, USER, AuthFactory
from tests.helpers.db import admin_fetchval, sessions
from tests.helpers.polling import wait_until
from tests.helpers.settings import enable_company
from tests.helpers.turns import new_chat, queue_turn, turn_body, user
from tests.helpers.worker import make_handler, make_worker

pytestmark = pytest.mark.slow

WAIT_SECONDS = 15.0
_WAITING = (
    "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
    " WHERE l.locktype = 'advisory' AND NOT l.granted AND a.datname = current_database()"
)


async def test_turn_saves_wait_for_an_erasure_lock_of_their_user(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, admin_url: str
) -> None:
    """The erasure's lock of the user's history (a statement of its own, on the coordinator)
    held: the turn-saves of that user (the lock taken inside their statement) wait for it,
    alone and in a batch, and are written once it is released."""
    await enable_company(client, auth)
    chats = [new_chat() for _ in range(3)]
    async with sessions(app)() as session, session.begin():
        await lock_user_history(session, COMPANY, USER)

        async def save(chat: str) -> httpx.Response:
            body = turn_body([user(f"I said it in {chat}.")], "Noted.")
            return await client.post(f"/v1/chats/{chat}/turns", json=body, headers=auth())

        saving = [asyncio.create_task(save(chat)) for chat in chats]

        async def waiting() -> bool:
            done = [task for task in saving if task.done()]
            assert not done, f"a turn-save got past the erasure's lock: {done[0].result().text}"
            return int(await admin_fetchval(admin_url, _WAITING)) >= 1

        await wait_until(waiting, WAIT_SECONDS, what="turn-saves waiting on the coordinator")
        stored = "SELECT count(*) FROM turns WHERE company_id = $1"
        assert await admin_fetchval(admin_url, stored, COMPANY) == 0
        assert not any(task.done() for task in saving)
    answers = await asyncio.gather(*saving)
    assert {answer.status_code for answer in answers} == {202}, [a.text for a in answers]
    assert await admin_fetchval(admin_url, stored, COMPANY) == 3


async def test_a_claim_passes_over_a_user_whose_lock_is_held(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, admin_url: str
) -> None:
    """The claim's lock of (company, user), held by another session on the coordinator: a
    worker claims none of that user's jobs, and claims it once the lock is released."""
    await enable_company(client, auth)
    await queue_turn(client, auth, "I know Python")
    handler, metrics, _ = make_handler(app)
    worker = make_worker(app, handler, metrics)
    dsn = make_url(admin_url).set(drivername="postgresql").render_as_string(hide_password=False)
    holder = await asyncpg.connect(dsn)
    try:
        async with holder.transaction():
            held = await holder.fetchval(
                "SELECT pg_try_advisory_xact_lock(hashtext($1 || $2), hashtext($3))",
                LOCK_NAMESPACE,
                COMPANY,
                USER,
            )
            assert held
            assert await worker.run_once() is None, "claimed a job whose user's lock was held"
        claimed = await worker.run_once()
        assert claimed is not None
        assert (claimed.company_id, claimed.user_id) == (COMPANY, USER)
    finally:
        await holder.close()
